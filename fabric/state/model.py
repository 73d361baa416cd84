"""What the backends find on a fabric: devices, hosts and who is bound to what.

These records are internal and richer than :class:`manager_api.models.Device`: they keep the Redfish URIs a
backend needs to bind and unbind. The inventory renders them into the API model. The device vocabulary
(types, health, binding styles, the table of attributes) is :mod:`manager_api.devices`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from manager_api.devices import BindingStyle, DeviceAttributes
from manager_api.partitions import PartitionTable

__all__ = [
    "DeviceRecord",
    "DiscoveredAttributes",
    "FabricInfo",
    "FabricSnapshot",
    "HostRecord",
    "MemoryDomainRecord",
]


class DiscoveredAttributes(DeviceAttributes):
    """The table of device attributes, and what only discovery needs besides."""

    #: False when Redfish reports the device Absent, Disabled or offline
    available: bool = True
    #: URIs of the resources that make up the device (to recognise it from another binding style)
    identities: frozenset[str] = frozenset()
    #: the target of the ``Reset`` action of the device's own resource (``#Processor.Reset``,
    #: ``#Drive.Reset``) when the service offers one: how the manager cleans a warm device
    #: between tenants (docs/manager.md "Hygiene between tenants")
    reset_target: str | None = None
    #: a GPU that splits into partitions: its table (``Oem.FabricDRA.PartitionTable`` of its PCIeDevice)
    partition_table: PartitionTable | None = None


@dataclass(frozen=True, slots=True)
class MemoryDomainRecord:
    """A MemoryDomain that makes chunks on demand (``AllowsMemoryChunkCreation``): a memory pool."""

    uri: str  # the MemoryDomain's @odata.id
    chunks: str  # its MemoryChunks collection, where chunks are POSTed
    size_bytes: int  # MemorySizeMiB
    min_chunk_bytes: int  # MinMemoryChunkSizeMiB
    increment_bytes: int  # MemoryChunkIncrementMiB
    max_chunks: int | None = None
    #: carved by chunks fabric-dra did not make (offered as whole devices, never shared)
    outside_bytes: int = 0
    #: the chunks fabric-dra made (its marker on them), as the last pass found them
    made: tuple[str, ...] = ()

    def chunk_bytes(self, memory_bytes: int) -> int:
        """The chunk a share of ``memory_bytes`` takes: at least the domain's minimum, then whole
        increments up (MemoryDomain_v1 ``MinMemoryChunkSizeMiB``, ``MemoryChunkIncrementMiB``), as the
        scheduler rounds a request by the device's ``requestPolicy``.

        >>> MemoryDomainRecord("d", "d/c", 8 << 30, 1 << 30, 1 << 30).chunk_bytes(1)
        1073741824
        >>> MemoryDomainRecord("d", "d/c", 8 << 30, 64 << 20, 64 << 20).chunk_bytes((1 << 30) + 1)
        1140850688
        """
        if memory_bytes <= self.min_chunk_bytes:
            return self.min_chunk_bytes
        steps = -(-(memory_bytes - self.min_chunk_bytes) // self.increment_bytes)
        return self.min_chunk_bytes + steps * self.increment_bytes

    def chunk_mib(self, memory_bytes: int) -> int:
        """:meth:`chunk_bytes` in MiB (the unit of ``MemoryChunkSizeMiB``), rounded up."""
        return -(-self.chunk_bytes(memory_bytes) // (1 << 20))


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One allocatable device as a backend sees it."""

    key: str  # the Redfish URI that identifies it (target endpoint, resource block or memory chunk)
    resource_id: str  # the Redfish Id its name is derived from
    fabric: str  # Redfish Fabric Id ("Composition" for resource blocks outside any fabric)
    style: BindingStyle
    attributes: DiscoveredAttributes
    #: ComputerSystem Ids the fabric binds it to now (normally zero or one)
    bound_hosts: tuple[str, ...] = ()
    #: ComputerSystem Ids it could be bound to
    reachable_hosts: tuple[str, ...] = ()
    endpoint: str | None = None  # target endpoint URI (zone, connection)
    chunk: str | None = None  # memory chunk URI (connection)
    block: str | None = None  # resource block URI (composition)
    memory_domain: MemoryDomainRecord | None = None  # a memory pool (connection), shared by size
    name: str = ""  # assigned by the inventory (unique DNS label)

    def with_binding(self, hosts: tuple[str, ...]) -> DeviceRecord:
        return replace(self, bound_hosts=hosts)


@dataclass(frozen=True, slots=True)
class HostRecord:
    """A Redfish ComputerSystem that a fabric can bind devices to."""

    id: str
    uri: str
    uuid: str | None = None
    name: str | None = None
    host_name: str | None = None
    #: Fabric Id → initiator endpoint URIs of this host in that fabric
    initiators: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FabricInfo:
    id: str
    uri: str | None
    styles: tuple[BindingStyle, ...]
    hosts: tuple[str, ...]  # ComputerSystem Ids reachable through it


@dataclass(slots=True)
class FabricSnapshot:
    """Everything one discovery pass found."""

    devices: list[DeviceRecord] = field(default_factory=list)
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    fabrics: dict[str, FabricInfo] = field(default_factory=dict)
    #: ``time.monotonic()`` when the pass started: later local changes win over it
    started_at: float = field(default_factory=time.monotonic)
    gets: int = 0
    #: of those, answered 304 Not Modified (ETag revalidation: what the last pass read still holds)
    not_modified: int = 0
    #: what an operator must be told about the shape of the service: found, yet not poolable
    #: (``/readyz`` detail, ``fabric-dra status``, a warning in the log)
    notices: list[str] = field(default_factory=list)
