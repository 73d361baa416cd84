"""The Redfish resource model of the emulator, declared once.

One pydantic class per Redfish type the service serves, with the properties it fills in,
spelled as DMTF's CSDL spells them (PascalCase; ``@odata.*`` through aliases). The version in
each class's ``ODATA_TYPE`` is the schema version the payload conforms to — the newest in
DMTF's 2025 schema bundle — and ``$metadata`` is derived from these classes. Views
(:mod:`emulator.redfish.views`) fill them from the fabric state; nothing else writes JSON.
"""

# No "from __future__ import annotations": many properties are named like their types
# (Status: Status), which only resolves when annotations are evaluated as the class is built.

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ALL_TYPES",
    "AccountService",
    "Action",
    "CXLLogicalDevice",
    "Chassis",
    "Collection",
    "CompositionService",
    "ComputerSystem",
    "Connection",
    "Drive",
    "Endpoint",
    "Event",
    "EventService",
    "Fabric",
    "Manager",
    "ManagerAccount",
    "MemoryChunks",
    "MemoryDomain",
    "MessageRegistryFile",
    "NetworkAdapter",
    "NetworkInterface",
    "PCIeDevice",
    "PCIeFunction",
    "Port",
    "Processor",
    "Ref",
    "Resource",
    "ResourceBlock",
    "Role",
    "ServiceRoot",
    "Session",
    "SessionService",
    "Status",
    "Storage",
    "StorageLinks",
    "Switch",
    "Task",
    "TaskService",
    "Typed",
    "Zone",
    "ref",
    "refs",
]


class _Obj(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class Ref(_Obj):
    """A link: ``{"@odata.id": "/redfish/v1/..."}``; frozen, as one instance serves every resource
    that names the URI (:func:`ref`)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    odata_id: str = Field(alias="@odata.id")


#: links made so far, by URI, the most recently used last: a link is never changed once made, so
#: one instance serves every resource that names it (a zone of a hundred endpoints validated a
#: hundred new links at each rendering). Bounded: past the limit the least recently used goes (task
#: monitors, sessions come and go). Not "first come, kept": a discovery of a 10,100-device fabric
#: names more links than the limit, and the zones' endpoints, named after it, were made anew at
#: every rendering of a zone (a hundred validations a change at 10,000 bindings).
_REFS: dict[str, Ref] = {}
_REFS_LIMIT = 1 << 16


def ref(uri: str) -> Ref:
    made = _REFS.pop(uri, None)
    if made is None:
        made = Ref(odata_id=uri)
        if len(_REFS) >= _REFS_LIMIT:
            del _REFS[next(iter(_REFS))]
    _REFS[uri] = made
    return made


def refs(uris: list[str] | tuple[str, ...]) -> list[Ref]:
    return [ref(u) for u in uris]


class Status(_Obj):
    State: str = "Enabled"
    Health: str = "OK"
    HealthRollup: str | None = None


class Identifier(_Obj):
    DurableName: str
    DurableNameFormat: str


class Action(_Obj):
    target: str
    title: str | None = None
    action_info: str | None = Field(default=None, alias="@Redfish.ActionInfo")
    #: ``<Parameter>@Redfish.AllowableValues`` of a reset action (DSP0266 "Allowable values"): the
    #: ``ResetType`` values the service accepts; another one is 400 ActionParameterValueNotInList
    reset_types: list[str] | None = Field(default=None, alias="ResetType@Redfish.AllowableValues")


class Typed(_Obj):
    """A payload with an ``@odata.type``: every resource, and an event."""

    ODATA_TYPE: ClassVar[str]

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"@odata.type": f"#{self.ODATA_TYPE}"}
        body.update(self.model_dump(by_alias=True, exclude_none=True))
        return body


class Resource(Typed):
    """Common to every Redfish resource: the Resource.v1 base properties."""

    odata_id: str = Field(alias="@odata.id")
    Id: str
    Name: str
    Description: str | None = None


class Collection(_Obj):
    """A resource collection; its type name is per collection (``#ZoneCollection.ZoneCollection``)."""

    odata_id: str = Field(alias="@odata.id")
    collection_type: str = Field(exclude=True)
    Name: str
    Description: str | None = None
    Members: list[Ref]

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"@odata.type": f"#{self.collection_type}.{self.collection_type}"}
        body.update(self.model_dump(by_alias=True, exclude_none=True))
        body["Members@odata.count"] = len(self.Members)
        return body


# --- service root and services -----------------------------------------------------------------


class _Service(Resource):
    """Common to the services (SessionService, AccountService, TaskService, EventService,
    CompositionService): their status, and that they are enabled."""

    Status: Status
    ServiceEnabled: bool = True


class ExpandQuery(_Obj):
    ExpandAll: bool = False
    Levels: bool = False
    Links: bool = False
    NoLinks: bool = False
    #: shall be present when Levels is true (ServiceRoot CSDL)
    MaxLevels: int | None = None


_ExpandQuery = ExpandQuery  # the property below shares the type's name


class ProtocolFeaturesSupported(_Obj):
    ExpandQuery: _ExpandQuery = Field(default_factory=_ExpandQuery)
    FilterQuery: bool = False
    SelectQuery: bool = False
    OnlyMemberQuery: bool = False
    ExcerptQuery: bool = False
    MultipleHTTPRequests: bool = True


class ServiceRootLinks(_Obj):
    Sessions: Ref


class ServiceRoot(Resource):
    ODATA_TYPE = "ServiceRoot.v1_20_0.ServiceRoot"
    RedfishVersion: str
    UUID: str
    Vendor: str
    Product: str
    ProtocolFeaturesSupported: ProtocolFeaturesSupported
    # Systems, Fabrics and CompositionService are absent from an expansion enclosure's service
    # (behaviour.resourceBlocks "root-only"), which lists its blocks in ResourceBlocks (1.5) instead.
    Systems: Ref | None = None
    Chassis: Ref
    Fabrics: Ref | None = None
    Managers: Ref
    CompositionService: Ref | None = None
    ResourceBlocks: Ref | None = None
    SessionService: Ref
    AccountService: Ref
    Tasks: Ref
    EventService: Ref
    Registries: Ref
    Links: ServiceRootLinks


class SessionService(_Service):
    ODATA_TYPE = "SessionService.v1_2_0.SessionService"
    SessionTimeout: int
    Sessions: Ref


class Session(Resource):
    ODATA_TYPE = "Session.v1_8_0.Session"
    UserName: str
    SessionType: str = "Redfish"
    CreatedTime: str
    ClientOriginIPAddress: str | None = None


class AccountService(_Service):
    ODATA_TYPE = "AccountService.v1_18_1.AccountService"
    MinPasswordLength: int
    Accounts: Ref
    Roles: Ref


class ManagerAccountLinks(_Obj):
    Role: Ref


class ManagerAccount(Resource):
    ODATA_TYPE = "ManagerAccount.v1_14_1.ManagerAccount"
    Enabled: bool = True
    UserName: str
    RoleId: str
    Locked: bool = False
    AccountTypes: list[str]
    Links: ManagerAccountLinks


class Role(Resource):
    ODATA_TYPE = "Role.v1_3_3.Role"
    RoleId: str
    IsPredefined: bool = True
    AssignedPrivileges: list[str]


class TaskService(_Service):
    ODATA_TYPE = "TaskService.v1_3_0.TaskService"
    CompletedTaskOverWritePolicy: str = "Oldest"
    LifeCycleEventOnTaskStateChange: bool = True
    Tasks: Ref


class TaskPayload(_Obj):
    HttpOperation: str
    TargetUri: str
    #: absent for a request without a body (a DELETE): a service omits what it has not
    JsonBody: str | None = None
    HttpHeaders: list[str] = Field(default_factory=list)


class Task(Resource):
    ODATA_TYPE = "Task.v1_7_4.Task"
    TaskState: str
    TaskStatus: str
    StartTime: str
    EndTime: str | None = None
    PercentComplete: int
    TaskMonitor: str
    HidePayload: bool = False
    Payload: TaskPayload
    Messages: list[dict[str, Any]]


class SSEFilterPropertiesSupported(_Obj):
    MessageId: bool = True
    OriginResource: bool = True
    RegistryPrefix: bool = True
    ResourceType: bool = True
    EventFormatType: bool = False
    MetricReportDefinition: bool = False
    SubordinateResources: bool = False


class EventService(_Service):
    ODATA_TYPE = "EventService.v1_12_0.EventService"
    # push delivery settings: left out by a service that only streams (SSE)
    DeliveryRetryAttempts: int | None = None
    DeliveryRetryIntervalSeconds: int | None = None
    ServerSentEventUri: str
    SSEFilterPropertiesSupported: SSEFilterPropertiesSupported
    RegistryPrefixes: list[str]
    ResourceTypes: list[str]
    Subscriptions: Ref


class EventRecord(_Obj):
    MemberId: str
    EventId: str
    EventTimestamp: str
    MessageId: str
    Message: str
    MessageArgs: list[str]
    MessageSeverity: str
    OriginOfCondition: Ref | None = None


class Event(Typed):
    """An event as Server-Sent Events deliver it: no URI of its own."""

    ODATA_TYPE = "Event.v1_13_0.Event"
    Id: str
    Name: str
    Events: list[EventRecord]


class RegistryLocation(_Obj):
    Language: str = "en"
    PublicationUri: str


class MessageRegistryFile(Resource):
    ODATA_TYPE = "MessageRegistryFile.v1_1_5.MessageRegistryFile"
    Languages: list[str]
    Registry: str
    Location: list[RegistryLocation]


class ManagerLinks(_Obj):
    ManagerForChassis: list[Ref] = Field(default_factory=list)
    ManagerForSwitches: list[Ref] = Field(default_factory=list)
    ManagerForServers: list[Ref] = Field(default_factory=list)


class Manager(Resource):
    ODATA_TYPE = "Manager.v1_24_0.Manager"
    ManagerType: str
    UUID: str
    Model: str
    FirmwareVersion: str
    ServiceEntryPointUUID: str
    Status: Status
    Links: ManagerLinks


# --- systems -------------------------------------------------------------------------------


class ProcessorSummary(_Obj):
    Count: int


class Composition(_Obj):
    UseCases: list[str]


class ComputerSystemLinks(_Obj):
    ResourceBlocks: list[Ref]
    Endpoints: list[Ref]
    ManagedBy: list[Ref]
    Chassis: list[Ref] | None = None


class ComputerSystem(Resource):
    ODATA_TYPE = "ComputerSystem.v1_27_0.ComputerSystem"
    SystemType: str = "Physical"
    UUID: str
    HostName: str
    PowerState: str = "On"
    Status: Status
    Composition: Composition
    ProcessorSummary: ProcessorSummary
    Processors: Ref
    MemoryDomains: Ref
    PCIeDevices: list[Ref]
    PCIeFunctions: list[Ref]
    Links: ComputerSystemLinks
    #: absent where composition is a PATCH of Links.ResourceBlocks (behaviour.composition "patch")
    Actions: dict[str, Action] | None = None


# --- chassis and the pooled hardware --------------------------------------------------------


class _Product(Resource):
    """Common to a pooled device's own resources (PCIeDevice, Drive, NetworkAdapter): what it is."""

    Manufacturer: str
    Model: str
    SerialNumber: str


class ChassisLinks(_Obj):
    ManagedBy: list[Ref]
    Switches: list[Ref] | None = None
    ResourceBlocks: list[Ref] | None = None


class Chassis(Resource):
    ODATA_TYPE = "Chassis.v1_28_0.Chassis"
    ChassisType: str
    Manufacturer: str | None = None
    Model: str | None = None
    SerialNumber: str | None = None
    PowerState: str = "On"
    Status: Status
    PCIeDevices: Ref | None = None
    Processors: Ref | None = None
    Drives: Ref | None = None
    NetworkAdapters: Ref | None = None
    MemoryDomains: Ref | None = None
    Links: ChassisLinks


class PCIeInterface(_Obj):
    PCIeType: str
    MaxPCIeType: str
    LanesInUse: int
    MaxLanes: int


class CXLDevice(_Obj):
    DeviceType: str = "Type3"
    CurrentProtocolVersion: str = "CXL2_0"
    CapableProtocolVersions: list[str] = Field(default_factory=lambda: ["CXL1_1", "CXL2_0"])
    MaxNumberLogicalDevices: int = 1


_CXLDevice = CXLDevice  # the PCIeDevice property shares the type's name


class PCIeDeviceLinks(_Obj):
    Chassis: list[Ref]
    Switch: Ref | None = None
    Processors: list[Ref] = Field(default_factory=list)


class PCIeDevice(_Product):
    ODATA_TYPE = "PCIeDevice.v1_21_0.PCIeDevice"
    #: Resource.Oem: ``{"FabricDRA": {"PartitionTable": {...}}}`` on a partitionable GPU
    Oem: dict[str, Any] | None = None
    UUID: str | None = None
    FirmwareVersion: str | None = None
    DeviceType: str = "SingleFunction"
    Status: Status
    PCIeInterface: PCIeInterface
    PCIeFunctions: Ref
    CXLDevice: _CXLDevice | None = None
    CXLLogicalDevices: Ref | None = None
    Links: PCIeDeviceLinks


class PCIeFunctionLinks(_Obj):
    PCIeDevice: Ref
    Processor: Ref | None = None
    Drives: list[Ref] | None = None
    CXLLogicalDevice: Ref | None = None
    MemoryDomains: list[Ref] | None = None


class PCIeFunction(Resource):
    ODATA_TYPE = "PCIeFunction.v1_7_0.PCIeFunction"
    FunctionId: int = 0
    FunctionType: str = "Physical"
    FunctionProtocol: str
    DeviceClass: str
    VendorId: str
    DeviceId: str
    SubsystemVendorId: str
    SubsystemId: str
    ClassCode: str
    RevisionId: str
    Status: Status
    Links: PCIeFunctionLinks


class ProcessorMemory(_Obj):
    MemoryType: str | None = None
    CapacityMiB: int


_ProcessorMemory = ProcessorMemory  # the Processor property shares the type's name


class ProcessorLinks(_Obj):
    Chassis: Ref | None = None
    PCIeDevice: Ref | None = None
    PCIeFunctions: list[Ref] | None = None
    Endpoints: list[Ref] | None = None


class Processor(Resource):
    ODATA_TYPE = "Processor.v1_22_0.Processor"
    ProcessorType: str
    Manufacturer: str
    Model: str
    SerialNumber: str | None = None
    UUID: str | None = None
    Status: Status
    ProcessorMemory: list[_ProcessorMemory] | None = None
    Links: ProcessorLinks
    Actions: dict[str, Action] | None = None


class DriveLinks(_Obj):
    Chassis: Ref
    PCIeFunctions: list[Ref]
    Endpoints: list[Ref] = Field(default_factory=list)


class Drive(_Product):
    ODATA_TYPE = "Drive.v1_22_0.Drive"
    CapacityBytes: int | None = None
    MediaType: str = "SSD"
    Protocol: str = "NVMe"
    Status: Status
    Links: DriveLinks
    Actions: dict[str, Action] | None = None


class ControllerLinks(_Obj):
    PCIeDevices: list[Ref]


class Controller(_Obj):
    PCIeInterface: PCIeInterface
    Links: ControllerLinks


class NetworkAdapter(_Product):
    ODATA_TYPE = "NetworkAdapter.v1_14_0.NetworkAdapter"
    Status: Status
    Controllers: list[Controller]


class NetworkInterfaceLinks(_Obj):
    NetworkAdapter: Ref


class NetworkInterface(Resource):
    ODATA_TYPE = "NetworkInterface.v1_2_3.NetworkInterface"
    Status: Status
    Links: NetworkInterfaceLinks


class CXLLogicalDeviceLinks(_Obj):
    PCIeFunctions: list[Ref]
    MemoryDomains: list[Ref]
    MemoryChunks: list[Ref]
    Endpoints: list[Ref]


class CXLLogicalDevice(Resource):
    ODATA_TYPE = "CXLLogicalDevice.v1_3_0.CXLLogicalDevice"
    Status: Status
    Identifiers: list[Identifier]
    SemanticsSupported: list[str]
    MemorySizeMiB: int
    Links: CXLLogicalDeviceLinks


class MemoryDomainLinks(_Obj):
    CXLLogicalDevices: list[Ref] = Field(default_factory=list)
    PCIeFunctions: list[Ref] = Field(default_factory=list)


class MemoryDomain(Resource):
    ODATA_TYPE = "MemoryDomain.v1_5_1.MemoryDomain"
    Status: Status
    MemoryChunks: Ref
    AllowsMemoryChunkCreation: bool = False
    #: a domain that allows chunk creation: the smallest chunk, and the step above it (v1_5_0)
    MinMemoryChunkSizeMiB: int | None = None
    MemoryChunkIncrementMiB: int | None = None
    MemorySizeMiB: int | None = None
    Links: MemoryDomainLinks | None = None


class MemoryChunksLinks(_Obj):
    CXLLogicalDevices: list[Ref] = Field(default_factory=list)
    Endpoints: list[Ref] = Field(default_factory=list)


class MemoryChunks(Resource):
    ODATA_TYPE = "MemoryChunks.v1_6_2.MemoryChunks"
    Status: Status
    MemoryChunkSizeMiB: int
    AddressRangeOffsetMiB: int
    AddressRangeType: str = "Volatile"
    MediaLocation: str
    RequestedOperationalState: str = "Online"
    Links: MemoryChunksLinks


# --- fabrics -------------------------------------------------------------------------------


class FabricLinks(_Obj):
    ManagedBy: list[Ref]


class Fabric(Resource):
    ODATA_TYPE = "Fabric.v1_4_0.Fabric"
    FabricType: str
    Status: Status
    Switches: Ref
    Endpoints: Ref
    Zones: Ref | None = None
    Connections: Ref | None = None
    Links: FabricLinks


class SwitchLinks(_Obj):
    Chassis: Ref
    ManagedBy: list[Ref]
    Endpoints: list[Ref] = Field(default_factory=list)


class Switch(Resource):
    ODATA_TYPE = "Switch.v1_11_0.Switch"
    SwitchType: str
    Manufacturer: str
    Model: str
    IsManaged: bool = True
    Enabled: bool = True
    PowerState: str = "On"
    Status: Status
    Ports: Ref
    Links: SwitchLinks


class PortLinks(_Obj):
    AssociatedEndpoints: list[Ref]
    #: an InterswitchPort's peer (Port v1_0_0 Links, still so in v1_18_0): the switch and the
    #: switch port at the other end of the cable; left out where no link is detected (NoLink)
    ConnectedSwitches: list[Ref] | None = None
    ConnectedSwitchPorts: list[Ref] | None = None


class Port(Resource):
    ODATA_TYPE = "Port.v1_18_0.Port"
    PortId: str
    PortProtocol: str
    PortType: str
    CurrentSpeedGbps: float | None = None
    Width: int | None = None
    LinkState: str = "Enabled"
    LinkStatus: str
    InterfaceEnabled: bool = True
    Status: Status
    #: a downstream port's PortMetrics (its PCIe error counters)
    Metrics: Ref | None = None
    Links: PortLinks


class PCIeErrorCounts(_Obj):
    """PCIeDevice.v1_8_0 PCIeErrors."""

    CorrectableErrorCount: int = 0
    NonFatalErrorCount: int = 0
    FatalErrorCount: int = 0
    L0ToRecoveryCount: int = 0
    ReplayCount: int = 0
    ReplayRolloverCount: int = 0
    NAKSentCount: int = 0
    NAKReceivedCount: int = 0


class PortMetrics(Resource):
    ODATA_TYPE = "PortMetrics.v1_3_0.PortMetrics"
    PCIeErrors: PCIeErrorCounts


class PciId(_Obj):
    VendorId: str
    DeviceId: str
    SubsystemVendorId: str
    SubsystemId: str
    ClassCode: str
    FunctionNumber: int = 0


class ConnectedEntity(_Obj):
    EntityType: str
    EntityRole: str
    EntityLink: Ref | None = None
    EntityPciId: PciId | None = None
    Identifiers: list[Identifier] | None = None


class EndpointLinks(_Obj):
    ConnectedPorts: list[Ref]
    #: None: not sent (a service that omits them)
    Zones: list[Ref] | None = Field(default_factory=list)
    Connections: list[Ref] | None = Field(default_factory=list)


class Endpoint(Resource):
    ODATA_TYPE = "Endpoint.v1_8_2.Endpoint"
    EndpointProtocol: str
    Status: Status
    ConnectedEntities: list[ConnectedEntity]
    Identifiers: list[Identifier] | None = None
    Links: EndpointLinks


class ZoneLinks(_Obj):
    Endpoints: list[Ref] | None = None
    ResourceBlocks: list[Ref] | None = None
    InvolvedSwitches: list[Ref] | None = None


class Zone(Resource):
    ODATA_TYPE = "Zone.v1_6_3.Zone"
    ZoneType: str
    Status: Status
    Links: ZoneLinks
    Actions: dict[str, Action] | None = None


class MemoryChunkInfo(_Obj):
    AccessCapabilities: list[str]
    AccessState: str = "Optimized"
    MemoryChunk: Ref


class ConnectionLinks(_Obj):
    InitiatorEndpoints: list[Ref]
    TargetEndpoints: list[Ref]


class Connection(Resource):
    ODATA_TYPE = "Connection.v1_4_0.Connection"
    ConnectionType: str
    Status: Status
    MemoryChunkInfo: list[MemoryChunkInfo]
    Links: ConnectionLinks


# --- composition ---------------------------------------------------------------------------


class CompositionService(_Service):
    ODATA_TYPE = "CompositionService.v1_2_3.CompositionService"
    AllowOverprovisioning: bool = False
    AllowZoneAffinity: bool = True
    ResourceBlocks: Ref
    ResourceZones: Ref


class CompositionStatus(_Obj):
    CompositionState: str
    Reserved: bool = False
    SharingCapable: bool = False
    MaxCompositions: int = 1
    NumberOfCompositions: int


class ResourceBlockLinks(_Obj):
    ComputerSystems: list[Ref]
    Chassis: list[Ref]
    Zones: list[Ref]


class ResourceBlock(Resource):
    ODATA_TYPE = "ResourceBlock.v1_4_3.ResourceBlock"
    ResourceBlockType: list[str]
    Status: Status
    CompositionStatus: CompositionStatus
    Processors: list[Ref] = Field(default_factory=list)
    Drives: list[Ref] = Field(default_factory=list)
    NetworkInterfaces: list[Ref] = Field(default_factory=list)
    Storage: list[Ref] | None = None
    Links: ResourceBlockLinks


class StorageLinks(_Obj):
    Enclosures: list[Ref]


class Storage(Resource):
    """A storage subsystem inside a resource block (behaviour.storageBlocks "storage")."""

    ODATA_TYPE = "Storage.v1_21_0.Storage"
    Status: Status
    Drives: list[Ref]
    Links: StorageLinks


#: Every resource class; ``$metadata`` references the schema of each.
ALL_TYPES: tuple[type[Typed], ...] = (
    ServiceRoot,
    SessionService,
    Session,
    AccountService,
    ManagerAccount,
    Role,
    TaskService,
    Task,
    EventService,
    Event,
    MessageRegistryFile,
    Manager,
    ComputerSystem,
    Chassis,
    PCIeDevice,
    PCIeFunction,
    Processor,
    Drive,
    NetworkAdapter,
    NetworkInterface,
    CXLLogicalDevice,
    MemoryDomain,
    MemoryChunks,
    Fabric,
    Switch,
    Port,
    Endpoint,
    Zone,
    Connection,
    CompositionService,
    ResourceBlock,
    Storage,
)
