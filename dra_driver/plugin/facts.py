"""What this node knows of a device of a claim, declared once.

:class:`DeviceFacts` names each fact, its type and — in its ``Annotated`` metadata — the variable
the claim's CDI spec gives it to the container (``FABRIC_DRA_<DEVICE>_<NAME>``, :class:`CdiEnv`).
Everything that holds these facts derives from it instead of copying them field by field: the
fabric manager's answer is read into it by name (:meth:`DeviceFacts.of`; the manager's
:class:`manager_api.models.Device` declares the same fields), the CDI layer's
:class:`~dra_driver.plugin.cdi.SpecDevice` and the checkpoint's
:class:`~dra_driver.plugin.checkpoint.PreparedDevice` inherit them, a lost checkpoint is rebuilt
from the spec's variables (:meth:`DeviceFacts.from_cdi_env`), and the host scanner's
:class:`~dra_driver.plugin.hostdev.DeviceIdentity` is made from them (:meth:`DeviceFacts.identity`).
The checkpoint stores them under these names, so its file format is these fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict

from dra_driver.plugin.hostdev import DeviceIdentity
from manager_api.models import Device

__all__ = ["CLAIM_FACTS", "CdiEnv", "DeviceFacts"]

#: facts of the claim's own allocation, never of the manager's description of the device: a
#: share's ID, and the GPU a partition device is carved from
CLAIM_FACTS = ("share_id", "parent")
_ASKED = ("device", "type", *CLAIM_FACTS)


@dataclass(frozen=True, slots=True)
class CdiEnv:
    """The fact is given to the container as ``<prefix><name>`` (:func:`dra_driver.plugin.cdi.env_prefix`)."""

    name: str


class DeviceFacts(BaseModel):
    """A device of a claim: which one, and what the fabric says it is."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    #: the DRA device name (the manager's ``Device.name``)
    device: Annotated[str, CdiEnv("DEVICE")]
    pool: Annotated[str, CdiEnv("POOL")]
    #: a :class:`manager_api.devices.DeviceType` value
    type: Annotated[str, CdiEnv("TYPE")]
    model: Annotated[str | None, CdiEnv("MODEL")] = None
    serial: Annotated[str | None, CdiEnv("SERIAL")] = None
    vendor_id: Annotated[str | None, CdiEnv("VENDOR_ID")] = None
    device_id: Annotated[str | None, CdiEnv("DEVICE_ID")] = None
    #: a CXL memory chunk's size (a share's: its consumed capacity), by which the host tells its
    #: region apart (not in the CDI spec)
    memory_bytes: int | None = None
    #: a share of a memory pool: the allocation's shareID (one claim may hold several of one pool)
    share_id: Annotated[str | None, CdiEnv("SHARE_ID")] = None
    #: a GPU partition: the fabric's GPU it is carved from (the device is the partition's name)
    parent: Annotated[str | None, CdiEnv("PARENT")] = None

    @classmethod
    def fact_names(cls) -> tuple[str, ...]:
        return tuple(DeviceFacts.model_fields)

    @classmethod
    def of(cls, device: Device) -> dict[str, Any]:
        """The facts of the manager's answer about ``device``, by name (the claim's own facts —
        which device it asked for, its share — are the caller's)."""
        values = {name: getattr(device, name) for name in cls.fact_names() if name not in _ASKED}
        return {**values, "device": device.name, "type": device.type.value}

    @property
    def key(self) -> str:
        """What tells this device apart among its claim's: its name, and a share's ID with it."""
        return self.device if self.share_id is None else f"{self.device}-{self.share_id}"

    def facts(self) -> dict[str, Any]:
        """These facts alone, to make another record of the same device."""
        return {name: getattr(self, name) for name in self.fact_names()}

    def identity(self) -> DeviceIdentity:
        """What the host scanner looks for in sysfs."""
        return DeviceIdentity(
            name=self.device,
            type=self.type,
            vendor_id=self.vendor_id,
            device_id=self.device_id,
            serial=self.serial,
            memory_bytes=self.memory_bytes,
        )

    def cdi_env(self, prefix: str) -> tuple[dict[str, str], dict[str, str | None]]:
        """The spec's variables of these facts: those always set, and those set when known."""
        always: dict[str, str] = {}
        known: dict[str, str | None] = {}
        for name, field in DeviceFacts.model_fields.items():
            for env in (m for m in field.metadata if isinstance(m, CdiEnv)):
                value = getattr(self, name)
                if field.is_required():
                    always[f"{prefix}{env.name}"] = str(value)
                else:
                    known[f"{prefix}{env.name}"] = None if value is None else str(value)
        return always, known

    @classmethod
    def from_cdi_env(cls, env: Mapping[str, str], prefix: str, *, type_of_kind: str) -> dict[str, Any]:
        """The facts a spec's variables give (``type_of_kind`` when the spec has no ``TYPE``)."""
        values: dict[str, Any] = {}
        for name, field in DeviceFacts.model_fields.items():
            for env_name in (m.name for m in field.metadata if isinstance(m, CdiEnv)):
                values[name] = env.get(f"{prefix}{env_name}", "" if field.is_required() else None)
        if f"{prefix}TYPE" not in env:
            values["type"] = type_of_kind
        return values
