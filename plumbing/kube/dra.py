"""Typed views of the ``resource.k8s.io`` objects fabric-dra reads (``v1``, also ``v1beta1``/``v1beta2``).

Only the fields fabric-dra acts on are declared; everything else is ignored on read, so the
same model reads the objects of every served version (the allocation result has the same
shape in ``v1beta1``, ``v1beta2`` and ``v1``). Field names follow ``k8s.io/api/resource/v1``.

Reading is lenient where an odd claim must not stop the reader: an entry of a list
(``results``, ``reservedFor``, ``devices``, ``conditions``) that is not well formed is left
out, and a list that is ``null`` reads as empty — the claim itself still reads, with what is
well formed in it. :meth:`ResourceClaim.read` returns None for an object that is not a claim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

__all__ = [
    "AllocatedDeviceStatus",
    "AllocationResult",
    "Condition",
    "DeviceRequestAllocationResult",
    "ObjectMeta",
    "ResourceClaim",
    "ResourceClaimConsumerReference",
    "ResourceClaimStatus",
    "allocated_node",
    "is_allocated",
    "merge_conditions",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


def _keep_well_formed(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A list reads whole when it can (the fast path); else entry by entry, dropping what does not
    read; ``null`` or a non-list reads as empty."""
    if value is None:
        return []
    try:
        return handler(value)
    except ValidationError:
        if not isinstance(value, list):
            return []
    kept: list[Any] = []
    for item in value:
        with contextlib.suppress(ValidationError):
            kept.extend(handler([item]))
    return kept


_WellFormed = WrapValidator(_keep_well_formed)


def allocated_node(selector: Mapping[str, Any] | None) -> str | None:
    """The node of a ``bindsToNode`` allocation's ``nodeSelector`` — one term, one ``matchFields``
    requirement ``metadata.name In [node]`` (what the scheduler writes); None for anything else,
    e.g. the label selector of a plain allocation."""
    terms = (selector or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1 or not isinstance(terms[0], Mapping):
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) != 1 or terms[0].get("matchExpressions") or not isinstance(fields[0], Mapping):
        return None
    field = fields[0]
    values = field.get("values") or []
    if field.get("key") != "metadata.name" or field.get("operator") != "In" or len(values) != 1:
        return None
    return str(values[0])


#: a condition's type → (status, reason, message)
ConditionChanges = dict[str, tuple[str, str, str]]

#: ``metav1validation``'s longest condition message
_CONDITION_MESSAGE_MAX = 32 * 1024


def merge_conditions(
    current: list[dict[str, Any]], changes: ConditionChanges, generation: Any
) -> list[dict[str, Any]]:
    """``current`` with ``changes`` (type → status, reason, message) applied, as metav1
    conditions: lastTransitionTime moves only when the status does; an unchanged condition
    keeps its stored form exactly, so a no-op makes no write. Conditions of other types (another
    writer's) are kept as they are."""
    merged = [dict(c) for c in current]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for kind, (status, reason, message) in changes.items():
        index = next((i for i, c in enumerate(merged) if c.get("type") == kind), None)
        old = merged[index] if index is not None else None
        condition: dict[str, Any] = {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message[:_CONDITION_MESSAGE_MAX],
            "lastTransitionTime": old["lastTransitionTime"]
            if old and old.get("status") == status and old.get("lastTransitionTime")
            else now,
        }
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
        if old is not None and all(old.get(k) == v for k, v in condition.items()):
            continue
        if index is None:
            merged.append(condition)
        else:
            merged[index] = condition
    return merged


class ObjectMeta(_View):
    name: str = ""
    namespace: str | None = None
    uid: str = ""
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")
    owner_references: list[dict[str, Any]] = Field(default_factory=list, alias="ownerReferences")


class Condition(_View):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    observed_generation: int | None = Field(default=None, alias="observedGeneration")
    last_transition_time: str | None = Field(default=None, alias="lastTransitionTime")


class DeviceRequestAllocationResult(_View):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = Field(default=None, alias="adminAccess")
    binding_conditions: list[str] = Field(default_factory=list, alias="bindingConditions")
    binding_failure_conditions: list[str] = Field(default_factory=list, alias="bindingFailureConditions")
    share_id: str | None = Field(default=None, alias="shareID")
    #: the share of each consumable capacity (``allowMultipleAllocations`` devices), as quantities
    consumed_capacity: dict[str, str] | None = Field(default=None, alias="consumedCapacity")


class _DeviceAllocation(_View):
    results: Annotated[list[DeviceRequestAllocationResult], _WellFormed] = Field(default_factory=list)
    config: list[dict[str, Any]] = Field(default_factory=list)


class AllocationResult(_View):
    devices: _DeviceAllocation = Field(default_factory=_DeviceAllocation)
    node_selector: dict[str, Any] | None = Field(default=None, alias="nodeSelector")
    allocation_timestamp: str | None = Field(default=None, alias="allocationTimestamp")

    @property
    def results(self) -> list[DeviceRequestAllocationResult]:
        return self.devices.results

    @property
    def node(self) -> str | None:
        """The one node of a ``bindsToNode`` allocation (see :func:`allocated_node`)."""
        return allocated_node(self.node_selector)

    @property
    def has_binding_conditions(self) -> bool:
        return any(r.binding_conditions for r in self.devices.results)


class ResourceClaimConsumerReference(_View):
    api_group: str = Field(default="", alias="apiGroup")
    resource: str
    name: str
    uid: str


class AllocatedDeviceStatus(_View):
    driver: str
    pool: str
    device: str
    share_id: str | None = Field(default=None, alias="shareID")
    conditions: Annotated[list[Condition], _WellFormed] = Field(default_factory=list)
    data: Any = None

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def is_true(self, kind: str) -> bool:
        condition = self.condition(kind)
        return condition is not None and condition.status == "True"


def _allocation(value: Any) -> Any:
    """An allocation that is not an object, or an empty one, is no allocation."""
    return value if isinstance(value, Mapping | AllocationResult) and value else None


class ResourceClaimStatus(_View):
    allocation: Annotated[AllocationResult | None, BeforeValidator(_allocation)] = None
    reserved_for: Annotated[list[ResourceClaimConsumerReference], _WellFormed] = Field(
        default_factory=list, alias="reservedFor"
    )
    devices: Annotated[list[AllocatedDeviceStatus], _WellFormed] = Field(default_factory=list)

    def device_status(self, result: DeviceRequestAllocationResult) -> AllocatedDeviceStatus | None:
        """The ``status.devices`` entry of an allocated device: same driver, pool, device and share ID."""
        return next(
            (
                d
                for d in self.devices
                if (d.driver, d.pool, d.device, d.share_id)
                == (result.driver, result.pool, result.device, result.share_id)
            ),
            None,
        )


class ResourceClaim(_View):
    api_version: str = Field(default="resource.k8s.io/v1", alias="apiVersion")
    metadata: ObjectMeta
    spec: dict[str, Any] = Field(default_factory=dict)
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> ResourceClaim | None:
        """The view of ``obj``, or None when it is not a claim at all (no usable metadata)."""
        try:
            return cls.model_validate(obj)
        except ValidationError:
            return None

    @property
    def allocated(self) -> bool:
        return self.status.allocation is not None

    @property
    def results(self) -> list[DeviceRequestAllocationResult]:
        """Every allocation result; none when the claim is not allocated."""
        return self.status.allocation.devices.results if self.status.allocation is not None else []

    def results_for(self, driver: str) -> list[DeviceRequestAllocationResult]:
        """The allocation results that belong to ``driver`` (a claim may mix drivers)."""
        return [r for r in self.results if r.driver == driver]

    def drivers(self) -> list[str]:
        """The drivers of the allocation, in order of first appearance (the kubelet calls each)."""
        return list(dict.fromkeys(r.driver for r in self.results if r.driver))

    def reserved_for_uid(self, uid: str) -> bool:
        return any(r.uid == uid for r in self.status.reserved_for)


def is_allocated(obj: Mapping[str, Any]) -> bool:
    """Whether the claim object ``obj`` carries an allocation."""
    claim = ResourceClaim.read(obj)
    return claim is not None and claim.allocated
