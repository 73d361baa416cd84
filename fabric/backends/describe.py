"""Device attributes from the Redfish resources behind an endpoint or a resource block.

A device is spread over several resources: the Processor (GPU, FPGA) or Drive or network function
the endpoint names, the PCIeFunction with the PCI IDs, the PCIeDevice with the link and the serial
number, a CXL logical device, a memory chunk. This module follows the standard links between them
(Processor/Drive ``Links.PCIeFunctions``, PCIeFunction ``Links.PCIeDevice``, MemoryChunks
``Links.CXLLogicalDevices`` → CXLLogicalDevice ``Links.PCIeFunctions``) and takes each attribute
from the most specific resource that has it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fabric.backends.model import DiscoveredAttributes
from fabric.backends.walk import Walk, link, links, path_ids
from manager_api.devices import DeviceType, Health

__all__ = ["DEVICE_ENTITY_TYPES", "describe", "locate_port", "status_of"]

JSON = dict[str, Any]

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


def status_of(resource: Mapping[str, Any] | None) -> tuple[Health | None, str | None]:
    """(Status.Health, Status.State) of a resource, either possibly None."""
    status = resource.get("Status") if resource else None
    if not isinstance(status, Mapping):
        return None, None
    health_text = status.get("Health")
    health = None
    if health_text in ("OK", "Warning", "Critical"):
        health = Health(health_text)
    state = status.get("State")
    return health, str(state) if state else None


def _odata_kind(resource: Mapping[str, Any]) -> str:
    """``#PCIeFunction.v1_7_0.PCIeFunction`` → ``PCIeFunction``."""
    text = str(resource.get("@odata.type") or "")
    return text.lstrip("#").split(".", 1)[0]


def _pci_id(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"0[xX][0-9a-fA-F]{4}", value.strip()):
        return None
    return value.strip().lower()


def _mib(value: object) -> int | None:
    return int(value) * 1024 * 1024 if isinstance(value, int | float) and value > 0 else None


def _generation(pcie_type: object) -> int | None:
    match = re.fullmatch(r"Gen(\d+)", str(pcie_type or ""))
    return int(match.group(1)) if match else None


def _type_from_class(function: Mapping[str, Any] | None) -> DeviceType | None:
    if not function:
        return None
    code = str(function.get("ClassCode") or "").lower()
    if re.fullmatch(r"0x[0-9a-f]{6}", code):
        if code.startswith("0x03"):
            return DeviceType.GPU
        if code.startswith("0x0108"):
            return DeviceType.NVME
        if code.startswith("0x02"):
            return DeviceType.NIC
    device_class = function.get("DeviceClass")
    return {
        "DisplayController": DeviceType.GPU,
        "NetworkController": DeviceType.NIC,
    }.get(str(device_class))


def _first(*values: object) -> Any:
    for value in values:
        if value not in (None, "", [], {}):
            return value
    return None


def _endpoint_ports(endpoint: Mapping[str, Any] | None) -> list[str]:
    """Switch ports first (``ConnectedPorts``), then the endpoint's own (``Ports``, ``LocalPorts``)."""
    found: list[str] = []
    for name in ("ConnectedPorts", "Ports", "LocalPorts"):
        found.extend(u for u in links(endpoint, "Links", name) if u not in found)
    return found


def _entity_pci_id(endpoint: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    for entity in (endpoint or {}).get("ConnectedEntities") or []:
        if isinstance(entity, Mapping) and isinstance(entity.get("EntityPciId"), Mapping):
            return entity["EntityPciId"]  # type: ignore[no-any-return]
    return None


def _adapter_controller(adapter: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    controllers = (adapter or {}).get("Controllers")
    if isinstance(controllers, list) and controllers and isinstance(controllers[0], Mapping):
        return controllers[0]
    return None


async def locate_port(walk: Walk, port_uris: Sequence[str]) -> tuple[str | None, str | None]:
    """(Switch Id, Port Id) the device hangs off, from the endpoint's ports.

    The endpoint may name the switch's downstream port directly, or the device-side port (a
    FabricAdapter port, as in DMTF's public-cxl mockup) whose ``ConnectedSwitchPorts`` names it.
    """
    for uri in port_uris:
        switch = path_ids(uri, "Switches")
        if switch:
            return switch, path_ids(uri, "Ports")
    for uri in port_uris:
        port = await walk.get(uri)
        switch_ports = links(port, "Links", "ConnectedSwitchPorts")
        if switch_ports:
            return path_ids(switch_ports[0], "Switches"), path_ids(switch_ports[0], "Ports")
        switches = links(port, "Links", "ConnectedSwitches")
        if switches:
            return path_ids(switches[0], "Switches"), None
    return None, None


async def describe(
    walk: Walk,
    entities: Sequence[tuple[str, str]],
    *,
    endpoint: Mapping[str, Any] | None = None,
    container: Mapping[str, Any] | None = None,
    chunk: Mapping[str, Any] | None = None,
) -> DiscoveredAttributes:
    """Attributes of the device made of ``entities`` ((EntityType, URI) pairs).

    ``endpoint`` is its target endpoint (zone and connection styles), ``container`` its resource
    block (composition), ``chunk`` the memory chunk that is the unit of binding (connection style).
    """
    resources = await walk.get_all(uri for _, uri in entities)
    by_kind: dict[str, JSON] = {}
    for resource in resources:
        by_kind.setdefault(_odata_kind(resource), resource)
    processor = by_kind.get("Processor")
    drive = by_kind.get("Drive")
    network = _first(
        by_kind.get("NetworkAdapter"),
        by_kind.get("NetworkDeviceFunction"),
        by_kind.get("NetworkInterface"),
        by_kind.get("EthernetInterface"),
    )
    if network is not None and _odata_kind(network) != "NetworkAdapter":
        # A system's NetworkInterface (composition) stands for a NetworkAdapter: describe that.
        adapter = await walk.get(link(network, "Links", "NetworkAdapter"))
        if adapter is not None:
            network = by_kind["NetworkAdapter"] = adapter
    logical = by_kind.get("CXLLogicalDevice")
    if chunk is None:
        chunk = by_kind.get("MemoryChunks")
    if logical is None and chunk is not None:
        logical = await walk.get(link(chunk, "Links", "CXLLogicalDevices"))

    function = by_kind.get("PCIeFunction")
    if function is None:
        for holder in (processor, drive, network, logical):
            uri = link(holder, "Links", "PCIeFunctions") or link(holder, "Links", "PCIeFunction")
            if uri:
                function = await walk.get(uri)
                if function:
                    break
    pcie_device = by_kind.get("PCIeDevice")
    controller = _adapter_controller(network)
    if pcie_device is None:
        uri = (
            link(function, "Links", "PCIeDevice")
            or link(processor, "Links", "PCIeDevice")
            or link(drive, "Links", "PCIeDevice")
            or link(controller, "Links", "PCIeDevices")
        )
        pcie_device = await walk.get(uri)
    if function is None and pcie_device is not None:
        function = await walk.get(link(pcie_device, "PCIeFunctions"))
        if function is not None and "Members" in function:  # the collection: its first function
            function = await walk.get(link(function, "Members"))
    # Endpoints may carry the PCI IDs themselves (Endpoint 1.x ConnectedEntities[].EntityPciId).
    pci_id = _entity_pci_id(endpoint)
    if function is None and pci_id:
        function = {
            "VendorId": pci_id.get("VendorId"),
            "DeviceId": pci_id.get("DeviceId"),
            "ClassCode": pci_id.get("ClassCode"),
        }

    kind = DeviceType.OTHER
    if processor and str(processor.get("ProcessorType")) in _PROCESSOR_TYPES:
        kind = _PROCESSOR_TYPES[str(processor.get("ProcessorType"))]
    elif drive and str(drive.get("Protocol")) in ("NVMe", "NVMeOverFabrics"):
        kind = DeviceType.NVME
    elif network is not None:
        kind = DeviceType.NIC
    elif (guess := _type_from_class(function)) is not None:
        kind = guess
    elif chunk is not None or (logical and "CXLmem" in (logical.get("SemanticsSupported") or [])):
        kind = DeviceType.CXL_MEMORY

    memory: int | None = None
    if kind in (DeviceType.GPU, DeviceType.FPGA) and processor:
        summary = processor.get("MemorySummary") or {}
        memory = _mib(summary.get("TotalMemorySizeMiB"))
        if memory is None:
            total = sum(
                int(m.get("CapacityMiB") or 0)
                for m in processor.get("ProcessorMemory") or []
                if isinstance(m, Mapping) and not m.get("IntegratedMemory")
            )
            memory = _mib(total)
    elif drive is not None:
        capacity = drive.get("CapacityBytes")
        memory = int(capacity) if isinstance(capacity, int) and capacity > 0 else None
    if memory is None and chunk is not None:
        memory = _mib(chunk.get("MemoryChunkSizeMiB"))
    if memory is None and logical is not None:
        memory = _mib(logical.get("MemorySizeMiB"))

    primary = _first(processor, drive, network, pcie_device, logical) or {}
    interface = (pcie_device or {}).get("PCIeInterface") or (controller or {}).get("PCIeInterface") or {}
    serial = _first(primary.get("SerialNumber"), (pcie_device or {}).get("SerialNumber"))
    if serial is None and logical is not None:
        for identifier in logical.get("Identifiers") or []:
            if isinstance(identifier, Mapping) and identifier.get("DurableName"):
                serial = identifier["DurableName"]
                break
    uuid = _first(primary.get("UUID"), (pcie_device or {}).get("UUID"))

    health: Health = Health.OK
    available = True
    for part in (endpoint, container, processor, drive, network, chunk, pcie_device, logical):
        resource_health, state = status_of(part)
        if resource_health is not None and _HEALTH_ORDER[resource_health] > _HEALTH_ORDER[health]:
            health = resource_health
        if state in _UNAVAILABLE_STATES:
            available = False

    switch, port = None, None
    if endpoint is not None:
        switch, port = await locate_port(walk, _endpoint_ports(endpoint))
    if switch is None:
        for holder in (processor, drive, network):
            endpoints = links(holder, "Links", "Endpoints")
            if endpoints:
                switch, port = await locate_port(walk, _endpoint_ports(await walk.get(endpoints[0])))
                if switch:
                    break

    identities = {uri for _, uri in entities}
    for linked in (function, pcie_device, logical, chunk):
        if linked and linked.get("@odata.id"):
            identities.add(str(linked["@odata.id"]).rstrip("/"))
    return DiscoveredAttributes(
        type=kind,
        vendor=_first(primary.get("Manufacturer"), (pcie_device or {}).get("Manufacturer")),
        vendor_id=_pci_id((function or {}).get("VendorId"))
        or _pci_id(((processor or {}).get("ProcessorId") or {}).get("VendorId")),
        device_id=_pci_id((function or {}).get("DeviceId")),
        model=_first(primary.get("Model"), (pcie_device or {}).get("Model")),
        serial=str(serial) if serial else None,
        uuid=str(uuid).lower() if uuid else None,
        memory_bytes=memory,
        pcie_generation=_generation(_first(interface.get("PCIeType"), interface.get("MaxPCIeType"))),
        pcie_width=_first(interface.get("LanesInUse"), interface.get("MaxLanes")),
        switch=switch,
        port=port,
        health=health,
        available=available,
        identities=frozenset(identities),
    )
