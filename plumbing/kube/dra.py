"""Typed views of the ``resource.k8s.io`` objects fabric-dra reads (``v1``, also ``v1beta1``/``v1beta2``).

Only the fields fabric-dra acts on are declared; everything else is ignored on read, so the
same model reads the objects of every served version (the allocation result has the same
shape in ``v1beta1``, ``v1beta2`` and ``v1``). Field names follow ``k8s.io/api/resource/v1``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AllocatedDeviceStatus",
    "AllocationResult",
    "Condition",
    "DeviceRequestAllocationResult",
    "ObjectMeta",
    "ResourceClaim",
    "ResourceClaimConsumerReference",
    "ResourceClaimStatus",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


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


class _DeviceAllocation(_View):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=list)
    config: list[dict[str, Any]] = Field(default_factory=list)


class AllocationResult(_View):
    devices: _DeviceAllocation = Field(default_factory=_DeviceAllocation)
    node_selector: dict[str, Any] | None = Field(default=None, alias="nodeSelector")
    allocation_timestamp: str | None = Field(default=None, alias="allocationTimestamp")


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
    conditions: list[Condition] = Field(default_factory=list)
    data: Any = None


class ResourceClaimStatus(_View):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] = Field(default_factory=list, alias="reservedFor")
    devices: list[AllocatedDeviceStatus] = Field(default_factory=list)


class ResourceClaim(_View):
    api_version: str = Field(default="resource.k8s.io/v1", alias="apiVersion")
    metadata: ObjectMeta
    spec: dict[str, Any] = Field(default_factory=dict)
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)

    def results_for(self, driver: str) -> list[DeviceRequestAllocationResult]:
        """The allocation results that belong to ``driver`` (a claim may mix drivers)."""
        if self.status.allocation is None:
            return []
        return [r for r in self.status.allocation.devices.results if r.driver == driver]
