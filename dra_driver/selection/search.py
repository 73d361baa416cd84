"""The depth-first, first-fit search over claims, requests and devices (``allocateOne`` and
``allocateDevice`` in ``internal/incubating/allocator_incubating.go``), with its backtracking.

One :class:`Search` lives for one ``allocate`` call: it holds what the current attempt has picked
(``chosen``), which devices it takes exclusively (``allocating``), the counters and consumable
capacity its picks take, and which subrequest each ``firstAvailable`` request settled on. Every
step that changes that state returns an undo that gives back exactly what it took.

Within one request the devices are tried in search order from just after the previous pick
(upstream's ``startLocation``): a request never gets the same device twice, shared or not, and
combinations are tried once rather than in every order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.selection.allocated import AllocatedState
from dra_driver.selection.capacity import (
    CapacityShares,
    CapacityUndefined,
    cmp_request_over_capacity,
    consumed_capacity_from_request,
)
from dra_driver.selection.constraints import Constraint, DistinctAttribute, MatchAttribute, lookup_attribute
from dra_driver.selection.counters import Counters, CounterUse
from dra_driver.selection.eligibility import Eligibility
from dra_driver.selection.errors import AllocationError
from dra_driver.selection.model import Node
from dra_driver.selection.pools import DeviceID, DeviceRef, Pool, PoolView
from dra_driver.selection.quantity import Quantity
from dra_driver.selection.requests import ClaimToAllocate, RequestSlot

__all__ = ["ALLOCATION_RESULTS_MAX_SIZE", "Chosen", "Search"]

#: ``resourceapi.AllocationResultsMaxSize``: at most this many devices per claim.
ALLOCATION_RESULTS_MAX_SIZE = 32

SlotKey = tuple[int, int, int]
Undo = Callable[[], None]


class _MaxSizeExceeded(DriverError):
    """``errAllocationResultMaxSizeExceeded``: this branch would put more than 32 results in a
    claim; a ``firstAvailable`` request tries its next subrequest, a claim boundary gives up."""


@dataclass
class Chosen:
    slot: RequestSlot
    ref: DeviceRef
    share_id: str | None = None
    #: the share of each capacity taken (shared devices); None when the device has no capacity
    consumed: dict[str, Quantity] | None = None


@dataclass
class _Taken:
    """What one ``try_device`` changed, so that one undo reverses all of it (``rollbackDevice``)."""

    constraints: list[Constraint] = field(default_factory=list)
    counters: Pool | None = None
    exclusive: bool = False
    capacity: dict[str, Quantity] | None = None


class Search:
    """One allocation attempt of ``claims`` on ``node``; :meth:`run` says whether all fit."""

    def __init__(
        self,
        claims: Sequence[ClaimToAllocate],
        view: PoolView,
        slots: dict[SlotKey, RequestSlot],
        constraints: list[list[Constraint]],
        *,
        eligibility: Eligibility,
        allocated: AllocatedState,
        counters: Counters,
        max_steps: int,
    ) -> None:
        self.claims = claims
        self.view = view
        self.slots = slots
        self.constraints = constraints
        self.eligibility = eligibility
        self.features = eligibility.features
        self.allocated = allocated
        self.max_steps = max_steps
        self.chosen: list[list[Chosen]] = [[] for _ in claims]
        self.allocating: dict[DeviceID, set[int]] = {}
        self.counter_use = CounterUse(counters)
        self.capacity = CapacityShares()
        self.selected_sub: dict[tuple[int, int], int] = {}
        self.steps = 0
        self._pools = {ref.id: pool for pool in view.pools for ref in pool.refs}
        #: per slot: the devices its selectors accept (or fail on), in search order
        self._candidates: dict[SlotKey, list[tuple[DeviceRef, str | None]]] = {}
        #: per (claim, constraint index): attribute value → candidate devices having it
        self._value_index: dict[tuple[int, int], dict[tuple[str, Any], list[DeviceRef]]] = {}

    @property
    def node(self) -> Node:
        return self.view.node

    def run(self) -> bool:
        try:
            return self._allocate_one(0, 0, 0, 0, False, 0)
        except _MaxSizeExceeded as err:
            # upstream returns errAllocationResultMaxSizeExceeded from the first claim as is
            raise AllocationError("allocation max size exceeded") from err

    def in_use(self, device_id: DeviceID) -> bool:
        """``deviceInUse``: held exclusively by an earlier claim, or picked by this search."""
        return device_id in self.allocated.devices or bool(self.allocating.get(device_id))

    def capacity_in_use(self, device_id: DeviceID) -> bool:
        """``deviceCapacityInUse``: a share recorded capacity before, or this search took a share."""
        return self.allocated.aggregated(device_id) is not None or self.capacity.in_use(device_id)

    # -- the recursion ------------------------------------------------------------------------

    def _allocate_one(
        self,
        claim_index: int,
        request_index: int,
        sub_index: int,
        device_index: int,
        in_sub: bool,
        start: int,
    ) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise AllocationError(f"search stopped after {self.max_steps} steps without a result")
        if claim_index >= len(self.claims):
            return True
        if request_index >= len(self.claims[claim_index].spec.devices.requests):
            try:
                return self._allocate_one(claim_index + 1, 0, 0, 0, False, 0)
            except _MaxSizeExceeded:
                return False
        slot = self.slots[(claim_index, request_index, sub_index)]
        if not in_sub and slot.sub_index >= 0:
            return self._first_available(claim_index, request_index)
        if slot.mode == "All" and not slot.all_devices:
            return False
        if device_index >= slot.num_devices:
            return self._allocate_one(claim_index, request_index + 1, 0, 0, False, 0)
        if len(self.chosen[claim_index]) + slot.num_devices - device_index > ALLOCATION_RESULTS_MAX_SIZE:
            raise _MaxSizeExceeded
        if slot.mode == "All":
            return self._allocate_all(slot, device_index, in_sub)
        return self._allocate_next(slot, device_index, in_sub, start)

    def _first_available(self, claim_index: int, request_index: int) -> bool:
        """Subrequests in order; the first that the rest of the search can live with wins."""
        index, all_exceeded = 0, True
        while (claim_index, request_index, index) in self.slots:
            try:
                if self._allocate_one(claim_index, request_index, index, 0, True, 0):
                    self.selected_sub[(claim_index, request_index)] = index
                    return True
                all_exceeded = False
            except _MaxSizeExceeded:
                pass
            index += 1
        if all_exceeded:
            raise _MaxSizeExceeded
        return False

    def _continue(self, slot: RequestSlot, device_index: int, in_sub: bool, start: int) -> bool:
        return self._allocate_one(
            slot.claim_index, slot.request_index, max(slot.sub_index, 0), device_index + 1, in_sub, start
        )

    def _allocate_all(self, slot: RequestSlot, device_index: int, in_sub: bool) -> bool:
        if slot.all_devices is None:
            raise RuntimeError("a request for all devices was planned without its device list")
        undo = self.try_device(slot, slot.all_devices[device_index], must=True)
        if undo is None:
            return False
        try:
            if self._continue(slot, device_index, in_sub, 0):
                return True
        except BaseException:
            undo()
            raise
        undo()
        return False

    def _skipped(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        """The "in use" check upstream makes before it looks at the device's selectors."""
        if slot.admin_access:
            return slot.claim_index in self.allocating.get(ref.id, ())
        return self.in_use(ref.id)

    def _allocate_next(self, slot: RequestSlot, device_index: int, in_sub: bool, start: int) -> bool:
        candidates = self.candidates(slot)
        if not self._feasible(slot, device_index, start):
            # Upstream would walk on through this request's devices and stop at the first whose
            # selectors fail with an error; the pruning must not hide that error.
            for ref, error in candidates[start:]:
                if error is not None and not self._skipped(slot, ref):
                    raise AllocationError(error)
            return False
        for position in range(start, len(candidates)):
            ref, error = candidates[position]
            if self._skipped(slot, ref):
                continue
            if error is not None:
                raise AllocationError(error)
            if not self.capacity_fits(slot, ref):
                continue
            undo = self.try_device(slot, ref, must=False)
            if undo is None:
                continue
            try:
                done = self._continue(slot, device_index, in_sub, position + 1)
            except BaseException:
                undo()
                raise
            if done:
                return True
            undo()
        return False

    # -- candidates and pruning ---------------------------------------------------------------

    def candidates(self, slot: RequestSlot) -> list[tuple[DeviceRef, str | None]]:
        """Devices the slot's selectors accept, plus those they fail on (with the error).

        The result does not depend on the search state, so it is computed once per search;
        an erroring device raises only when the search reaches it, as in Kubernetes.
        """
        found = self._candidates.get(slot.key)
        if found is None:
            claim = self.claims[slot.claim_index]
            found = []
            for pool in self.view.pools:
                if pool.incomplete or pool.invalid_reason:
                    continue
                for ref in pool.refs:
                    try:
                        if self.eligibility.selectable(slot, ref, self.node, claim):
                            found.append((ref, None))
                    except AllocationError as err:
                        found.append((ref, str(err)))
            self._candidates[slot.key] = found
        return found

    def capacity_fits(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        """``CmpRequestOverCapacity`` with this search's shares; a capacity the device lacks skips it."""
        if not self.features.consumable_capacity:
            return True
        try:
            return cmp_request_over_capacity(
                self.allocated.aggregated(ref.id), slot.capacity, ref.device, self.capacity.taking(ref.id)
            )
        except CapacityUndefined:
            return False

    def _usable(self, slot: RequestSlot, ref: DeviceRef, error: str | None) -> bool:
        return error is not None or not self._skipped(slot, ref)

    def _feasible(self, slot: RequestSlot, device_index: int, start: int) -> bool:
        """A necessary condition for completing the claim from here; pruning keeps first-fit results.

        Without it the depth-first search tries every combination of every partial set, which is
        hopeless for "5 GPUs on one switch" over a thousand GPUs in four-GPU groups. Counters and
        capacity are left to the search: the counts here are upper bounds.
        """
        candidates = self.candidates(slot)
        usable = sum(1 for ref, error in candidates[start:] if self._usable(slot, ref, error))
        if usable < slot.num_devices - device_index:
            return False
        claim_index = slot.claim_index
        for index, constraint in enumerate(self.constraints[claim_index]):
            needed = self._still_needed(constraint, slot, device_index)
            if needed == 0:
                continue
            values = self._values(claim_index, index, constraint)
            if isinstance(constraint, MatchAttribute):
                if constraint.count == 0 or constraint.value is None:
                    continue
                free = [
                    r
                    for r in values.get((constraint.value.kind(), constraint.value.value()), [])
                    if not self.in_use(r.id)
                ]
                # one shared device may serve every remaining request of the constraint
                if len(free) < needed and not any(self.eligibility.shareable(r) for r in free):
                    return False
            elif isinstance(constraint, DistinctAttribute):
                taken = {(v.kind(), v.value()) for v in constraint.values}
                distinct = sum(
                    1
                    for key, refs in values.items()
                    if key not in taken and any(not self.in_use(r.id) for r in refs)
                )
                if distinct < needed:
                    return False
        return True

    def _still_needed(self, constraint: Constraint, slot: RequestSlot, device_index: int) -> int:
        needed = slot.num_devices - device_index if constraint.applies(slot) else 0
        request_index = slot.request_index + 1
        while (slot.claim_index, request_index, 0) in self.slots:
            sub_index, least = 0, None
            while (key := (slot.claim_index, request_index, sub_index)) in self.slots:
                later = self.slots[key]
                count = later.num_devices if constraint.applies(later) else 0
                least = count if least is None else min(least, count)
                sub_index += 1
            needed += least or 0
            request_index += 1
        return needed

    def _values(
        self, claim_index: int, index: int, constraint: Constraint
    ) -> dict[tuple[str, Any], list[DeviceRef]]:
        found = self._value_index.get((claim_index, index))
        if found is None:
            found = {}
            seen: set[DeviceID] = set()
            for key, slot in self.slots.items():
                if key[0] != claim_index or not constraint.applies(slot):
                    continue
                for ref, error in self.candidates(slot):
                    attr = lookup_attribute(ref, constraint.attribute)
                    if error is None and attr is not None and ref.id not in seen:
                        seen.add(ref.id)
                        found.setdefault((attr.kind(), attr.value()), []).append(ref)
            self._value_index[(claim_index, index)] = found
        return found

    # -- one device ---------------------------------------------------------------------------

    def try_device(self, slot: RequestSlot, ref: DeviceRef, must: bool) -> Undo | None:
        """``allocateDevice``: record ``ref`` for ``slot`` when it may be used, with its undo; on the
        way out of a refusal, whatever was taken is given back."""
        shareable = self.eligibility.shareable(ref)
        if not shareable and slot.admin_access and slot.claim_index in self.allocating.get(ref.id, ()):
            return None
        if not slot.admin_access and self.in_use(ref.id):
            return None
        if not self.features.partitionable_devices and ref.device.consumes_counters:
            return None
        taken = _Taken()
        # a shared device's counters are taken once, by its first share
        if ref.device.consumes_counters and not (shareable and self.capacity_in_use(ref.id)):
            pool = self._pools[ref.id]
            if not self.counter_use.take(pool, ref):
                return None
            taken.counters = pool
        if self.eligibility.untolerated(ref, slot) or not self._add_constraints(slot, ref, must, taken):
            self._give_back(slot, ref, taken)
            return None
        if not shareable:
            self.allocating.setdefault(ref.id, set()).add(slot.claim_index)
            taken.exclusive = True
        if not self.capacity_fits(slot, ref):
            self._give_back(slot, ref, taken)
            return None
        chosen = Chosen(slot, ref)
        if shareable:
            consumed = consumed_capacity_from_request(slot.capacity, ref.device)
            self.capacity.add(ref.id, consumed)
            taken.capacity = consumed
            chosen.share_id = str(uuid.uuid4())
            chosen.consumed = consumed or None
        self.chosen[slot.claim_index].append(chosen)

        def undo() -> None:
            self.chosen[slot.claim_index].remove(chosen)
            self._give_back(slot, ref, taken)

        return undo

    def _add_constraints(self, slot: RequestSlot, ref: DeviceRef, must: bool, taken: _Taken) -> bool:
        for constraint in self.constraints[slot.claim_index]:
            if not constraint.add(slot, ref):
                if must:
                    self._give_back(slot, ref, taken)
                    claim = self.claims[slot.claim_index]
                    raise AllocationError(
                        f"claim {claim.key}, request {slot.name}: cannot add device {ref.label} because a "
                        "claim constraint would not be satisfied"
                    )
                return False
            taken.constraints.append(constraint)
        return True

    def _give_back(self, slot: RequestSlot, ref: DeviceRef, taken: _Taken) -> None:
        for constraint in taken.constraints:
            constraint.remove(slot, ref)
        taken.constraints = []
        if taken.exclusive:
            self.allocating.get(ref.id, set()).discard(slot.claim_index)
            taken.exclusive = False
        if taken.capacity is not None:
            self.capacity.remove(ref.id, taken.capacity)
            taken.capacity = None
        if taken.counters is not None:
            self.counter_use.give_back(taken.counters, ref)
            taken.counters = None
