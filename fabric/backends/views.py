"""Typed read views of the Redfish resources discovery and the binding backends read.

Each view names the properties the backends use, with the schema (DMTF CSDL, ``shared/redfish/csdl``)
that defines them, in the spirit of sushy's ``base.Field``: the JSON is read in one place, here, and
the backends work with attributes, not with dictionaries.

The views are lenient, because real services and DMTF's own mockups omit properties, use older schema
versions and sometimes send the wrong type: every property is optional, unknown ones are left out
(``extra="ignore"``: a view of each of a 10,100-device fabric's resources kept every property it
never reads, and held more memory than the answers it was made of; only :class:`Actions`, whose
names are the actions', keeps them), and a property of the wrong shape reads as absent instead of
failing the whole resource — a zone whose ``Links`` is a string is a zone without links, as the
dictionary reading it replaces treated it. Links keep the rules of :func:`odata_id`: a resource
identifier is the path of a URI (DSP0266), normalised without its trailing slash; a single link
given as an array counts by its first element.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, Self, TypeAlias, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
)
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "JSON",
    "Actions",
    "CXLLogicalDevice",
    "Chassis",
    "ChassisLinks",
    "Collection",
    "CompositionService",
    "CompositionStatus",
    "ComputerSystem",
    "ComputerSystemLinks",
    "ConnectedEntity",
    "Connection",
    "ConnectionLinks",
    "Controller",
    "DeviceLinks",
    "DeviceResource",
    "Drive",
    "Endpoint",
    "EndpointLinks",
    "ExpandQuery",
    "Fabric",
    "Identifier",
    "MemoryChunkInfo",
    "MemoryChunks",
    "MemorySummary",
    "NetworkAdapter",
    "PCIeDevice",
    "PCIeErrors",
    "PCIeFunction",
    "PCIeInterface",
    "PciId",
    "Port",
    "PortLinks",
    "PortMetrics",
    "Processor",
    "ProcessorId",
    "ProcessorMemory",
    "ProtocolFeatures",
    "Readable",
    "Resource",
    "ResourceBlock",
    "ResourceBlockLinks",
    "ServiceRoot",
    "SimpleStorage",
    "SimpleStorageDevice",
    "Status",
    "Storage",
    "Switch",
    "View",
    "Zone",
    "ZoneLinks",
    "kind_view",
    "odata_id",
    "view_of_kind",
]

#: A Redfish payload as it comes off the wire.
JSON: TypeAlias = dict[str, Any]

T = TypeVar("T")
V = TypeVar("V", bound="View")


def odata_id(value: object) -> str | None:
    """The ``@odata.id`` of a navigation link object, or None — also when it is no URI path
    (DSP0266: a resource identifier is the path of its URI)."""
    # dict first: the ABC check alone was a tenth of what views cost at 10,100 devices
    if type(value) is dict or isinstance(value, Mapping):
        target = value.get("@odata.id")
        if isinstance(target, str) and target.startswith("/") and target.isprintable():
            return target.rstrip("/") or "/"
    return None


def _path(value: object) -> str | None:
    return odata_id({"@odata.id": value})


def _first_uri(value: object) -> str | None:
    if isinstance(value, list):
        return odata_id(value[0]) if value else None
    return odata_id(value)


def _all_uris(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(u for u in (odata_id(v) for v in value) if u)
    single = odata_id(value)
    return (single,) if single else ()


def _kind(odata_type: str | None) -> str:
    return (odata_type or "").lstrip("#").split(".", 1)[0]


def _text(value: object) -> str | None:
    """A string property; another scalar reads as its text, as ``str(value)`` did."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return None


class _OrNone:
    """A property of the wrong shape reads as absent (None)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_default_schema(handler(source), default=None, on_error="default")


class _OrEmpty:
    """An object property of the wrong shape reads as the empty object."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_default_schema(handler(source), default=source(), on_error="default")


class _Skip:
    """An array member of the wrong shape is left out."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_default_schema(handler(source), on_error="omit")


#: a value of type T, or None when absent or of another shape
Tolerant: TypeAlias = Annotated[T | None, _OrNone]
#: an object, empty when absent or of another shape
Part: TypeAlias = Annotated[T, _OrEmpty]
#: an array of T, members of another shape left out
Each: TypeAlias = list[Annotated[T, _Skip]]
#: a string property
Text: TypeAlias = Annotated[str | None, PlainValidator(_text)]
#: a resource's own identifier (``@odata.id``)
Path: TypeAlias = Annotated[str | None, PlainValidator(_path)]
#: a navigation link object (its URI)
Link: TypeAlias = Annotated[str | None, PlainValidator(odata_id)]
#: a single navigation link (its URI); given as an array, its first member
Ref: TypeAlias = Annotated[str | None, PlainValidator(_first_uri)]
#: an array of navigation links (their URIs)
Refs: TypeAlias = Annotated[tuple[str, ...], PlainValidator(_all_uris)]
#: a JSON number (not a string that holds one)
Number: TypeAlias = Tolerant[StrictInt | StrictFloat]


def prop(name: str) -> Any:
    """A Redfish property, absent by default."""
    return Field(default=None, alias=name)


def refs(name: str) -> Any:
    """A Redfish link array, empty by default."""
    return Field(default=(), alias=name)


def part(name: str, view: type[Any]) -> Any:
    """A Redfish object property, empty by default: one empty view shared by every resource that
    lacks the property (views are frozen). A factory made one per resource — most resources lack
    ``Actions``, many ``Status`` or ``Links`` — and they were a third of what views cost."""
    return Field(default=view(), alias=name)


class Readable(Protocol):
    """What :class:`fabric.backends.walk.Walk` reads a resource's JSON into: a :class:`View`, or a
    slotted record read by hand (:class:`Endpoint`)."""

    @classmethod
    def model_validate(cls, obj: Any) -> Self: ...


class View(BaseModel):
    """A read view: lenient, frozen, leaves out what it does not name."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @classmethod
    def of(cls: type[V], payload: Mapping[str, Any] | None) -> V | None:
        """The view of ``payload``; None for no payload."""
        return None if payload is None else cls.model_validate(payload)


class Status(View):
    """Resource.v1_23_0 Status."""

    health: Text = prop("Health")
    state: Text = prop("State")


class Actions(View):
    """Resource.v1_23_0 Actions: ``#<Schema>.<Action>`` → ``{"target": URI}`` (kept as sent:
    the property names are the actions')."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def target(self, action: str) -> str | None:
        entry = (self.model_extra or {}).get(f"#{action}")
        if isinstance(entry, Mapping) and entry.get("target"):
            return str(entry["target"])
        return None

    def allows(self, action: str, parameter: str, value: str) -> bool:
        """Whether ``action`` takes ``value`` for ``parameter``: it is in the action's
        ``<parameter>@Redfish.AllowableValues``, or the action lists none (DSP0266 "Allowable
        values": the annotation, where present, is the list the service accepts)."""
        entry = (self.model_extra or {}).get(f"#{action}")
        allowed = entry.get(f"{parameter}@Redfish.AllowableValues") if isinstance(entry, Mapping) else None
        return not isinstance(allowed, list) or value in allowed


_NO_STATUS = Status()
_NO_ACTIONS = Actions()


class Resource(View):
    """What every Redfish resource has (Resource.v1_23_0)."""

    uri: Path = prop("@odata.id")
    odata_type: Text = prop("@odata.type")
    id: Text = prop("Id")
    name: Text = prop("Name")
    status: Part[Status] = part("Status", Status)
    actions: Part[Actions] = part("Actions", Actions)

    @property
    def kind(self) -> str:
        """``#PCIeFunction.v1_7_0.PCIeFunction`` → ``PCIeFunction``."""
        return _kind(self.odata_type)


class Collection(View):
    """A resource collection page (DSP0266 "Resource collections")."""

    #: as sent: :meth:`fabric.backends.walk.Walk.member_uris` refuses members that are no array
    members: Any = Field(default_factory=list, alias="Members")
    next_link: Text = prop("Members@odata.nextLink")


class ExpandQuery(View):
    expand_all: Tolerant[StrictBool] = prop("ExpandAll")
    no_links: Tolerant[StrictBool] = prop("NoLinks")
    #: ``($levels=n)`` is served, up to ``MaxLevels`` (ServiceRoot 1.3: without it, one level)
    levels: Tolerant[StrictBool] = prop("Levels")
    max_levels: Tolerant[StrictInt] = prop("MaxLevels")


class ProtocolFeatures(View):
    expand_query: Part[ExpandQuery] = part("ExpandQuery", ExpandQuery)
    select_query: Tolerant[StrictBool] = prop("SelectQuery")


class ServiceRoot(Resource):
    """ServiceRoot.v1_20_0."""

    systems: Link = prop("Systems")
    fabrics: Link = prop("Fabrics")
    composition_service: Link = prop("CompositionService")
    #: blocks of a service without a CompositionService (ServiceRoot 1.5: "for implementations
    #: that do not contain a composition service", e.g. an expansion enclosure)
    resource_blocks: Link = prop("ResourceBlocks")
    protocol_features: Part[ProtocolFeatures] = part("ProtocolFeaturesSupported", ProtocolFeatures)

    @property
    def supports_expand(self) -> bool:
        """``$expand=.($levels=1)`` is served (ProtocolFeaturesSupported.ExpandQuery)."""
        expand = self.protocol_features.expand_query
        return bool(expand.expand_all or expand.no_links)

    @property
    def expand_levels(self) -> int:
        """How deep ``$expand=.($levels=n)`` may go: 0 without ``$expand``, 1 without ``Levels``,
        else ``MaxLevels`` (at least 1: a service that says ``Levels`` and no bound serves one)."""
        if not self.supports_expand:
            return 0
        expand = self.protocol_features.expand_query
        if not expand.levels or expand.max_levels is None:
            return 1
        return max(1, expand.max_levels)

    @property
    def supports_select(self) -> bool:
        """``$select`` is served (ProtocolFeaturesSupported.SelectQuery)."""
        return bool(self.protocol_features.select_query)


class ComputerSystemLinks(View):
    """ComputerSystem.v1_27_0 Links. ``resource_blocks`` is None when the system does not say."""

    resource_blocks: Annotated[tuple[str, ...] | None, PlainValidator(_all_uris)] = prop("ResourceBlocks")


class ComputerSystem(Resource):
    """ComputerSystem.v1_27_0: a host; ``#ComputerSystem.AddResourceBlock`` (1.6) binds to it;
    ``Links.ResourceBlocks`` names the blocks composed into it (the composition's record)."""

    uuid: Text = prop("UUID")
    host_name: Text = prop("HostName")
    links: Part[ComputerSystemLinks] = part("Links", ComputerSystemLinks)


class Fabric(Resource):
    """Fabric.v1_4_0."""

    zones: Link = prop("Zones")
    endpoints: Link = prop("Endpoints")
    connections: Link = prop("Connections")


# The endpoints are kept between passes (a 304 gives back the same answer, whose endpoints are
# then not read again): at 10,100 devices a pydantic view of each (Endpoint, its Links, Status,
# ConnectedEntity, PciId: five models, each with its own field dict and set) was 3 KB an endpoint,
# a third of what discovery held. They are slotted records read by hand with the rules the views
# follow (:data:`Text`, :data:`Link`, :data:`Refs`, a member of the wrong shape left out, an object
# of the wrong shape read as empty); tests/unit/fabric/test_endpoint_record.py holds them equal to
# the pydantic views they replace, on the emulator's fabrics and on junk.


@dataclass(frozen=True, slots=True)
class PciId:
    """Endpoint.v1_0_0 PciId (``ConnectedEntities[].EntityPciId``)."""

    vendor_id: str | None = None
    device_id: str | None = None
    class_code: str | None = None

    @classmethod
    def model_validate(cls, payload: Any) -> PciId:
        return _pci_id(
            _text(payload.get("VendorId")), _text(payload.get("DeviceId")), _text(payload.get("ClassCode"))
        )


@functools.lru_cache(maxsize=256)
def _pci_id(vendor_id: str | None, device_id: str | None, class_code: str | None) -> PciId:
    """One record per set of IDs: a fabric's devices share a few."""
    return PciId(vendor_id, device_id, class_code)


@dataclass(frozen=True, slots=True)
class ConnectedEntity:
    """Endpoint.v1_0_0 ConnectedEntity."""

    entity_type: str | None = None
    entity_role: str | None = None
    entity_link: str | None = None
    entity_pci_id: PciId | None = None

    @classmethod
    def model_validate(cls, payload: Any) -> ConnectedEntity:
        pci_id = payload.get("EntityPciId")
        return cls(
            entity_type=_shared_text(payload.get("EntityType")),
            entity_role=_shared_text(payload.get("EntityRole")),
            entity_link=odata_id(payload.get("EntityLink")),
            entity_pci_id=PciId.model_validate(pci_id) if type(pci_id) is dict else None,
        )


@dataclass(frozen=True, slots=True)
class EndpointLinks:
    """Endpoint.v1_8_2 Links. ``zones``/``connections`` are None when the endpoint does not say (not
    the same as an empty list: then the fabric's collections are read instead)."""

    ports: tuple[str, ...] = ()
    connected_ports: tuple[str, ...] = ()
    local_ports: tuple[str, ...] = ()
    zones: tuple[str, ...] | None = None
    connections: tuple[str, ...] | None = None

    @classmethod
    def model_validate(cls, payload: Any) -> EndpointLinks:
        return cls(
            ports=_all_uris(payload.get("Ports")),
            connected_ports=_all_uris(payload.get("ConnectedPorts")),
            local_ports=_all_uris(payload.get("LocalPorts")),
            zones=_all_uris(payload["Zones"]) if "Zones" in payload else None,
            connections=_all_uris(payload["Connections"]) if "Connections" in payload else None,
        )


_NO_LINKS = EndpointLinks()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Endpoint.v1_8_2: an initiator (a host's port) or a target (a device) of a fabric; what
    :class:`Resource` reads of every resource, and its entities and links."""

    uri: str | None = None
    odata_type: str | None = None
    id: str | None = None
    name: str | None = None
    status: Status = _NO_STATUS
    actions: Actions = _NO_ACTIONS
    connected_entities: list[ConnectedEntity] | None = None
    links: EndpointLinks = _NO_LINKS

    @classmethod
    def model_validate(cls, payload: Any) -> Endpoint:
        """The endpoint read from its JSON (an object; anything else is refused, as a view's
        ``model_validate`` refuses it)."""
        if not isinstance(payload, Mapping):
            raise ValueError(f"an Endpoint is a JSON object, not {type(payload).__name__}")
        status, actions, links = payload.get("Status"), payload.get("Actions"), payload.get("Links")
        entities = payload.get("ConnectedEntities")
        return cls(
            uri=_path(payload.get("@odata.id")),
            odata_type=_shared_text(payload.get("@odata.type")),
            id=_text(payload.get("Id")),
            name=_text(payload.get("Name")),
            status=_status(_text(status.get("Health")), _text(status.get("State")))
            if type(status) is dict
            else _NO_STATUS,
            actions=Actions.model_validate(actions) if type(actions) is dict and actions else _NO_ACTIONS,
            connected_entities=[ConnectedEntity.model_validate(e) for e in entities if type(e) is dict]
            if type(entities) is list
            else None,
            links=EndpointLinks.model_validate(links) if type(links) is dict else _NO_LINKS,
        )

    @property
    def kind(self) -> str:
        return _kind(self.odata_type)

    @property
    def entity_pci_id(self) -> PciId | None:
        """The PCI IDs the endpoint itself carries (Endpoint 1.x ``EntityPciId``), if any."""
        return next((e.entity_pci_id for e in self.connected_entities or () if e.entity_pci_id), None)


def _shared_text(value: object) -> str | None:
    """:func:`_text`, one string object for a value many resources repeat (types, roles)."""
    text = _text(value)
    return sys.intern(text) if type(text) is str else text


@functools.lru_cache(maxsize=256)
def _status(health: str | None, state: str | None) -> Status:
    """One (frozen) Status per health and state: endpoints share a few."""
    return Status(health=health, state=state)


class ZoneLinks(View):
    endpoints: Refs = refs("Endpoints")


class Zone(Resource):
    """Zone.v1_6_3: the endpoints of a ``ZoneOfEndpoints`` can communicate (binding);
    ``#Zone.AddEndpoint`` / ``#Zone.RemoveEndpoint`` (1.5) change it."""

    zone_type: Text = prop("ZoneType")
    links: Part[ZoneLinks] = part("Links", ZoneLinks)


class MemoryChunkInfo(View):
    """Connection.v1_1_0 MemoryChunkInfo."""

    memory_chunk: Link = prop("MemoryChunk")


class ConnectionLinks(View):
    initiator_endpoints: Refs = refs("InitiatorEndpoints")
    target_endpoints: Refs = refs("TargetEndpoints")


class Connection(Resource):
    """Connection.v1_4_0: memory chunks of targets granted to initiators."""

    connection_type: Text = prop("ConnectionType")
    memory_chunk_info: Tolerant[Each[MemoryChunkInfo]] = prop("MemoryChunkInfo")
    links: Part[ConnectionLinks] = part("Links", ConnectionLinks)

    @property
    def chunks(self) -> list[str]:
        return [i.memory_chunk for i in self.memory_chunk_info or () if i.memory_chunk]


class CompositionStatus(View):
    """ResourceBlock.v1_0_0 CompositionStatus."""

    composition_state: Text = prop("CompositionState")
    reserved: Any = prop("Reserved")


class ResourceBlockLinks(View):
    computer_systems: Refs = refs("ComputerSystems")
    chassis: Refs = refs("Chassis")


class ResourceBlock(Resource):
    """ResourceBlock.v1_4_3: a device (or compute, or memory) that composition adds to a system."""

    resource_block_type: Tolerant[Each[Text]] = prop("ResourceBlockType")
    composition_status: Part[CompositionStatus] = part("CompositionStatus", CompositionStatus)
    links: Part[ResourceBlockLinks] = part("Links", ResourceBlockLinks)
    processors: Refs = refs("Processors")
    drives: Refs = refs("Drives")
    network_interfaces: Refs = refs("NetworkInterfaces")
    ethernet_interfaces: Refs = refs("EthernetInterfaces")
    storage: Refs = refs("Storage")
    simple_storage: Refs = refs("SimpleStorage")
    pcie_devices: Refs = refs("PCIeDevices")


class CompositionService(Resource):
    """CompositionService.v1_2_3."""

    service_enabled: Tolerant[StrictBool] = prop("ServiceEnabled")
    resource_blocks: Link = prop("ResourceBlocks")


class ChassisLinks(View):
    switches: Refs = refs("Switches")


class Chassis(Resource):
    """Chassis.v1_28_0."""

    links: Part[ChassisLinks] = part("Links", ChassisLinks)


class PortLinks(View):
    """Port Links: ``ConnectedSwitchPorts``, ``ConnectedSwitches`` (v1_0_0), ``ConnectedPorts`` (v1_2_0)."""

    connected_switch_ports: Refs = refs("ConnectedSwitchPorts")
    connected_switches: Refs = refs("ConnectedSwitches")
    connected_ports: Refs = refs("ConnectedPorts")


class Port(Resource):
    """Port.v1_18_0: a device-side port (a FabricAdapter's, as in DMTF's public-cxl mockup) names
    the switch port it is cabled to; a switch port links its metrics; an inter-switch port names
    the switch (port) at the cable's other end. ``LinkStatus`` (v1_2_0) ``NoLink``: nothing detected."""

    links: Part[PortLinks] = part("Links", PortLinks)
    metrics: Ref = prop("Metrics")
    link_status: Text = prop("LinkStatus")


class Switch(Resource):
    """Switch.v1_11_0: its ``Ports`` collection."""

    ports: Ref = prop("Ports")


class PCIeErrors(View):
    """PCIeDevice.v1_8_0 PCIeErrors (each counter absent where the service does not count it)."""

    correctable: Tolerant[int] = prop("CorrectableErrorCount")
    non_fatal: Tolerant[int] = prop("NonFatalErrorCount")
    fatal: Tolerant[int] = prop("FatalErrorCount")
    l0_to_recovery: Tolerant[int] = prop("L0ToRecoveryCount")
    replays: Tolerant[int] = prop("ReplayCount")
    replay_rollovers: Tolerant[int] = prop("ReplayRolloverCount")
    nak_sent: Tolerant[int] = prop("NAKSentCount")
    nak_received: Tolerant[int] = prop("NAKReceivedCount")


class PortMetrics(Resource):
    """PortMetrics.v1_3_0+: the port's PCIe error counters."""

    pcie_errors: Tolerant[PCIeErrors] = prop("PCIeErrors")


class PCIeInterface(View):
    """PCIeDevice.v1_3_0 PCIeInterface."""

    pcie_type: Text = prop("PCIeType")
    max_pcie_type: Text = prop("MaxPCIeType")
    lanes_in_use: Tolerant[int] = prop("LanesInUse")
    max_lanes: Tolerant[int] = prop("MaxLanes")


class DeviceLinks(View):
    """The links a device's resources share (Processor, Drive, NetworkAdapter, PCIeFunction,
    CXLLogicalDevice, MemoryChunks …)."""

    pcie_functions: Ref = prop("PCIeFunctions")
    pcie_function: Ref = prop("PCIeFunction")
    pcie_device: Ref = prop("PCIeDevice")
    pcie_devices: Ref = prop("PCIeDevices")
    endpoints: Refs = refs("Endpoints")
    network_adapter: Ref = prop("NetworkAdapter")
    cxl_logical_devices: Ref = prop("CXLLogicalDevices")
    memory_domains: Refs = refs("MemoryDomains")


class DeviceResource(Resource):
    """What the resources that make up a device have in common."""

    manufacturer: Text = prop("Manufacturer")
    model: Text = prop("Model")
    serial_number: Text = prop("SerialNumber")
    uuid: Text = prop("UUID")
    links: Part[DeviceLinks] = part("Links", DeviceLinks)


class MemorySummary(View):
    total_memory_size_mib: Number = prop("TotalMemorySizeMiB")


class ProcessorMemory(View):
    capacity_mib: Tolerant[int] = prop("CapacityMiB")
    integrated_memory: Any = prop("IntegratedMemory")


class ProcessorId(View):
    vendor_id: Text = prop("VendorId")


class Processor(DeviceResource):
    """Processor.v1_22_0 (a GPU or an FPGA)."""

    processor_type: Text = prop("ProcessorType")
    memory_summary: Part[MemorySummary] = part("MemorySummary", MemorySummary)
    processor_memory: Tolerant[Each[ProcessorMemory]] = prop("ProcessorMemory")
    processor_id: Part[ProcessorId] = part("ProcessorId", ProcessorId)


class Drive(DeviceResource):
    """Drive.v1_22_0."""

    protocol: Text = prop("Protocol")
    capacity_bytes: Tolerant[StrictInt] = prop("CapacityBytes")


class Storage(DeviceResource):
    """Storage.v1_21_0: a storage subsystem; its ``Drives`` are the devices."""

    drives: Refs = refs("Drives")


class SimpleStorageDevice(View):
    """SimpleStorage.v1_3_2 Device: a drive known only by name, model and capacity."""

    name: Text = prop("Name")
    manufacturer: Text = prop("Manufacturer")
    model: Text = prop("Model")
    capacity_bytes: Tolerant[StrictInt] = prop("CapacityBytes")
    status: Part[Status] = part("Status", Status)


class SimpleStorage(DeviceResource):
    """SimpleStorage.v1_3_2: a controller and its drives, described inline (``Devices``)."""

    devices: Tolerant[Each[SimpleStorageDevice]] = prop("Devices")


class Controller(View):
    """NetworkAdapter.v1_0_0 Controllers."""

    pcie_interface: Tolerant[PCIeInterface] = prop("PCIeInterface")
    links: Part[DeviceLinks] = part("Links", DeviceLinks)


class NetworkAdapter(DeviceResource):
    """NetworkAdapter.v1_14_0; a system's NetworkInterface, NetworkDeviceFunction or EthernetInterface
    links to one."""

    controllers: Tolerant[list[Any]] = prop("Controllers")

    @property
    def controller(self) -> Controller | None:
        """The first controller (its PCIe link and the PCIeDevice it is)."""
        first = self.controllers[0] if self.controllers else None
        return Controller.model_validate(first) if isinstance(first, Mapping) else None


class Identifier(View):
    durable_name: Text = prop("DurableName")


class CXLLogicalDevice(DeviceResource):
    """CXLLogicalDevice.v1_3_0."""

    semantics_supported: Tolerant[Each[Text]] = prop("SemanticsSupported")
    memory_size_mib: Number = prop("MemorySizeMiB")
    identifiers: Tolerant[Each[Identifier]] = prop("Identifiers")


class MemoryChunks(DeviceResource):
    """MemoryChunks.v1_6_2: the unit of CXL memory binding (Connection style)."""

    memory_chunk_size_mib: Number = prop("MemoryChunkSizeMiB")


class MemoryDomain(Resource):
    """MemoryDomain.v1_5_0: a domain that may make chunks on demand (``AllowsMemoryChunkCreation``)."""

    allows_memory_chunk_creation: Tolerant[StrictBool] = prop("AllowsMemoryChunkCreation")
    min_memory_chunk_size_mib: Number = prop("MinMemoryChunkSizeMiB")
    memory_chunk_increment_mib: Number = prop("MemoryChunkIncrementMiB")
    memory_size_mib: Number = prop("MemorySizeMiB")
    memory_chunks: Ref = prop("MemoryChunks")


class PCIeDevice(DeviceResource):
    """PCIeDevice.v1_21_0: the link (PCIeInterface) and the serial number; fabric-dra's own
    ``Oem.FabricDRA.PartitionTable`` on a GPU that splits into partitions."""

    pcie_interface: Tolerant[PCIeInterface] = prop("PCIeInterface")
    pcie_functions: Ref = prop("PCIeFunctions")
    oem: Tolerant[dict[str, Any]] = prop("Oem")

    @property
    def partition_table(self) -> Any:
        """The raw ``Oem.FabricDRA.PartitionTable`` object, or None."""
        ours = (self.oem or {}).get("FabricDRA")
        return ours.get("PartitionTable") if isinstance(ours, dict) else None


class PCIeFunction(DeviceResource):
    """PCIeFunction.v1_7_0: the PCI IDs; its collection, when a device links that instead."""

    vendor_id: Text = prop("VendorId")
    device_id: Text = prop("DeviceId")
    class_code: Text = prop("ClassCode")
    device_class: Text = prop("DeviceClass")
    members: Ref = prop("Members")


_KINDS: dict[str, type[DeviceResource]] = {
    "Processor": Processor,
    "Drive": Drive,
    "NetworkAdapter": NetworkAdapter,
    "NetworkDeviceFunction": DeviceResource,
    "NetworkInterface": DeviceResource,
    "EthernetInterface": DeviceResource,
    "CXLLogicalDevice": CXLLogicalDevice,
    "MemoryChunks": MemoryChunks,
    "PCIeDevice": PCIeDevice,
    "PCIeFunction": PCIeFunction,
    "Storage": Storage,
    "SimpleStorage": SimpleStorage,
}


def kind_view(payload: Mapping[str, Any]) -> type[DeviceResource]:
    """The view of a device's resource by its ``@odata.type`` (read before the view it chooses)."""
    return _KINDS.get(_kind(_text(payload.get("@odata.type"))), DeviceResource)


def view_of_kind(payload: Mapping[str, Any]) -> DeviceResource:
    """A device's resource read as the view of its ``@odata.type``."""
    return kind_view(payload).model_validate(payload)
