"""A claim's requests as the search sees them: one slot per request or ``firstAvailable``
subrequest, checked as ``validateDeviceRequest`` in the allocator does before searching."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dra_driver.selection.errors import AllocationError
from dra_driver.selection.features import Features
from dra_driver.selection.model import DeviceClass, DeviceSelector, DeviceToleration, ResourceClaimSpec
from dra_driver.selection.pools import DeviceRef
from dra_driver.selection.quantity import Quantity

__all__ = ["ClaimToAllocate", "RequestSlot", "find_device_class", "plan_slots"]


@dataclass(frozen=True)
class ClaimToAllocate:
    namespace: str
    name: str
    spec: ResourceClaimSpec
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class RequestSlot:
    """One request, or one subrequest of a ``firstAvailable`` request (``requestData``)."""

    claim_index: int
    request_index: int
    sub_index: int  # -1 for a request without subrequests
    base_name: str
    sub_name: str
    device_class: DeviceClass
    selectors: list[DeviceSelector]
    mode: str
    count: int
    admin_access: bool
    tolerations: list[DeviceToleration]
    #: ``capacity.requests``: the share of each consumable capacity asked for, None when unset
    capacity: dict[str, Quantity] | None = None
    num_devices: int = 0
    all_devices: list[DeviceRef] | None = None

    @property
    def name(self) -> str:
        return f"{self.base_name}/{self.sub_name}" if self.sub_name else self.base_name

    @property
    def key(self) -> tuple[int, int, int]:
        """(claim, request, subrequest) with the subrequest 0 for a plain request."""
        return (self.claim_index, self.request_index, max(self.sub_index, 0))


def find_device_class(classes: Mapping[str, DeviceClass], name: str, where: str) -> DeviceClass:
    if not name:
        raise AllocationError(f"{where}: missing device class name")
    device_class = classes.get(name)
    if device_class is None:
        raise AllocationError(f"{where}: device class {name} not found")
    return device_class


def plan_slots(
    claim_index: int, claim: ClaimToAllocate, classes: Mapping[str, DeviceClass], features: Features
) -> list[RequestSlot]:
    """Every request and subrequest of a claim, validated as ``validateDeviceRequest`` does."""
    slots: list[RequestSlot] = []
    for request_index, request in enumerate(claim.spec.devices.requests):
        where = f"claim {claim.key}, request {request.name}"
        if request.first_available:
            if not features.prioritized_list:
                raise AllocationError(f"{where}: has subrequests, but the DRAPrioritizedList feature is off")
            for sub in request.first_available:
                if sub.capacity is not None and not features.consumable_capacity:
                    raise AllocationError(
                        f"claim {claim.key}, subrequest {sub.name}: has capacity requests, but the "
                        "DRAConsumableCapacity feature is disabled"
                    )
            for sub_index, sub in enumerate(request.first_available):
                slots.append(
                    RequestSlot(
                        claim_index,
                        request_index,
                        sub_index,
                        request.name,
                        sub.name,
                        find_device_class(classes, sub.device_class_name, f"{where}/{sub.name}"),
                        list(sub.selectors),
                        sub.allocation_mode,
                        sub.count,
                        False,
                        list(sub.tolerations),
                        dict(sub.capacity.requests) if sub.capacity is not None else None,
                    )
                )
        elif request.exactly is not None:
            exact = request.exactly
            if exact.capacity is not None and not features.consumable_capacity:
                raise AllocationError(
                    f"{where}: has capacity requests, but the DRAConsumableCapacity feature is disabled"
                )
            if exact.admin_access is not None and not features.admin_access:
                raise AllocationError(f"{where}: admin access is requested, but the feature is off")
            slots.append(
                RequestSlot(
                    claim_index,
                    request_index,
                    -1,
                    request.name,
                    "",
                    find_device_class(classes, exact.device_class_name, where),
                    list(exact.selectors),
                    exact.allocation_mode,
                    exact.count,
                    bool(exact.admin_access),
                    list(exact.tolerations),
                    dict(exact.capacity.requests) if exact.capacity is not None else None,
                )
            )
        else:
            raise AllocationError(f"{where}: neither exactly nor firstAvailable is set")
        for slot in slots:
            for index, selector in enumerate(slot.selectors):
                if selector.cel is None:
                    raise AllocationError(f"{where}, selector #{index}: CEL expression empty")
    return slots
