"""Allocate devices to claims on one node, the way kube-scheduler's DRA plugin does.

A port of the structured allocator Kubernetes 1.36 runs with its default feature gates
(``k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``,
``pools_incubating.go``, ``consumable_capacity.go``): all claims of a pod are allocated together
by a first-fit, depth-first search over requests and devices, backtracking when a constraint,
a counter or a capacity cannot be met. Its rules, which explanations rely on:

- a device is usable when it is reachable from the node, not allocated exclusively to another
  claim (admin access excepted), matches the DeviceClass's and the request's CEL selectors,
  serves the node (per-device node selection), and has no NoSchedule/NoExecute taint the
  request does not tolerate;
- a CEL *runtime* error on a device the search examines aborts the allocation for this node
  with that error (``selectorsMatch`` returns it), exactly as in Kubernetes — the search
  order therefore matters, and :mod:`dra_driver.selection.report` reports every device's
  outcome regardless;
- partitionable devices (:mod:`.counters`): a device consuming shared counters fits only while
  no counter of its pool goes below zero, counting every allocated device of the pool, on this
  node or another; a pool whose devices reference a missing counter set or counter is invalid;
- consumable capacity (:mod:`.capacity`): an ``allowMultipleAllocations`` device is shared; each
  share's request is rounded up by the capacity's ``requestPolicy`` and all shares together must
  fit the capacity; each share gets a ``shareID`` and its ``consumedCapacity``;
- ``matchAttribute``: every device of the named requests has the attribute with one value;
  ``distinctAttribute``: values pairwise different; a device without the attribute fails both;
- ``firstAvailable`` subrequests are tried in order, the first that can be satisfied wins;
- ``allocationMode: All`` takes every matching device, and fails on incomplete or invalid pools;
- when nothing fits and some pool was invalid, allocation on the node fails with
  "invalid resource pools were encountered" rather than just not fitting.

The work is split by responsibility: :mod:`.requests` plans a claim's request slots,
:mod:`.eligibility` decides whether one device may serve one request, :mod:`.constraints` tracks
a claim's constraints, :mod:`.search` is the backtracking search and :mod:`.results` writes
``status.allocation``. :class:`Allocator` ties them to one snapshot of slices and classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.selection.allocated import AllocatedState
from dra_driver.selection.capacity import CapacityUndefined, cmp_request_over_capacity
from dra_driver.selection.celenv import SelectorCache, SelectorOutcome
from dra_driver.selection.constraints import Constraint, build_constraints, lookup_attribute
from dra_driver.selection.counters import Counters
from dra_driver.selection.eligibility import Eligibility, SelectorCheck
from dra_driver.selection.errors import AllocationError
from dra_driver.selection.features import Features
from dra_driver.selection.model import DeviceClass, Node, ResourceSlice
from dra_driver.selection.pools import DeviceID, DeviceRef, PoolView, gather_pools
from dra_driver.selection.requests import ClaimToAllocate, RequestSlot, find_device_class, plan_slots
from dra_driver.selection.results import AllocationResult, build_result
from dra_driver.selection.search import ALLOCATION_RESULTS_MAX_SIZE, Search

__all__ = [
    "ALLOCATION_RESULTS_MAX_SIZE",
    "AllocatedState",
    "AllocationError",
    "AllocationResult",
    "Allocator",
    "ClaimToAllocate",
    "Features",
    "RequestSlot",
    "SelectorCheck",
    "lookup_attribute",
]


class Allocator:
    """Allocation over one snapshot of slices, classes and existing allocations.

    ``allocated`` is what existing claims hold (:class:`AllocatedState`), or simply every device
    held exclusively mapped to its claim, ``namespace/name``. Selector outcomes are cached per
    device content and
    expression, so one Allocator serves many nodes and claims cheaply; ``outcomes`` shares that
    cache between allocators of successive snapshots (a device whose slice was rewritten without
    changing the device keeps its outcomes).
    """

    def __init__(
        self,
        slices: Sequence[ResourceSlice],
        classes: Mapping[str, DeviceClass],
        allocated: AllocatedState | Mapping[DeviceID, str] | None = None,
        *,
        features: Features | None = None,
        cache: SelectorCache | None = None,
        outcomes: dict[tuple[str, str], SelectorOutcome] | None = None,
        max_steps: int = 200_000,
    ) -> None:
        self.slices = list(slices)
        self.classes = dict(classes)
        self.features = features or Features()
        self.allocated = AllocatedState.of(allocated)
        self.max_steps = max_steps
        self.eligibility = Eligibility(
            self.classes, self.features, cache or SelectorCache(), {} if outcomes is None else outcomes
        )
        self._views: dict[str, PoolView] = {}

    @property
    def allocated(self) -> AllocatedState:
        return self._allocated

    @allocated.setter
    def allocated(self, allocated: AllocatedState | Mapping[DeviceID, str]) -> None:
        """What existing claims hold; the available counters follow it (``availableCounters``)."""
        self._allocated = AllocatedState.of(allocated)
        self.counters = Counters(self._allocated)

    # -- shared pieces, also used by explanations ---------------------------------------------

    def pool_view(self, node: Node) -> PoolView:
        view = self._views.get(node.name)
        if view is None:
            view = self._views[node.name] = gather_pools(
                self.slices, node, partitionable=self.features.partitionable_devices
            )
        return view

    def device_class(self, name: str, where: str) -> DeviceClass:
        return find_device_class(self.classes, name, where)

    def slots_for(self, claim_index: int, claim: ClaimToAllocate) -> list[RequestSlot]:
        return plan_slots(claim_index, claim, self.classes, self.features)

    def check_selectors(self, ref: DeviceRef, slot: RequestSlot) -> SelectorCheck:
        return self.eligibility.check_selectors(ref, slot)

    def device_serves_node(self, ref: DeviceRef, node: Node) -> bool:
        return self.eligibility.device_serves_node(ref, node)

    def untolerated(self, ref: DeviceRef, slot: RequestSlot) -> list[str]:
        return self.eligibility.untolerated(ref, slot)

    def shareable(self, ref: DeviceRef) -> bool:
        return self.eligibility.shareable(ref)

    def capacity_fits(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        """Whether one share of ``slot`` fits beside the existing allocations (no search state)."""
        if not self.features.consumable_capacity:
            return True
        try:
            return cmp_request_over_capacity(
                self.allocated.aggregated(ref.id), slot.capacity, ref.device, None
            )
        except CapacityUndefined:
            return False

    # -- the search ---------------------------------------------------------------------------

    def allocate(self, claims: Sequence[ClaimToAllocate], node: Node) -> list[AllocationResult] | None:
        """Allocation results for every claim on ``node``, None when they do not fit.

        Raises :class:`AllocationError` when allocation must stop (unknown class, a CEL error
        on an examined device, …), as Kubernetes' ``Allocate`` returns an error.
        """
        view = self.pool_view(node)
        slots: dict[tuple[int, int, int], RequestSlot] = {}
        constraints: list[list[Constraint]] = []
        for claim_index, claim in enumerate(claims):
            slots.update(self._plan_claim(claim_index, claim, view))
            constraints.append(build_constraints(claim))
        search = Search(
            claims,
            view,
            slots,
            constraints,
            eligibility=self.eligibility,
            allocated=self.allocated,
            counters=self.counters,
            max_steps=self.max_steps,
        )
        if not search.run():
            if any(pool.invalid_reason for pool in view.pools):
                # Not fatal for the pod: upstream wraps it in ErrFailedAllocationOnNode, so the
                # scheduler reports it only when no node fits.
                raise AllocationError("invalid resource pools were encountered")
            return None
        return [build_result(search, i, claim, self.classes, self.features) for i, claim in enumerate(claims)]

    def _plan_claim(
        self, claim_index: int, claim: ClaimToAllocate, view: PoolView
    ) -> dict[tuple[int, int, int], RequestSlot]:
        """The claim's slots with their device counts; too many devices for one claim stops."""
        slots: dict[tuple[int, int, int], RequestSlot] = {}
        per_request: dict[int, int] = {}
        for slot in self.slots_for(claim_index, claim):
            if slot.mode == "All":
                slot.all_devices = self.eligibility.all_devices(slot, view, claim, self.capacity_fits)
                slot.num_devices = len(slot.all_devices)
            else:
                slot.num_devices = slot.count
            slots[slot.key] = slot
            current = per_request.get(slot.request_index)
            per_request[slot.request_index] = (
                slot.num_devices if current is None else min(current, slot.num_devices)
            )
        minimum = sum(per_request.values())
        if minimum > ALLOCATION_RESULTS_MAX_SIZE:
            raise AllocationError(
                f"claim {claim.key}: number of requested devices {minimum} exceeds the claim limit "
                f"of {ALLOCATION_RESULTS_MAX_SIZE}"
            )
        return slots
