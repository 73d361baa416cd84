"""The device vocabulary: what a device is, how it is bound, and the one table of its attributes.

:class:`DeviceAttributes` is that table. Each field is declared once — its API name, type, default and
description, and (in its ``Annotated`` metadata) how the ResourceSlice publisher shows it to the
scheduler — and everything else is derived from it: discovery fills it in
(:class:`fabric.state.model.DiscoveredAttributes` adds what only discovery needs), the manager's
API model :class:`manager_api.models.Device` inherits its fields, the inventory copies it into that
model without naming a field, and :mod:`dra_driver.controller.devices` publishes every field that
carries a :class:`SliceAttribute` or :class:`SliceCapacity`. Adding an attribute is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "MEMORY_CAPACITY",
    "BindingStyle",
    "DeviceAttributes",
    "DeviceIdentity",
    "DeviceType",
    "Health",
    "SliceAttribute",
    "SliceCapacity",
    "SliceForm",
    "spoken_list",
]


class DeviceType(StrEnum):
    GPU = "gpu"
    NVME = "nvme"
    NIC = "nic"
    FPGA = "fpga"
    CXL_MEMORY = "cxl-memory"
    #: a drive that is not NVMe (SAS, SATA), or a storage device known only by SimpleStorage
    STORAGE = "storage"
    OTHER = "other"


class Health(StrEnum):
    """Redfish ``Status.Health`` (Resource schema)."""

    OK = "OK"
    WARNING = "Warning"
    CRITICAL = "Critical"


class BindingStyle(StrEnum):
    """How a fabric binds a device to a host (the three standard Redfish ways)."""

    ZONE = "zone"  # Fabric Zones of Endpoints (PCIe, CXL): initiator and target share a zone
    COMPOSITION = "composition"  # CompositionService ResourceBlocks added to a ComputerSystem
    CONNECTION = "connection"  # Fabric Connections with MemoryChunkInfo (CXL memory)


def spoken_list(values: tuple[str, ...] | list[str]) -> str:
    """``("zone", "composition", "connection")`` → ``"zone, composition or connection"``."""
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


class SliceForm(StrEnum):
    """How a value is written into a ResourceSlice ``DeviceAttribute``."""

    #: ``{"string": value}``, made to fit the API's limits
    STRING = "string"
    #: ``{"int": value}``
    INT = "int"
    #: ``{"string": "0x10de"}``: a PCI ID as the kernel prints it, whatever form Redfish used
    PCI_ID = "pci-id"
    #: ``{"string": "<pool>/<value>"}``: an Id that is unique only within its fabric (a Redfish
    #: Switch Id), qualified with the pool so ``matchAttribute`` never joins two fabrics' devices
    PER_POOL = "per-pool"


@dataclass(frozen=True, slots=True)
class SliceAttribute:
    """A field the ResourceSlice publisher shows as the device attribute ``<driver>/<name>``."""

    name: str
    form: SliceForm = SliceForm.STRING
    #: place in the device's ``attributes``: the order docs/architecture.md lists them in
    rank: int = 0


@dataclass(frozen=True, slots=True)
class SliceCapacity:
    """A field (a number of bytes) the publisher shows as the device capacity ``<driver>/<name>``."""

    name: str


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class DeviceIdentity(_Model):
    """Which device, in which DRA pool and Redfish fabric (the fields the API's device starts with)."""

    name: str = Field(description="DRA device name: a DNS label derived from fabric identities, stable")
    pool: str = Field(description="DRA pool name: one pool per fabric")
    fabric: Annotated[str, SliceAttribute("fabric", rank=7)] = Field(
        description="Redfish Fabric Id, e.g. PCIe or CXL"
    )


class PCIeErrorCounts(_Model):
    """The PCIe error counters of the switch port to the device, as the fabric reports them
    (Redfish ``PortMetrics.PCIeErrors``; counts since the port's counters were last cleared)."""

    model_config = ConfigDict(frozen=True)

    correctable: int = Field(default=0, ge=0, description="CorrectableErrorCount")
    non_fatal: int = Field(default=0, ge=0, description="NonFatalErrorCount")
    fatal: int = Field(default=0, ge=0, description="FatalErrorCount")
    l0_to_recovery: int = Field(default=0, ge=0, description="L0ToRecoveryCount")
    replays: int = Field(default=0, ge=0, description="ReplayCount")
    replay_rollovers: int = Field(default=0, ge=0, description="ReplayRolloverCount")
    nak_sent: int = Field(default=0, ge=0, description="NAKSentCount")
    nak_received: int = Field(default=0, ge=0, description="NAKReceivedCount")


class DeviceAttributes(_Model):
    """What a device is, as discovery reads it from Redfish: the table of device attributes.

    The field order is the order of the manager's JSON (and of its OpenAPI document); the
    ``rank`` of each :class:`SliceAttribute` is the order of the published slice's attributes.
    """

    model_config = ConfigDict(frozen=True)

    type: Annotated[DeviceType, SliceAttribute("type", rank=0)]
    vendor: Annotated[str | None, SliceAttribute("vendor", rank=1)] = None
    vendor_id: Annotated[str | None, SliceAttribute("vendorID", SliceForm.PCI_ID, rank=2)] = Field(
        default=None, description="PCI vendor ID, e.g. 0x10de"
    )
    device_id: Annotated[str | None, SliceAttribute("deviceID", SliceForm.PCI_ID, rank=3)] = Field(
        default=None, description="PCI device ID, e.g. 0x2330"
    )
    model: Annotated[str | None, SliceAttribute("model", rank=4)] = None
    serial: Annotated[str | None, SliceAttribute("serial", rank=5)] = None
    uuid: Annotated[str | None, SliceAttribute("uuid", rank=6)] = None
    memory_bytes: Annotated[int | None, SliceCapacity("memory")] = Field(
        default=None, description="device memory (GPU, FPGA, CXL device) or memory chunk size"
    )
    capacity_bytes: Annotated[int | None, SliceCapacity("storage")] = Field(
        default=None, description="storage capacity of a drive (NVMe, SAS, SATA)"
    )
    pcie_generation: Annotated[int | None, SliceAttribute("pcieGen", SliceForm.INT, rank=10)] = None
    pcie_width: Annotated[int | None, SliceAttribute("pcieWidth", SliceForm.INT, rank=11)] = None
    switch: Annotated[str | None, SliceAttribute("switch", SliceForm.PER_POOL, rank=8)] = Field(
        default=None, description="Redfish Switch Id the device hangs off"
    )
    port: Annotated[str | None, SliceAttribute("port", rank=9)] = Field(
        default=None, description="Redfish Port Id on that switch"
    )
    health: Annotated[Health, SliceAttribute("health", rank=12)] = Health.OK
    pcie_errors: PCIeErrorCounts | None = Field(
        default=None,
        description="PCIe error counters of the switch port to the device, where the fabric offers them",
    )


def _capacity_of(field: str) -> str:
    """The slice capacity name a field of :class:`DeviceAttributes` is published under."""
    return next(m.name for m in DeviceAttributes.model_fields[field].metadata if isinstance(m, SliceCapacity))


#: the capacity of a device's memory (``memory_bytes``): a partition's and a memory pool's too. In a
#: slice, a claim's ``capacity.requests`` and an allocation's ``consumedCapacity`` it is qualified
#: by the driver: ``<driver>/memory``.
MEMORY_CAPACITY: str = _capacity_of("memory_bytes")
