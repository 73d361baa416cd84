"""The fabric manager's REST API (``/api/v1``): request and response bodies.

These models are the contract between the manager (:mod:`fabric.manager`) and its clients —
the kubelet plugin, the ResourceSlice publisher and ``fabric-dra status``. JSON uses
camelCase, as Kubernetes does.

Endpoints (all JSON; ``Authorization: Bearer <token>``):

=======  ==========================================  =====================================================
GET      /api/v1/inventory?after=V&timeoutSeconds=T   :class:`Inventory`; with ``after``, waits (long poll)
                                                      until the inventory version exceeds V or T passes
GET      /api/v1/devices                              ``list[Device]``
GET      /api/v1/devices/{device}                     :class:`Device` (404 DeviceNotFound)
GET      /api/v1/nodes                                ``list[FabricNode]``
POST     /api/v1/attachments?waitSeconds=W            body :class:`AttachRequest` → :class:`Attachment`;
                                                      200 when attached, 202 while attaching (poll the
                                                      operation or POST again: idempotent per claim+device)
DELETE   /api/v1/attachments/{device}?claimUid=C&node=N&waitSeconds=W[&shareId=S]
                                                      → :class:`Attachment` with state ``detached`` (200)
                                                      or ``detaching`` (202); a device not held by C is a
                                                      no-op success (idempotent); a partition is named
                                                      by its partition device, a pool's share by S
GET      /api/v1/operations/{id}                      :class:`Operation`
GET      /api/v1/operations                           ``list[Operation]`` in flight and recent
PUT      /api/v1/nodes/{node}/claims                  body :class:`NodeClaims`: the claims the node's plugin
                                                      has prepared (204); the orphan reconciler never
                                                      detaches what a plugin reports
GET      /api/v1/usage?since=T&by=K[&label=L]         :class:`UsageReport`: device-seconds since T (RFC 3339;
                                                      from the start of its hour) grouped by K
                                                      (namespace, model, workload, or label: the
                                                      values of the attribution label key L)
GET      /api/v1/usage/focus?since=T[&until=U]        ``text/csv``: the same seconds as a FOCUS 1.0 cost
                                                      and usage dataset (one row per hour, model,
                                                      namespace, labels and measure; header only when
                                                      nothing was counted)
GET      /api/v1/drains                               :class:`DrainList`: every drain, with the devices it
                                                      covers now
POST     /api/v1/drains                               body :class:`DrainRequest` → :class:`DrainAnswer`
                                                      (201 new or changed, 200 already so); 404 for a
                                                      device, switch or node the fabric does not have
DELETE   /api/v1/drains?target=T&name=N               → :class:`DrainAnswer` (200; ``changed`` false when
                                                      it was not drained)
=======  ==========================================  =====================================================

Errors are :class:`ErrorBody` with the status of :mod:`manager_api.errors`.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict
from pydantic_core import CoreSchema, core_schema

from manager_api.devices import (
    BindingStyle,
    DeviceAttributes,
    DeviceIdentity,
    DeviceType,
    Health,
    spoken_list,
)
from manager_api.partitions import PartitionTable
from plumbing.names import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DNS1123_SUBDOMAIN_PATTERN,
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_PATTERN,
    UID_MAX_LENGTH,
    UID_PATTERN,
)
from plumbing.terminal import visible

__all__ = [
    "API_PREFIX",
    "DRAIN_NAME_MAX_LENGTH",
    "DRAIN_NAME_PATTERN",
    "MAX_WAIT_SECONDS",
    "POOL_NAME_MAX_LENGTH",
    "POOL_NAME_PATTERN",
    "USAGE_MEMORY_GIB",
    "USAGE_PARTITION",
    "USAGE_STATES",
    "AttachRequest",
    "Attachment",
    "AttachmentState",
    "BindingState",
    "BindingStyle",
    "BudgetLimitUse",
    "BudgetList",
    "BudgetTreeUse",
    "BudgetUse",
    "ClaimUid",
    "Device",
    "DeviceDrain",
    "DeviceName",
    "DeviceType",
    "Drain",
    "DrainAnswer",
    "DrainEffect",
    "DrainList",
    "DrainRequest",
    "DrainTarget",
    "ErrorBody",
    "FabricNode",
    "FabricPool",
    "Health",
    "Inventory",
    "InventoryChanges",
    "NamespaceName",
    "NodeClaims",
    "NodeName",
    "Operation",
    "OperationId",
    "OperationKind",
    "OperationState",
    "OrphanedTreeClaim",
    "OrphanedTreeClaims",
    "PoolName",
    "PreparedClaim",
    "ReachGroup",
    "ResetOutcome",
    "ResetReport",
    "UsageGroup",
    "UsageGrouping",
    "UsageReport",
    "parse_rfc3339",
]

API_PREFIX = "/api/v1"
#: The longest a request may wait for a fabric operation before getting 202; below the
#: kubelet's 45 s gRPC deadline so a plugin can always answer in time.
MAX_WAIT_SECONDS = 40.0


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class BindingState(StrEnum):
    FREE = "free"
    ATTACHING = "attaching"
    BOUND = "bound"
    DETACHING = "detaching"
    #: bound to a node with no claim, ready for the next claim there (the manager's warm pool)
    WARM = "warm"
    #: the fabric reports the device absent/disabled, or it is bound in a way fabric-dra cannot undo
    UNAVAILABLE = "unavailable"


class _WireString:
    """A binding style as the API has always carried it: a plain string (no enum in the OpenAPI
    document that a generated client would hold every answer to), read into :class:`BindingStyle`;
    "" is a device that left the fabric."""

    @staticmethod
    def _read(value: object) -> BindingStyle | Literal[""]:
        if value == "":
            return ""
        if not isinstance(value, str):
            raise ValueError(f"a binding style is a string, not {type(value).__name__}")
        return BindingStyle(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: object, handler: GetCoreSchemaHandler) -> CoreSchema:
        # The enum's own schema is not asked for (``handler`` unused): it would add a component.
        return core_schema.no_info_plain_validator_function(
            cls._read,
            serialization=core_schema.plain_serializer_function_ser_schema(
                str, return_schema=core_schema.str_schema()
            ),
        )


if TYPE_CHECKING:
    WireBindingStyle: TypeAlias = BindingStyle | Literal[""]
else:
    # At run time the annotation names no enum: FastAPI makes a component schema of every enum a
    # field's annotation names, and the API's document has always had none for binding styles.
    WireBindingStyle = Annotated[str, _WireString, WithJsonSchema({"type": "string"})]


class PartitionHolder(_Model):
    """One partition of a GPU in use: the GPU is bound to ``node`` for as long as any holder is."""

    partition: str = Field(description="the partition's device name, e.g. gpu0-1g10gb-3")
    claim_uid: str
    node: str


#: An allocation's ``shareID`` (resource.k8s.io/v1 ``DeviceRequestAllocationResult.ShareID``): a
#: lowercase UUID, which ``validateDeviceRequestAllocationResult`` requires in its normalized form.
SHARE_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
ShareId = Annotated[
    str, Field(pattern=SHARE_ID_PATTERN, max_length=36, description="the allocation's shareID")
]


class MemoryShare(_Model):
    """One share of a memory pool: a chunk carved for one allocation (claim and shareID) and
    connected to one node."""

    share_id: str
    claim_uid: str
    node: str
    memory_bytes: int = Field(ge=0, description="the chunk's size: the allocation's consumedCapacity")
    state: BindingState = BindingState.BOUND
    chunk: str | None = Field(default=None, description="@odata.id of the MemoryChunks member, once made")
    connection: str | None = Field(default=None, description="@odata.id of the memory Connection, once made")


class MemoryPool(_Model):
    """A Redfish MemoryDomain that makes chunks on demand (``AllowsMemoryChunkCreation``): its device
    is shared by size (DRA consumable capacity) instead of bound whole."""

    size_bytes: int = Field(ge=0, description="the domain's MemorySizeMiB in bytes")
    outside_bytes: int = Field(
        default=0, ge=0, description="carved by chunks fabric-dra did not make (never offered)"
    )
    min_chunk_bytes: int = Field(gt=0, description="MinMemoryChunkSizeMiB in bytes")
    increment_bytes: int = Field(gt=0, description="MemoryChunkIncrementMiB in bytes")
    max_chunks: int | None = Field(default=None, description="the most chunks the domain makes, if it says")
    shares: list[MemoryShare] = Field(default_factory=list, description="this manager's shares of the pool")
    used_bytes: int = Field(
        default=0,
        ge=0,
        description="carved: outsideBytes plus every share's chunk as the pool rounds it (what the "
        "manager admits a new share against); free is sizeBytes less this",
    )


class DrainTarget(StrEnum):
    """What an operator drains: one device, every device behind a switch, or every device a node
    holds through its fabric ports (docs/operations.md, "Drains")."""

    DEVICE = "device"
    SWITCH = "switch"
    NODE = "node"


class DrainEffect(StrEnum):
    """The effect of a drained device's taint (resource.k8s.io/v1 ``DeviceTaintEffect``)."""

    #: no new allocation; claims that hold the device keep it until they end
    NO_SCHEDULE = "NoSchedule"
    #: also evicts the pods using the device (kube-controller-manager's device taint eviction)
    NO_EXECUTE = "NoExecute"


class DeviceDrain(_Model):
    """Why a device is drained: the drains that cover it, and the taint the controller publishes."""

    reason: str = Field(description="the taint's value: the reason of the drain with the strongest effect")
    effect: DrainEffect = Field(description="NoExecute when any drain covering the device evicts")
    since: datetime = Field(description="when the first drain covering it began")
    drains: list[str] = Field(description="every drain covering the device, as target/name")


class Device(DeviceAttributes, DeviceIdentity):
    """One allocatable unit of a fabric: a PCIe device, or one memory chunk of a CXL device."""

    # Its fields are DeviceIdentity's, then the table of device attributes (DeviceAttributes),
    # then these: who holds it and how it is bound. (The docstring is the OpenAPI description.)
    # The API model stays mutable, as it always was; discovery's records of attributes are frozen.
    model_config = ConfigDict(frozen=False)

    state: BindingState = BindingState.FREE
    node: str | None = Field(default=None, description="Kubernetes node it is bound (or being bound) to")
    host: str | None = Field(
        default=None, description="Redfish ComputerSystem Id it is bound to (also when that host is no node)"
    )
    holders: list[str] = Field(
        default_factory=list,
        description="every Redfish ComputerSystem Id the fabric binds it to now: more than one for a "
        "resource block composed into several systems, which is never offered",
    )
    claim_uid: str | None = Field(
        default=None, description="the claim that holds it, when fabric-dra bound it"
    )
    managed: bool = Field(default=True, description="False when bound outside fabric-dra: never touched")
    binding_style: WireBindingStyle = Field(description=spoken_list([s.value for s in BindingStyle]))
    redfish_uri: str = Field(description="@odata.id of the fabric resource that represents the device")
    # The controller quarantines a device from these in the plain flow, where the attach happens
    # at prepare time and only the manager sees every attempt (docs/controller.md).
    attach_failures: int = Field(
        default=0, ge=0, description="attaches of the device that failed in a row; a successful one resets it"
    )
    attach_error: str | None = Field(
        default=None, description="error code of the latest failed attach, while attach_failures > 0"
    )
    reach: str | None = Field(
        default=None,
        description="the reach group of its pool (FabricPool.reachGroups) whose nodes alone can reach it; "
        "None: every node of the pool reaches it",
    )
    partition_table: PartitionTable | None = Field(
        default=None,
        description="a GPU that can be split into partitions (manager_api.partitions): its profiles",
    )
    partitions: list[PartitionHolder] = Field(
        default_factory=list,
        description="partitions in use: the GPU is bound to their node while any is (one GPU, one node)",
    )
    memory_pool: MemoryPool | None = Field(
        default=None, description="a CXL memory pool shared by size; None for a device bound whole"
    )
    drain: DeviceDrain | None = Field(
        default=None, description="set while an operator drains the device (POST /api/v1/drains)"
    )


class FabricNode(_Model):
    """A Kubernetes node that a fabric can reach, and the Redfish host behind it."""

    name: str
    host: str = Field(description="Redfish ComputerSystem Id")
    system_uuid: str | None = None
    fabrics: list[str] = Field(default_factory=list)
    pools: list[str] = Field(default_factory=list)


class ReachGroup(_Model):
    """Devices of a pool that only some of the pool's nodes reach (a switch cabled to some hosts)."""

    id: str = Field(description="stable while the fabric's cabling is: a hash of the reaching hosts")
    nodes: list[str] = Field(description="the Kubernetes nodes that reach the group's devices")


class FabricPool(_Model):
    pool: str
    fabric: str
    nodes: list[str] = Field(description="Kubernetes nodes the fabric can reach")
    reach_groups: list[ReachGroup] = Field(
        default_factory=list, description="devices reached by a subset of nodes only, by Device.reach"
    )


class Inventory(_Model):
    version: int = Field(description="increases whenever a device, binding, health or node changes")
    pools: list[FabricPool]
    devices: list[Device]
    nodes: list[FabricNode]
    notices: list[str] = Field(
        default_factory=list,
        description="what the fabric has that cannot be offered, and why (devices no host reaches, "
        "hosts that cannot be composed)",
    )
    epoch: int | None = Field(
        default=None,
        description="the manager incarnation ``version`` counts in: pass it with the version to "
        "GET /api/v1/inventory/changes (absent: a manager without the change feed)",
    )


class InventoryChanges(_Model):
    """What changed in the inventory after version ``since``: each device changed or added, as the
    inventory now shows it, and the name of each device removed; the pools, nodes and notices
    whole (they grow with the nodes and fabrics, not with the devices)."""

    epoch: int = Field(description="the manager incarnation the versions count in")
    since: int = Field(description="the version these changes start after")
    version: int = Field(description="the version the changes bring the inventory to")
    node: str | None = Field(
        default=None,
        description="the node the changes were asked for (``node=``): only its devices' changes are "
        "here (absent: every device's, or a manager without the per-node filter)",
    )
    devices: list[Device] = Field(description="devices changed or added since ``since``")
    removed: list[str] = Field(description="names of the devices removed since ``since``")
    pools: list[FabricPool]
    nodes: list[FabricNode]
    notices: list[str] = Field(default_factory=list)


#: A claim's ``metadata.uid``: a Kubernetes UID (UUID form, 36 characters), so that no caller can
#: make a ledger entry, a log line or a URL of any size it likes.
ClaimUid = Annotated[
    str, Field(pattern=UID_PATTERN, max_length=UID_MAX_LENGTH, description="the ResourceClaim's metadata.uid")
]
#: A device's name: a DNS label, as a DRA device name is.
DeviceName = Annotated[str, Field(pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH)]
#: A Kubernetes node's name: a DNS subdomain.
NodeName = Annotated[str, Field(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=DNS1123_SUBDOMAIN_MAX_LENGTH)]
#: A namespace's name: a DNS label (``ValidateNamespaceName`` is ``IsDNS1123Label``).
NamespaceName = Annotated[
    str,
    Field(
        pattern=DNS1123_LABEL_PATTERN,
        max_length=DNS1123_LABEL_MAX_LENGTH,
        description="a Kubernetes namespace",
    ),
]
#: An operation's id, as :class:`fabric.state.operation_log.OperationLog` makes them (``op-`` and hex):
#: a DNS label.
OperationId = Annotated[str, Field(pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH)]

#: resource.k8s.io's ``ResourcePool.Name``: at most 253 characters, DNS subdomains separated by
#: slashes (k8s.io/kubernetes pkg/apis/resource/validation ``validatePoolName``; the controller's
#: ``dra_driver.controller.resourcenames.is_pool_name`` is the same rule, on a floor this one
#: cannot import). A pattern, so the OpenAPI document says it too; each subdomain's own limit of 253
#: is within the whole's.
POOL_NAME_MAX_LENGTH = DNS1123_SUBDOMAIN_MAX_LENGTH
_SUBDOMAIN = DNS1123_SUBDOMAIN_PATTERN.removeprefix("^").removesuffix("$")
POOL_NAME_PATTERN = f"^{_SUBDOMAIN}(/{_SUBDOMAIN})*$"
PoolName = Annotated[str, Field(pattern=POOL_NAME_PATTERN, max_length=POOL_NAME_MAX_LENGTH)]


def _both_or_neither(a: str, b: str) -> JsonDict:
    """JSON Schema: when ``a`` is given (not null), ``b`` must be given too (not null)."""
    return {
        "if": {"required": [a], "properties": {a: {"not": {"type": "null"}}}},
        "then": {"required": [b], "properties": {b: {"not": {"type": "null"}}}},
    }


class AttachRequest(_Model):
    """One device for a claim on a node; a share of a memory pool names both ``shareId`` and
    ``memoryBytes`` (the document says so, so a client that sends one alone learns it from the
    schema, not only from the 422)."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [_both_or_neither("shareId", "memoryBytes"), _both_or_neither("memoryBytes", "shareId")]
        }
    )

    device: DeviceName
    node: NodeName
    claim_uid: ClaimUid
    pool: PoolName | None = Field(
        default=None,
        description="the DRA pool the claim's allocation names for the device; another pool is 404",
    )
    namespace: NamespaceName | None = Field(
        default=None,
        description="the claim's namespace: recorded with the binding (a warm device's last tenant) and "
        "billed its device-seconds. With Kubernetes API access the manager records the claim's own "
        "namespace instead",
    )
    share_id: ShareId | None = Field(
        default=None,
        description="for a share of a memory pool (a device allocated many times): the allocation's "
        "shareID; with memoryBytes",
    )
    memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="for a share of a memory pool: the allocation's consumedCapacity of memory, in bytes",
    )

    @model_validator(mode="after")
    def _a_share_names_both(self) -> AttachRequest:
        if (self.share_id is None) != (self.memory_bytes is None):
            raise ValueError("a share of a memory pool names both shareId and memoryBytes")
        return self


class PreparedClaim(_Model):
    claim_uid: ClaimUid
    devices: list[DeviceName] = Field(max_length=256, description="names of the claim's devices on this node")


class NodeClaims(_Model):
    """What a node's plugin has prepared (its checkpoint's PrepareCompleted claims)."""

    claims: list[PreparedClaim] = Field(max_length=8192)


class AttachmentState(StrEnum):
    ATTACHING = "attaching"
    ATTACHED = "attached"
    DETACHING = "detaching"
    DETACHED = "detached"


class Attachment(_Model):
    device: Device
    node: str
    claim_uid: str
    state: AttachmentState
    operation_id: str | None = None
    partition: str | None = Field(
        default=None,
        description="the partition device the claim holds, when ``device`` is the GPU it is carved from",
    )
    share: MemoryShare | None = Field(
        default=None, description="the claim's share, when ``device`` is a memory pool"
    )
    reset_required: bool = Field(
        default=False,
        description=(
            "the device came from the warm pool after another claim and the node must reset it "
            "(PCIe function-level reset) before the claim uses it, then report it "
            "(POST /api/v1/devices/{device}/reset); answered again until reported"
        ),
    )


class ResetOutcome(StrEnum):
    OK = "ok"
    FAILED = "failed"


class ResetReport(_Model):
    """What a node's plugin reports after resetting a device its claim got ``resetRequired``."""

    node: NodeName
    claim_uid: ClaimUid
    outcome: ResetOutcome
    # Free text from the node (an OS error): kept as one line that shows any control character.
    message: Annotated[str, AfterValidator(visible)] = Field(
        default="", max_length=1024, description="why the reset failed (one line)"
    )


class OperationKind(StrEnum):
    ATTACH = "attach"
    DETACH = "detach"


class OperationState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ErrorBody(_Model):
    code: str = Field(description="the manager_api.errors class name, e.g. DeviceBusy")
    message: str
    device: str | None = None
    node: str | None = None
    held_by: str | None = Field(default=None, description="who holds a busy device (node / claim)")
    retry_after_seconds: float | None = None
    message_id: str | None = Field(default=None, description="Redfish MessageId, when the fabric said so")


class Operation(_Model):
    id: str
    kind: OperationKind
    device: str
    node: str
    claim_uid: str
    state: OperationState
    error: ErrorBody | None = None
    started_at: datetime
    finished_at: datetime | None = None
    redfish_task: str | None = Field(default=None, description="task monitor URI while the fabric works")
    redfish_task_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="the Redfish task's PercentComplete (DMTF Task schema, 0-100) as last read while "
        "polling its monitor; absent until the service reported one",
    )
    redfish_task_percent_at: datetime | None = Field(
        default=None, description="when redfishTaskPercent was read from the service"
    )


#: what a device's seconds are counted as: bound to a claim, warm (bound for the warm pool), being
#: attached or detached, or bound outside fabric-dra (the fields of :class:`UsageGroup`)
USAGE_STATES = ("bound", "warm", "attaching", "detaching", "outside")
#: two measures the accounting keeps beside the device-seconds of :data:`USAGE_STATES`, under these
#: names in its buckets and its lifetime totals: a GPU partition's seconds at its share of the GPU,
#: and a memory share's GiB-seconds (``UsageGroup.partition_seconds``, ``memory_gib_seconds``)
USAGE_PARTITION = "partition"
USAGE_MEMORY_GIB = "memory-gib"


class UsageGrouping(StrEnum):
    NAMESPACE = "namespace"
    MODEL = "model"
    #: the claim's owner, ``namespace/Kind/name``
    WORKLOAD = "workload"
    #: the value of one attribution label key of the claim (``label=KEY``; the manager's
    #: ``--attribution-label``), the top values by device-seconds, the rest as ``other``
    LABEL = "label"


class UsageGroup(_Model):
    """Device-seconds of one namespace, model or workload, by state; and the seconds of its GPU
    partitions at their share of the GPU, and the GiB-seconds of its memory shares."""

    name: str = Field(
        description="the namespace, model or namespace/Kind/name of the workload; empty for devices no "
        "claim holds (warm, outside fabric-dra, or a claim the manager could not read)"
    )
    bound: float = 0.0
    warm: float = 0.0
    attaching: float = 0.0
    detaching: float = 0.0
    outside: float = 0.0
    total: float = Field(default=0.0, description="device-seconds in every state (not the two below)")
    partition_seconds: float = Field(
        default=0.0,
        description="seconds of GPU partitions held by claims, each counted at its share of the GPU "
        "(its memory slices of the GPU's): a 1g.10gb of an 8-slice GPU held for an hour is 450",
    )
    memory_gib_seconds: float = Field(
        default=0.0, description="GiB-seconds of memory shares (chunks of a memory pool) held bound by claims"
    )


class UsageReport(_Model):
    since: datetime = Field(description="the start of the first hour counted (the hour `since` fell in)")
    until: datetime = Field(description="counted up to here")
    by: UsageGrouping
    label: str | None = Field(default=None, description="the label key grouped by, when by is label")
    bucket_seconds: int = Field(description="the accounting's resolution: seconds per bucket")
    oldest: datetime | None = Field(
        default=None, description="the oldest bucket still kept; nothing before it is known any more"
    )
    groups: list[UsageGroup]


#: What a drain names: a device (a DNS label), a switch (its Redfish Id, or ``<pool>/<Id>`` where two
#: fabrics share an Id) or a node (a DNS subdomain); the manager says which ones it does not know.
DRAIN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
DRAIN_NAME_MAX_LENGTH = 253


class DrainRequest(_Model):
    target: DrainTarget
    name: str = Field(pattern=DRAIN_NAME_PATTERN, max_length=DRAIN_NAME_MAX_LENGTH)
    reason: str = Field(
        default="maintenance",
        min_length=1,
        pattern=LABEL_VALUE_PATTERN,
        max_length=LABEL_VALUE_MAX_LENGTH,
        description="the taint's value, so a claim may tolerate one reason: a Kubernetes label value",
    )
    evict: bool = Field(default=False, description="NoExecute: evict the pods using the devices")


class Drain(_Model):
    target: DrainTarget
    name: str
    reason: str
    effect: DrainEffect
    since: datetime
    by: str = Field(description="who drained it (the caller's user name)")
    devices: list[str] = Field(default_factory=list, description="the devices of the inventory it covers now")

    @property
    def key(self) -> str:
        """``target/name``: how a device's :class:`DeviceDrain` names it."""
        return f"{self.target}/{self.name}"


class DrainAnswer(_Model):
    drain: Drain
    changed: bool = Field(description="false when the drain was already so (or, for DELETE, not there)")


class DrainList(_Model):
    drains: list[Drain]


class OrphanedTreeClaim(_Model):
    """A claim whose agent tree's root is gone and which no pod uses (docs/manager.md, "Orphaned agent
    trees")."""

    namespace: str
    name: str
    uid: str
    reason: str = Field(description="root-gone-pods-gone or root-gone-pods-terminating")
    root: str = Field(description="what is gone of the tree: the kind and name of the missing object")
    pods: list[str] = Field(
        default_factory=list, description="the pods the claim is reserved for, and their state"
    )
    since: datetime = Field(description="when this manager first found it so")


class OrphanedTreeClaims(_Model):
    policy: str = Field(description="off, report or release (--orphaned-trees)")
    claims: list[OrphanedTreeClaim]


class BudgetLimitUse(_Model):
    """One limit of a DeviceBudget for one tree: what the tree holds now (in flight included)."""

    limit: str = Field(
        description="devices:<deviceClassName or model>, gpuMemoryBytes, cxlMemoryBytes or deviceHours"
    )
    used: float = Field(description="devices, bytes or device-hours")
    max: float
    known: bool = Field(
        default=True,
        description="false when the manager cannot count it (deviceHours of a tree its accounting "
        "does not attribute by: docs/budgets.md)",
    )


class BudgetTreeUse(_Model):
    tree: str = Field(description="the label value, or the owner chain's root as Kind/name")
    limits: list[BudgetLimitUse]
    last_refused: str | None = Field(
        default=None, description="the last claim refused (namespace/name) and the limit, if any"
    )


class BudgetUse(_Model):
    """A DeviceBudget as the manager enforces it (docs/budgets.md)."""

    namespace: str
    name: str
    enforcement: Literal["Enforce", "Warn"]
    selects: str = Field(description="how the budget names its trees: label KEY[=VALUE] or owner KIND[/NAME]")
    trees: list[BudgetTreeUse]


class BudgetList(_Model):
    budgets: list[BudgetUse]


#: RFC 3339 ``date-time`` (section 5.6) with its zone, as ``GET /usage?since=`` must be (and ``fabric-dra
#: usage --since``): the manager declares the parameter a string of ``format: date-time`` and reads it
#: with :func:`parse_rfc3339`, because a datetime parameter would also take a bare number as seconds
#: since 1970 (pydantic's lax mode), which the format does not allow.
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)[Tt](\d\d:\d\d):(\d\d)(\.\d+)?([Zz]|[+-]\d\d:\d\d)", re.ASCII)


def parse_rfc3339(text: str) -> datetime | None:
    """The time ``text`` names, or None when it is no RFC 3339 date-time with a zone (or names a day
    its month lacks). A leap second is read as the second before it; digits beyond microseconds are
    dropped (Python keeps microseconds)."""
    found = _RFC3339.fullmatch(text)
    if found is None:
        return None
    day, minutes, seconds, fraction, zone = found.groups()
    seconds = "59" if seconds == "60" else seconds
    fraction = (fraction or "")[:7]
    zone = "+00:00" if zone in ("Z", "z") else zone
    try:
        return datetime.fromisoformat(f"{day}T{minutes}:{seconds}{fraction}{zone}")
    except ValueError:
        return None
