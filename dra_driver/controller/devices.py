"""One inventory device (:class:`manager_api.models.Device`) → one ``resource.k8s.io/v1`` ``Device``.

Attributes and capacity are those pinned in docs/architecture.md, qualified with the driver
name (``fabric-dra.io/type``). Values that break the API's rules are made to fit
(:func:`~dra_driver.controller.resourcenames.fit_value`), never sent as they are: one bad value
would make the API server reject the whole slice, and with it every device of the slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver.controller.resourcenames import (
    BindingConditionNames,
    fit_value,
    is_dns_label,
    unhealthy_taint_key,
)
from dra_driver.selection.quantity import format_bytes
from manager_api.models import BindingState, Device, Health

__all__ = [
    "ATTRIBUTE_NAMES",
    "CAPACITY_MEMORY",
    "Conversion",
    "PublishPolicy",
    "WithheldReason",
    "to_dra_device",
]

#: Attribute identifiers, in the order docs/architecture.md lists them.
ATTRIBUTE_NAMES: tuple[str, ...] = (
    "type",
    "vendor",
    "vendorID",
    "deviceID",
    "model",
    "serial",
    "uuid",
    "fabric",
    "switch",
    "port",
    "pcieGen",
    "pcieWidth",
    "health",
)
CAPACITY_MEMORY = "memory"


class WithheldReason(StrEnum):
    """Why a device of the inventory is not published."""

    #: bound outside fabric-dra: the scheduler would hand out a device nobody can attach
    UNMANAGED = "unmanaged"
    #: the fabric reports it absent or disabled
    UNAVAILABLE = "unavailable"
    #: unhealthy, and the cluster cannot taint devices
    UNHEALTHY = "unhealthy"
    #: its name is not a DNS label, so no ResourceSlice can carry it
    INVALID_NAME = "invalid-name"


@dataclass(frozen=True, slots=True)
class PublishPolicy:
    driver: str
    #: True: unhealthy devices are published with a NoSchedule taint; False: withheld.
    device_taints: bool
    #: True: devices carry bindsToNode and the binding / binding-failure conditions.
    binding_conditions: bool
    #: which controller owns the slices: one per fabric manager when several publish one driver
    publisher: str = "default"


@dataclass(frozen=True, slots=True)
class Conversion:
    """A published device (``device``) or the reason it is withheld."""

    name: str
    device: dict[str, Any] | None
    withheld: WithheldReason | None = None

    @property
    def tainted(self) -> bool:
        return bool(self.device and self.device.get("taints"))


def _hex_id(value: str | None) -> str | None:
    """PCI IDs as the kernel prints them: ``0x10de``."""
    if not value:
        return None
    text = value.strip().lower()
    if not text.startswith("0x"):
        text = "0x" + text
    return text


def _attributes(device: Device, driver: str) -> dict[str, dict[str, Any]]:
    # A Redfish Switch Id is unique only within its fabric; qualifying it with the pool keeps
    # `matchAttribute: fabric-dra.io/switch` from joining devices of two fabrics.
    switch = f"{device.pool}/{device.switch}" if device.switch else None
    strings: dict[str, str | None] = {
        "type": device.type.value,
        "vendor": device.vendor,
        "vendorID": _hex_id(device.vendor_id),
        "deviceID": _hex_id(device.device_id),
        "model": device.model,
        "serial": device.serial,
        "uuid": device.uuid,
        "fabric": device.fabric,
        "switch": switch,
        "port": device.port,
        "health": device.health.value,
    }
    ints: dict[str, int | None] = {"pcieGen": device.pcie_generation, "pcieWidth": device.pcie_width}
    attributes: dict[str, dict[str, Any]] = {}
    for name in ATTRIBUTE_NAMES:
        if name in ints:
            number = ints[name]
            if number is not None:
                attributes[f"{driver}/{name}"] = {"int": number}
            continue
        text = strings[name]
        if text:
            attributes[f"{driver}/{name}"] = {"string": fit_value(text)}
    return attributes


def to_dra_device(device: Device, policy: PublishPolicy) -> Conversion:
    """The ``Device`` entry of a ResourceSlice for ``device``, or why it is withheld."""
    if not is_dns_label(device.name):
        return Conversion(device.name, None, WithheldReason.INVALID_NAME)
    if not device.managed:
        return Conversion(device.name, None, WithheldReason.UNMANAGED)
    if device.state is BindingState.UNAVAILABLE:
        return Conversion(device.name, None, WithheldReason.UNAVAILABLE)
    unhealthy = device.health is not Health.OK
    if unhealthy and not policy.device_taints:
        return Conversion(device.name, None, WithheldReason.UNHEALTHY)

    out: dict[str, Any] = {"name": device.name, "attributes": _attributes(device, policy.driver)}
    if device.memory_bytes:
        out["capacity"] = {f"{policy.driver}/{CAPACITY_MEMORY}": {"value": format_bytes(device.memory_bytes)}}
    if unhealthy:
        # Value = the Redfish Health, so a claim may tolerate "Warning" but not "Critical".
        out["taints"] = [
            {"key": unhealthy_taint_key(policy.driver), "value": device.health.value, "effect": "NoSchedule"}
        ]
    if policy.binding_conditions:
        names = BindingConditionNames(policy.driver)
        out["bindsToNode"] = True
        out["bindingConditions"] = [names.attached]
        out["bindingFailureConditions"] = [names.failed]
    return Conversion(device.name, out)
