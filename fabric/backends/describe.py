"""Device attributes from the Redfish resources behind an endpoint or a resource block.

A device is spread over several resources: the Processor (GPU, FPGA) or Drive or network function
the endpoint names, the PCIeFunction with the PCI IDs, the PCIeDevice with the link and the serial
number, a CXL logical device, a memory chunk. This module follows the standard links between them
(Processor/Drive ``Links.PCIeFunctions``, PCIeFunction ``Links.PCIeDevice``, MemoryChunks
``Links.CXLLogicalDevices`` → CXLLogicalDevice ``Links.PCIeFunctions``, Storage ``Drives``) and
takes each attribute from the most specific resource that has it. A storage resource block may name
its drives, its Storage subsystem (whose ``Drives`` are the drives) or a SimpleStorage (whose
``Devices`` describe them inline, e.g. a SAS tray); the drives' capacity is the device's
``capacityBytes``, never its memory.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from fabric.backends.views import (
    JSON,
    Controller,
    CXLLogicalDevice,
    DeviceResource,
    Drive,
    Endpoint,
    MemoryChunks,
    NetworkAdapter,
    PCIeDevice,
    PCIeErrors,
    PCIeFunction,
    PCIeInterface,
    Port,
    PortMetrics,
    Processor,
    Resource,
    SimpleStorage,
    SimpleStorageDevice,
    Storage,
    kind_view,
    odata_id,
)
from fabric.backends.walk import Walk, path_ids
from fabric.state.model import DiscoveredAttributes
from manager_api.devices import DeviceType, Health, PCIeErrorCounts
from manager_api.partitions import PartitionTable
from plumbing.logs import get_logger

log = get_logger(__name__)

__all__ = [
    "DEVICE_ENTITY_TYPES",
    "PORT_SELECT",
    "RESET_TYPE",
    "describe",
    "locate_port",
    "prefetch_parts",
    "status_of",
]

#: The ``ResetType`` of the reset between tenants (Resource.ResetType): the device is idle (no claim
#: holds it) and must keep nothing of its last tenant, so nothing is shut down gracefully.
RESET_TYPE = "ForceRestart"

D = TypeVar("D", bound=DeviceResource)

#: Endpoint ``ConnectedEntities[].EntityType`` values that are devices (not switches, bridges, managers)
DEVICE_ENTITY_TYPES = frozenset(
    {
        "Processor",
        "Drive",
        "NetworkController",
        "DisplayController",
        "AccelerationFunction",
        "MemoryChunk",
        "CXLDevice",
        "MediaController",
        "StorageExpander",
        "Memory",
        "PCIeFunction",
        "PCIeDevice",
    }
)

_PROCESSOR_TYPES = {"GPU": DeviceType.GPU, "FPGA": DeviceType.FPGA}
_UNAVAILABLE_STATES = frozenset({"Absent", "Disabled", "UnavailableOffline", "StandbyOffline"})
_HEALTH_ORDER = {Health.OK: 0, Health.WARNING: 1, Health.CRITICAL: 2}


def status_of(resource: Resource | Endpoint | SimpleStorageDevice | None) -> tuple[Health | None, str | None]:
    """(Status.Health, Status.State) of a resource, either possibly None."""
    if resource is None:
        return None, None
    status = resource.status
    health = Health(status.health) if status.health in ("OK", "Warning", "Critical") else None
    return health, status.state or None


def _pci_id(value: str | None) -> str | None:
    if value is None or not re.fullmatch(r"0[xX][0-9a-fA-F]{4}", value.strip()):
        return None
    return value.strip().lower()


def _mib(value: float | None) -> int | None:
    return int(value) * 1024 * 1024 if value is not None and value > 0 else None


def _generation(pcie_type: str | None) -> int | None:
    match = re.fullmatch(r"Gen(\d+)", pcie_type or "")
    return int(match.group(1)) if match else None


def _type_from_class(function: PCIeFunction | None) -> DeviceType | None:
    if function is None:
        return None
    code = (function.class_code or "").lower()
    if re.fullmatch(r"0x[0-9a-f]{6}", code):
        if code.startswith("0x03"):
            return DeviceType.GPU
        if code.startswith("0x0108"):
            return DeviceType.NVME
        if code.startswith("0x02"):
            return DeviceType.NIC
    return {
        "DisplayController": DeviceType.GPU,
        "NetworkController": DeviceType.NIC,
    }.get(str(function.device_class))


def _interned(value: str | None) -> str | None:
    """One string object for the values many devices share (vendor, model, PCI IDs, switch and
    port names): each answer's JSON made its own, and the described attributes outlive it."""
    return sys.intern(value) if value is not None else None


def _first(*values: str | None) -> str | None:
    return next((v for v in values if v), None)


def _shared(values: Sequence[str | None]) -> str | None:
    """The value every one of ``values`` has (a tray of drives of one model), else None."""
    found = set(values)
    return found.pop() if len(found) == 1 else None


def _total(sizes: Sequence[int | None]) -> int | None:
    total = sum(size for size in sizes if size is not None and size > 0)
    return total or None


def _endpoint_ports(endpoint: Endpoint | None) -> list[str]:
    """Switch ports first (``ConnectedPorts``), then the endpoint's own (``Ports``, ``LocalPorts``)."""
    if endpoint is None:
        return []
    found: list[str] = []
    for uris in (endpoint.links.connected_ports, endpoint.links.ports, endpoint.links.local_ports):
        found.extend(u for u in uris if u not in found)
    return found


async def locate_port(walk: Walk, port_uris: Sequence[str]) -> tuple[str | None, str | None]:
    """(Switch Id, Port Id) the device hangs off, from the endpoint's ports.

    The endpoint may name the switch's downstream port directly, or the device-side port (a
    FabricAdapter port, as in DMTF's public-cxl mockup) whose ``ConnectedSwitchPorts`` names it.
    """
    switch, port, _ = await _switch_port(walk, port_uris)
    return switch, port


async def _switch_port(walk: Walk, port_uris: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    """(Switch Id, Port Id, the switch port's URI) the device hangs off (see :func:`locate_port`)."""
    for uri in port_uris:
        switch = path_ids(uri, "Switches")
        if switch:
            return switch, path_ids(uri, "Ports"), uri
    for uri in port_uris:
        port = await walk.read(uri, Port)
        if port is None:
            continue
        switch_ports = port.links.connected_switch_ports
        if switch_ports:
            return path_ids(switch_ports[0], "Switches"), path_ids(switch_ports[0], "Ports"), switch_ports[0]
        switches = port.links.connected_switches
        if switches:
            return path_ids(switches[0], "Switches"), None, None
    return None, None, None


#: what :func:`_pcie_errors` reads of a switch's ports where the service serves ``$select``: each
#: port's ``Id`` and its metrics' ``Id`` and ``PCIeErrors`` (with their ``@odata`` annotations, the
#: ``Metrics`` link among them). The switch's walk reads its ports for nothing else (a port that is
#: not a switch's is read on its own, :func:`_switch_port`). An emulated switch sends 116 ports
#: (every upstream port to a host) for its 16 devices' counters: their links, state and
#: everything else in the metrics were most of what the start decoded
PORT_SELECT = "Id,Metrics/Id,Metrics/PCIeErrors"


async def _pcie_errors(walk: Walk, port_uri: str | None) -> PCIeErrorCounts | None:
    """The error counters of the switch port to the device (its ``Metrics``, PortMetrics
    ``PCIeErrors``); None where the service offers none. A counter it leaves out counts 0."""
    if port_uri:
        # the switch's ports with their Metrics inline: one request a switch, not two a device
        await walk.prefetch_siblings(port_uri, levels=2, select=PORT_SELECT)
    port = await walk.read(port_uri, Port) if port_uri else None
    metrics = await walk.read(port.metrics, PortMetrics) if port is not None and port.metrics else None
    errors = metrics.pcie_errors if metrics is not None else None
    if errors is None:
        return None
    return _error_counts(tuple(max(0, getattr(errors, name) or 0) for name in _ERROR_COUNTERS))


#: the counters of :class:`PCIeErrors`, by the names :class:`PCIeErrorCounts` shares with it
_ERROR_COUNTERS = tuple(PCIeErrors.model_fields)


@functools.lru_cache(maxsize=1024)
def _error_counts(counts: tuple[int, ...]) -> PCIeErrorCounts:
    """The counters as one shared (frozen) record per set of values: most ports count the same
    (none), and a record per device was 10,100 alike at fleet scale."""
    return PCIeErrorCounts(**dict(zip(_ERROR_COUNTERS, counts, strict=True)))


def _as(resource: DeviceResource | None, view: type[D]) -> D | None:
    """``resource`` when it was read as ``view`` (its ``@odata.type`` says it is one)."""
    return resource if isinstance(resource, view) else None


@dataclass(slots=True)
class _Parts:
    """The resources one device is made of, as read (each None where the device has none)."""

    endpoint: Endpoint | None
    container: Resource | None
    processor: Processor | None = None
    drives: list[Drive] = field(default_factory=list)
    storage: Storage | None = None
    simple: SimpleStorage | None = None
    network: DeviceResource | None = None
    logical: CXLLogicalDevice | None = None
    chunk: MemoryChunks | None = None
    function: PCIeFunction | None = None
    pcie_device: PCIeDevice | None = None

    @property
    def drive(self) -> Drive | None:
        return self.drives[0] if self.drives else None

    @property
    def trays(self) -> list[SimpleStorageDevice]:
        """The drives a SimpleStorage describes inline (a SAS tray)."""
        return list(self.simple.devices or ()) if self.simple is not None else []

    @property
    def controller(self) -> Controller | None:
        return self.network.controller if isinstance(self.network, NetworkAdapter) else None

    @property
    def primary(self) -> DeviceResource | None:
        """The resource that says most about the device: its vendor, model, serial number."""
        return self.processor or self.drive or self.network or self.pcie_device or self.logical


async def prefetch_parts(walk: Walk, devices: Iterable[Sequence[tuple[str, str]]]) -> None:
    """Read in collections (:meth:`Walk.prefetch`) what :func:`describe` of each of ``devices``
    (their entities) would read one resource at a time: the entities, then the PCIe functions
    they link, then the PCIe devices those link. Only a speed-up: :func:`describe` reads whatever
    this did not bring, so a service without ``$expand`` gives the same devices, more slowly."""
    uris = [uri for entities in devices for _, uri in entities]
    for _ in range(3):
        if not uris:
            return
        await walk.prefetch(uris)
        uris = [link for uri in uris for link in _pcie_links(walk.cached(uri))]


def _pcie_links(body: JSON | None) -> list[str]:
    """The PCIe function and device links of a resource read so far (Processor, Drive,
    NetworkAdapter, CXLLogicalDevice: ``Links.PCIeFunctions``; PCIeFunction: ``Links.PCIeDevice``)."""
    links = body.get("Links") if body is not None else None
    if not isinstance(links, dict):
        return []
    found: list[Any] = []
    for name in ("PCIeFunctions", "PCIeFunction", "PCIeDevice"):
        value = links.get(name)
        found.extend(value if isinstance(value, list) else [value])
    return [uri for uri in (odata_id(v) for v in found) if uri]


async def describe(
    walk: Walk,
    entities: Sequence[tuple[str, str]],
    *,
    endpoint: Endpoint | None = None,
    container: Resource | None = None,
    chunk: MemoryChunks | None = None,
) -> DiscoveredAttributes:
    """Attributes of the device made of ``entities`` ((EntityType, URI) pairs).

    ``endpoint`` is its target endpoint (zone and connection styles), ``container`` its resource
    block (composition), ``chunk`` the memory chunk that is the unit of binding (connection style).
    """
    parts = await _read_parts(walk, entities, _Parts(endpoint, container, chunk=chunk))
    kind = _kind(parts)
    primary, pcie_device, trays = parts.primary, parts.pcie_device, parts.trays
    interface = (
        (pcie_device.pcie_interface if pcie_device else None)
        or (parts.controller.pcie_interface if parts.controller else None)
        or PCIeInterface()
    )
    uuid = _first(primary.uuid if primary else None, pcie_device.uuid if pcie_device else None)
    health, available = _health(parts)
    switch, port, port_uri = await _location(walk, parts)
    pcie_errors = await _pcie_errors(walk, port_uri)
    function, processor = parts.function, parts.processor
    return DiscoveredAttributes(
        type=kind,
        vendor=_interned(
            _first(
                primary.manufacturer if primary else None,
                pcie_device.manufacturer if pcie_device else None,
                _shared([t.manufacturer for t in trays]),
            )
        ),
        vendor_id=_interned(
            _pci_id(function.vendor_id if function else None)
            or _pci_id(processor.processor_id.vendor_id if processor else None)
        ),
        device_id=_interned(_pci_id(function.device_id if function else None)),
        model=_interned(
            _first(
                primary.model if primary else None,
                pcie_device.model if pcie_device else None,
                _shared([t.model for t in trays]),
            )
        ),
        serial=_serial(parts),
        uuid=uuid.lower() if uuid else None,
        memory_bytes=_memory(parts, kind),
        capacity_bytes=_total(
            [d.capacity_bytes for d in parts.drives] if parts.drives else [t.capacity_bytes for t in trays]
        ),
        pcie_generation=_generation(_first(interface.pcie_type, interface.max_pcie_type)),
        pcie_width=interface.max_lanes if interface.lanes_in_use is None else interface.lanes_in_use,
        switch=_interned(switch),
        port=_interned(port),
        health=health,
        pcie_errors=pcie_errors,
        available=available,
        identities=_identities(parts, entities),
        reset_target=_reset_target(parts),
        partition_table=_partition_table(pcie_device, kind),
    )


def _partition_table(pcie_device: PCIeDevice | None, kind: DeviceType) -> PartitionTable | None:
    """A GPU's partition table (``Oem.FabricDRA.PartitionTable``); one that does not read as a
    table is left out, said once in the log: the GPU is then offered whole only."""
    raw = pcie_device.partition_table if pcie_device is not None else None
    if raw is None or kind is not DeviceType.GPU:
        return None
    try:
        return PartitionTable.model_validate(raw)
    except ValidationError as err:
        log.warning(
            "a GPU's partition table cannot be read; it is offered whole",
            resource=pcie_device.uri if pcie_device else None,
            error=str(err).splitlines()[0],
        )
        return None


async def _read_parts(walk: Walk, entities: Sequence[tuple[str, str]], parts: _Parts) -> _Parts:
    """The resources of ``entities``, and those their standard links name, read into ``parts``."""
    by_kind: dict[str, DeviceResource] = {}
    uris = list(dict.fromkeys(uri for _, uri in entities))
    for uri, body in zip(uris, await walk.get_all(uris), strict=True):
        if body is not None:
            # through the walk, which keeps the view (a resource unchanged since the last pass
            # is not read into a view again)
            resource = await walk.read(uri, kind_view(body))
            if resource is not None:
                by_kind.setdefault(resource.kind, resource)
    parts.processor = _as(by_kind.get("Processor"), Processor)
    drive = _as(by_kind.get("Drive"), Drive)
    parts.storage = _as(by_kind.get("Storage"), Storage)
    parts.simple = _as(by_kind.get("SimpleStorage"), SimpleStorage)
    parts.drives = [drive] if drive is not None else []
    if not parts.drives and parts.storage is not None:
        parts.drives = await walk.read_all(parts.storage.drives, Drive)
    parts.network = await _network(walk, by_kind)
    logical = _as(by_kind.get("CXLLogicalDevice"), CXLLogicalDevice)
    if parts.chunk is None:
        parts.chunk = _as(by_kind.get("MemoryChunks"), MemoryChunks)
    if logical is None and parts.chunk is not None:
        logical = await walk.read(parts.chunk.links.cxl_logical_devices, CXLLogicalDevice)
    parts.logical = logical
    await _read_pcie(walk, by_kind, parts)
    return parts


async def _network(walk: Walk, by_kind: dict[str, DeviceResource]) -> DeviceResource | None:
    """The network part of a device; a system's NetworkInterface (composition) stands for a
    NetworkAdapter, which is read in its place."""
    network: DeviceResource | None = next(
        (
            by_kind[kind]
            for kind in ("NetworkAdapter", "NetworkDeviceFunction", "NetworkInterface", "EthernetInterface")
            if kind in by_kind
        ),
        None,
    )
    if network is not None and not isinstance(network, NetworkAdapter):
        adapter = await walk.read(network.links.network_adapter, NetworkAdapter)
        if adapter is not None:
            network = by_kind["NetworkAdapter"] = adapter
    return network


async def _read_pcie(walk: Walk, by_kind: dict[str, DeviceResource], parts: _Parts) -> None:
    """The PCIe function (with the PCI IDs) and the PCIe device (link, serial) of ``parts``, from
    the entities or the links of the parts that name them; the endpoint's own PCI IDs at last."""
    function = _as(by_kind.get("PCIeFunction"), PCIeFunction)
    if function is None:
        for holder in (parts.processor, parts.drive, parts.network, parts.logical):
            uri = (holder.links.pcie_functions or holder.links.pcie_function) if holder else None
            if uri:
                function = await walk.read(uri, PCIeFunction)
                if function:
                    break
    pcie_device = _as(by_kind.get("PCIeDevice"), PCIeDevice)
    if pcie_device is None:
        processor, drive, controller = parts.processor, parts.drive, parts.controller
        uri = (
            (function.links.pcie_device if function else None)
            or (processor.links.pcie_device if processor else None)
            or (drive.links.pcie_device if drive else None)
            or (controller.links.pcie_devices if controller else None)
        )
        pcie_device = await walk.read(uri, PCIeDevice)
    if function is None and pcie_device is not None:
        function = await walk.read(pcie_device.pcie_functions, PCIeFunction)
        if function is not None and "members" in function.model_fields_set:
            function = await walk.read(function.members, PCIeFunction)  # the collection: its first
    # Endpoints may carry the PCI IDs themselves (Endpoint 1.x ConnectedEntities[].EntityPciId).
    pci_id = parts.endpoint.entity_pci_id if function is None and parts.endpoint else None
    if function is None and pci_id:
        function = PCIeFunction.model_validate(
            {"VendorId": pci_id.vendor_id, "DeviceId": pci_id.device_id, "ClassCode": pci_id.class_code}
        )
    parts.function, parts.pcie_device = function, pcie_device


def _kind(parts: _Parts) -> DeviceType:
    """What the device is: the processor's type, the drive's protocol, a network part, the PCI
    class, or CXL memory."""
    processor, drive = parts.processor, parts.drive
    if processor and processor.processor_type in _PROCESSOR_TYPES:
        return _PROCESSOR_TYPES[processor.processor_type]
    if drive and drive.protocol in ("NVMe", "NVMeOverFabrics"):
        return DeviceType.NVME
    if drive is not None or parts.trays:
        # SAS, SATA, or a drive that names no protocol: NVMe only when its PCI class says so
        return DeviceType.NVME if _type_from_class(parts.function) is DeviceType.NVME else DeviceType.STORAGE
    if parts.network is not None:
        return DeviceType.NIC
    if (guess := _type_from_class(parts.function)) is not None:
        return guess
    if parts.chunk is not None or (parts.logical and "CXLmem" in (parts.logical.semantics_supported or ())):
        return DeviceType.CXL_MEMORY
    return DeviceType.OTHER


def _memory(parts: _Parts, kind: DeviceType) -> int | None:
    """Device memory in bytes: a GPU's or FPGA's own, else the memory chunk's or the CXL device's."""
    processor, chunk, logical = parts.processor, parts.chunk, parts.logical
    memory: int | None = None
    if kind in (DeviceType.GPU, DeviceType.FPGA) and processor:
        memory = _mib(processor.memory_summary.total_memory_size_mib)
        if memory is None:
            total = sum(
                m.capacity_mib or 0 for m in processor.processor_memory or () if not m.integrated_memory
            )
            memory = _mib(total)
    if memory is None and chunk is not None:
        memory = _mib(chunk.memory_chunk_size_mib)
    if memory is None and logical is not None:
        memory = _mib(logical.memory_size_mib)
    return memory


def _serial(parts: _Parts) -> str | None:
    primary, pcie_device, logical = parts.primary, parts.pcie_device, parts.logical
    serial = _first(
        primary.serial_number if primary else None, pcie_device.serial_number if pcie_device else None
    )
    if serial is None and logical is not None:
        serial = next((i.durable_name for i in logical.identifiers or () if i.durable_name), None)
    return serial


def _health(parts: _Parts) -> tuple[Health, bool]:
    """The worst health of any part, and whether none is absent, disabled or offline."""
    health: Health = Health.OK
    available = True
    every: list[Resource | Endpoint | SimpleStorageDevice | None] = [
        *(parts.endpoint, parts.container, parts.processor, parts.network, parts.chunk),
        *(parts.pcie_device, parts.logical, parts.storage, parts.simple),
        *parts.drives,
        *parts.trays,
    ]
    for part in every:
        resource_health, state = status_of(part)
        if resource_health is not None and _HEALTH_ORDER[resource_health] > _HEALTH_ORDER[health]:
            health = resource_health
        if state in _UNAVAILABLE_STATES:
            available = False
    return health, available


async def _location(walk: Walk, parts: _Parts) -> tuple[str | None, str | None, str | None]:
    """(Switch Id, Port Id, the port's URI) the device hangs off: from its endpoint, else from the
    first endpoint its processor, drive or network part links."""
    switch, port, uri = None, None, None
    if parts.endpoint is not None:
        switch, port, uri = await _switch_port(walk, _endpoint_ports(parts.endpoint))
    if switch is None:
        for holder in (parts.processor, parts.drive, parts.network):
            endpoints = holder.links.endpoints if holder else ()
            if endpoints:
                switch, port, uri = await _switch_port(
                    walk, _endpoint_ports(await walk.read(endpoints[0], Endpoint))
                )
                if switch:
                    break
    return switch, port, uri


def _reset_target(parts: _Parts) -> str | None:
    """The ``Reset`` action of the processor or drive, when it allows :data:`RESET_TYPE`.

    The reset the manager sends is ForceRestart (Backend.reset): a resource whose Reset does not
    allow it is not reset through Redfish (its node resets the function instead)."""
    return next(
        (
            target
            for holder, action in ((parts.processor, "Processor.Reset"), (parts.drive, "Drive.Reset"))
            if holder is not None
            and (target := holder.actions.target(action))
            and holder.actions.allows(action, "ResetType", RESET_TYPE)
        ),
        None,
    )


def _identities(parts: _Parts, entities: Sequence[tuple[str, str]]) -> frozenset[str]:
    """The URIs of the resources the device is made of (to recognise it from another binding style)."""
    identities = {uri for _, uri in entities}
    for linked in (parts.function, parts.pcie_device, parts.logical, parts.chunk, *parts.drives):
        if linked and linked.uri:
            identities.add(linked.uri)
    return frozenset(identities)
