"""The topology file: which hosts, switches and pooled devices an emulated fabric has.

The file is YAML (or JSON), camelCase keys, format ``version: 1``. It is validated in two
steps: the shape by pydantic (types, ranges, unknown keys), then the cross references
(unknown models, duplicate ids, memory that does not split into chunks) by
:func:`check_references`. Both report the field as a dotted path, e.g.
``pcie.switches[0].devices[2].model``, so a bad file gets one clear line per problem.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ByteSize, ConfigDict, Field
from pydantic.alias_generators import to_camel

from manager_api.devices import DeviceType
from manager_api.partitions import PartitionTableRef
from plumbing.names import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DNS1123_SUBDOMAIN_PATTERN,
)

__all__ = [
    "PCIE_DEVICE_TYPES",
    "Behaviour",
    "CxlDevice",
    "CxlFabric",
    "CxlSwitch",
    "DeviceModel",
    "Host",
    "InterswitchLink",
    "MemoryPool",
    "PcieDevice",
    "PcieFabric",
    "PcieSwitch",
    "QemuOptions",
    "ServiceInfo",
    "SwitchBase",
    "Topology",
]

#: Device types that hang off a PCIe switch; ``cxl-memory`` lives on the CXL fabric.
PCIE_DEVICE_TYPES = frozenset({DeviceType.GPU, DeviceType.NVME, DeviceType.NIC, DeviceType.FPGA})

_PORT_ID = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"


def _pci_number(bits: int) -> BeforeValidator:
    """Accept 4318, "4318", "0x10de" or "10de"-style hex strings for a PCI register of ``bits`` bits."""

    limit = (1 << bits) - 1

    def parse(value: object) -> object:
        if isinstance(value, str):
            text = value.strip().lower()
            try:
                number = (
                    int(text, 16)
                    if text.startswith("0x")
                    else int(text, 16 if re.search("[a-f]", text) else 10)
                )
            except ValueError as err:
                raise ValueError(f"{value!r} is not a number (write it like 0x10de)") from err
            value = number
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a {bits}-bit number like 0x10de, got {value!r}")
        if not 0 <= value <= limit:
            raise ValueError(f"{value:#x} does not fit in {bits} bits")
        return value

    return BeforeValidator(parse)


def _quoted_text(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError("write it in quotes: YAML reads digits as a number and drops leading zeros")
    return value


PciId = Annotated[int, _pci_number(16)]
PciClass = Annotated[int, _pci_number(24)]
PciRevision = Annotated[int, _pci_number(8)]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ServiceInfo(_Model):
    """What the Redfish service root says about itself."""

    uuid: UUID = Field(description="ServiceRoot UUID; stable across restarts")
    name: str = "fabric-dra emulated composable fabric"
    vendor: str = "fabric-dra"
    product: str = "fabric-dra Redfish fabric emulator"


class QemuOptions(_Model):
    """How the emulator reaches the q35 guest behind a ``kind: qemu`` host (docs/emulator.md)."""

    monitor: str | None = Field(
        default=None,
        description="QMP socket of a guest that is already running (attach to it); default: the "
        "emulator starts its own guest under <state-dir>/qemu/<host>",
    )
    memory_mib: int = Field(default=1024, ge=256, le=65536)
    cpus: int = Field(default=2, ge=1, le=16)
    release_seconds: float = Field(
        default=10.0, gt=0, le=600, description="how long an unbind waits for the guest to release a device"
    )


class Host(_Model):
    """A server with a PCIe/CXL host port into the fabric; a Kubernetes node of the same name."""

    # Kubernetes node names are DNS subdomains (kind uses plain labels, clouds use dotted names).
    name: str = Field(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=DNS1123_SUBDOMAIN_MAX_LENGTH)
    uuid: UUID = Field(description="ComputerSystem UUID, as the node's /sys/class/dmi/id/product_uuid")
    numa_node: int = Field(default=0, ge=-1, le=63, description="NUMA node of the host's fabric root port")
    kind: Literal["file", "qemu"] = Field(
        default="file",
        description="file: a sysfs-like tree under <state-dir>/hosts/<name>; qemu: a QEMU guest whose "
        "kernel sees bound PCIe devices hot-plugged",
    )
    qemu: QemuOptions | None = Field(default=None, description="options of a kind: qemu host")


class DeviceModel(_Model):
    """A kind of device (e.g. one GPU SKU); devices refer to it by its key in ``models``."""

    type: DeviceType
    manufacturer: str = Field(min_length=1)
    model: str = Field(min_length=1)
    vendor_id: PciId
    device_id: PciId
    subsystem_vendor_id: PciId | None = Field(default=None, description="defaults to vendorId")
    subsystem_id: PciId = 0
    class_code: PciClass
    revision_id: PciRevision = 0
    memory: ByteSize | None = Field(
        default=None, description="GPU/FPGA memory, drive capacity or CXL memory capacity, e.g. 80GiB"
    )
    pcie_generation: int = Field(default=4, ge=1, le=6)
    pcie_width: Literal[1, 2, 4, 8, 16, 32] = 16
    firmware_version: str | None = None
    partitions: PartitionTableRef | None = Field(
        default=None,
        description="a gpu model's partition table: a built-in table's name (h100-80gb, a100-40gb, "
        "manager_api.partitions) or the table itself; shown on each such GPU's PCIeDevice as "
        "Oem.FabricDRA.PartitionTable",
    )


class _DeviceBase(_Model):
    id: str = Field(pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH)
    model: str = Field(description="key into the topology's models")
    serial: Annotated[str, BeforeValidator(_quoted_text)] = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        description="SerialNumber; 16 hex digits also become the PCIe Device Serial Number capability",
    )
    port: str | None = Field(default=None, pattern=_PORT_ID, description="downstream port Id; default DP<n>")


class PcieDevice(_DeviceBase):
    uuid: UUID | None = None


class MemoryPool(_Model):
    """A memory domain whose chunks clients create and delete (MemoryDomain v1_5_0:
    ``AllowsMemoryChunkCreation``, ``MinMemoryChunkSizeMiB``, ``MemoryChunkIncrementMiB``)."""

    min_chunk_mib: int = Field(
        alias="minChunkMiB", ge=1, le=1 << 30, description="MinMemoryChunkSizeMiB: the smallest chunk"
    )
    increment_mib: int = Field(
        alias="incrementMiB",
        ge=1,
        le=1 << 30,
        description="MemoryChunkIncrementMiB: a chunk is the minimum plus a whole number of increments",
    )
    max_chunks: int = Field(
        default=64, ge=1, le=1024, description="chunks the domain holds at most; past it a create is refused"
    )


class CxlDevice(_DeviceBase):
    # chunk Ids are "<id>-chunk<n>" and must stay DNS labels of at most 63 characters
    id: str = Field(pattern=DNS1123_LABEL_PATTERN, max_length=55)
    chunks: int | None = Field(
        default=None, ge=1, le=64, description="equal memory chunks the capacity is split into (default 1)"
    )
    pool: MemoryPool | None = Field(
        default=None,
        description="the device's memory is a pool clients carve chunks from (POST to its domain's "
        "MemoryChunks) instead of pre-made chunks",
    )


class SwitchBase(_Model):
    id: str = Field(pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH)
    manufacturer: str = "fabric-dra"
    model: str = "Emulated fabric switch"
    hosts: list[str] | None = Field(
        default=None,
        description="hosts cabled to this switch (partial cabling); default: all. A bind of one of its "
        "devices to another host fails with 400 ActionParameterValueError (PropertyValueError on a POST)",
    )

    def device_list(self) -> Sequence[_DeviceBase]:
        raise NotImplementedError


class PcieSwitch(SwitchBase):
    model: str = "Emulated PCIe Gen5 fabric switch"
    devices: list[PcieDevice] = Field(default_factory=list)

    def device_list(self) -> Sequence[_DeviceBase]:
        return self.devices


class CxlSwitch(SwitchBase):
    model: str = "Emulated CXL 2.0 fabric switch"
    devices: list[CxlDevice] = Field(default_factory=list)

    def device_list(self) -> Sequence[_DeviceBase]:
        return self.devices


class InterswitchLink(_Model):
    """A cable between two switches of one fabric (a cascade: a spine and its leaves). Each end is
    an ``InterswitchPort`` (Port v1_0_0 ``PortType``) named ``ISL<n>`` on its switch, in the order
    of the fabric's ``links``; a host reaches a device through any chain of links."""

    switches: list[str] = Field(
        min_length=2, max_length=2, description="the Ids of the two switches the cable joins"
    )


class PcieFabric(_Model):
    switches: list[PcieSwitch] = Field(default_factory=list)
    links: list[InterswitchLink] = Field(default_factory=list)


class CxlFabric(_Model):
    switches: list[CxlSwitch] = Field(default_factory=list)
    links: list[InterswitchLink] = Field(default_factory=list)


class Behaviour(_Model):
    """How the service behaves where real Redfish services differ from each other (and from the
    emulator's default): each option makes it act like a kind of service met in the wild, so the
    manager's tests catch what such a service does to it (docs/emulator.md "Behaviours")."""

    endpoint_links: Literal["current", "stale", "omitted"] = Field(
        default="current",
        description=(
            "an Endpoint's Links.Zones / Links.Connections: kept current; stale (never updated after "
            "start: a target lists none, an initiator only its own zone); omitted (not sent at all)"
        ),
    )
    initiators: Literal["collection", "links-only"] = Field(
        default="collection",
        description=(
            "host initiator endpoints: listed in the fabric's Endpoints collection, or only linked "
            "from zones and connections"
        ),
    )
    session_login: Literal["created", "no-content"] = Field(
        default="created",
        description="a session login answers 201 with the session, or 204 with only the headers",
    )
    expand: Literal["served", "unsupported"] = Field(
        default="served",
        description=(
            "the $expand query (DSP0266 §7.3): served and advertised in the service root's "
            "ProtocolFeaturesSupported.ExpandQuery; or unsupported (not advertised, answered with 501)"
        ),
    )
    etags: Literal["served", "omitted"] = Field(
        default="served",
        description=(
            'ETags (DSP0266 "ETags"): served (a weak ETag header on every read and @odata.etag in '
            "every body, If-None-Match answered 304, If-Match and action ETag parameters checked); or "
            "omitted (a service without them: no ETag anywhere, every read answered 200 in full, "
            "If-Match and ETag parameters ignored, as such a service has nothing to compare them with)"
        ),
    )
    port_links: Literal["linked", "omitted"] = Field(
        default="linked",
        description=(
            "an Endpoint's Links.ConnectedPorts: linked to the switch ports it is cabled to; or omitted "
            "(a service that does not model its switches' ports: a client cannot tell a partially "
            "cabled switch, and a bind across it fails only on the fabric's 400)"
        ),
    )
    block_status: Literal["current", "stale"] = Field(
        default="current",
        description=(
            "a ResourceBlock's CompositionStatus and Links.ComputerSystems: kept current; stale (never "
            "updated: every block says Unused, composed into no system; the systems' "
            "Links.ResourceBlocks stay right)"
        ),
    )
    composition: Literal["actions", "patch"] = Field(
        default="actions",
        description=(
            "how a client composes a resource block into a system: the #ComputerSystem.AddResourceBlock "
            "and RemoveResourceBlock actions; or patch (no actions: a PATCH of the system's "
            "Links.ResourceBlocks, ReadWrite in the ComputerSystem CSDL, with If-Match required)"
        ),
    )
    storage_blocks: Literal["drives", "storage"] = Field(
        default="drives",
        description=(
            "what an NVMe resource block lists: its Drive (Drives); or only a Storage resource "
            "(Storage) whose Drives link to it, as storage enclosures do"
        ),
    )
    shared_blocks: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "resource blocks (device Ids) the service says are composed into every listed host at "
            "once (two or more): ComposedAndAvailable, in each system's Links.ResourceBlocks; their "
            "composition into any other system is refused"
        ),
    )
    memory_chunks: Literal["creatable", "fixed"] = Field(
        default="creatable",
        description=(
            "creatable: a CXL device with a pool offers a memory domain with AllowsMemoryChunkCreation "
            "whose chunks clients create and delete; fixed: a service without chunk creation "
            "(MemoryDomain before v1_5): such a device shows one pre-made chunk of its whole memory "
            "and its domain takes no POST"
        ),
    )
    resource_blocks: Literal["composition-service", "root-only"] = Field(
        default="composition-service",
        description=(
            "where resource blocks are listed: the CompositionService; or root-only (the service "
            "root's ResourceBlocks collection only, with no CompositionService, Systems or Fabrics: "
            "an expansion enclosure whose hosts another service manages)"
        ),
    )


class Topology(_Model):
    version: Literal[1]
    service: ServiceInfo
    behaviour: Behaviour = Field(default_factory=Behaviour)
    hosts: list[Host] = Field(min_length=1)
    models: dict[str, DeviceModel] = Field(default_factory=dict)
    pcie: PcieFabric = Field(default_factory=PcieFabric)
    cxl: CxlFabric = Field(default_factory=CxlFabric)

    def switch_sections(self) -> list[tuple[str, Sequence[SwitchBase]]]:
        """(file section, switches) for each fabric, PCIe first."""
        return [("pcie", self.pcie.switches), ("cxl", self.cxl.switches)]

    def link_sections(self) -> list[tuple[str, Sequence[InterswitchLink]]]:
        """(file section, inter-switch links) for each fabric, PCIe first."""
        return [("pcie", self.pcie.links), ("cxl", self.cxl.links)]
