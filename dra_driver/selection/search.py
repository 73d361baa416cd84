"""The depth-first, first-fit search over claims, requests and devices (``allocateOne`` and
``allocateDevice`` in the allocator), with its backtracking.

One :class:`Search` lives for one ``allocate`` call: it holds what the current attempt has picked
(``chosen``), which devices it takes exclusively (``allocating``) and which subrequest each
``firstAvailable`` request settled on. Every step that changes that state returns an undo.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.selection.constraints import Constraint, DistinctAttribute, MatchAttribute, lookup_attribute
from dra_driver.selection.eligibility import Eligibility
from dra_driver.selection.errors import AllocationError
from dra_driver.selection.model import Node
from dra_driver.selection.pools import DeviceID, DeviceRef, PoolView
from dra_driver.selection.requests import ClaimToAllocate, RequestSlot

__all__ = ["ALLOCATION_RESULTS_MAX_SIZE", "Chosen", "Search"]

#: ``resourceapi.AllocationResultsMaxSize``: at most this many devices per claim.
ALLOCATION_RESULTS_MAX_SIZE = 32

SlotKey = tuple[int, int, int]
Undo = Callable[[], None]


@dataclass
class Chosen:
    slot: RequestSlot
    ref: DeviceRef
    share_id: str | None = None


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
        allocated: Mapping[DeviceID, str],
        max_steps: int,
    ) -> None:
        self.claims = claims
        self.view = view
        self.slots = slots
        self.constraints = constraints
        self.eligibility = eligibility
        self.allocated = allocated
        self.max_steps = max_steps
        self.chosen: list[list[Chosen]] = [[] for _ in claims]
        self.allocating: dict[DeviceID, set[int]] = {}
        self.selected_sub: dict[tuple[int, int], int] = {}
        self.steps = 0
        #: per slot: the devices its selectors accept (or fail on), in search order
        self._candidates: dict[SlotKey, list[tuple[DeviceRef, str | None]]] = {}
        #: per (claim, constraint index): attribute value → candidate devices having it
        self._value_index: dict[tuple[int, int], dict[tuple[str, Any], list[DeviceRef]]] = {}

    @property
    def node(self) -> Node:
        return self.view.node

    def run(self) -> bool:
        return self._allocate_one(0, 0, 0, 0, False)

    def in_use(self, device_id: DeviceID) -> bool:
        return device_id in self.allocated or bool(self.allocating.get(device_id))

    # -- the recursion ------------------------------------------------------------------------

    def _allocate_one(
        self, claim_index: int, request_index: int, sub_index: int, device_index: int, in_sub: bool
    ) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise AllocationError(f"search stopped after {self.max_steps} steps without a result")
        if claim_index >= len(self.claims):
            return True
        if request_index >= len(self.claims[claim_index].spec.devices.requests):
            return self._allocate_one(claim_index + 1, 0, 0, 0, False)
        slot = self.slots[(claim_index, request_index, sub_index)]
        if not in_sub and slot.sub_index >= 0:
            return self._first_available(claim_index, request_index)
        if slot.mode == "All" and not slot.all_devices:
            return False
        if device_index >= slot.num_devices:
            return self._allocate_one(claim_index, request_index + 1, 0, 0, False)
        if len(self.chosen[claim_index]) + slot.num_devices - device_index > ALLOCATION_RESULTS_MAX_SIZE:
            return False
        if slot.mode == "All":
            return self._allocate_all(slot, device_index, in_sub)
        return self._allocate_next(slot, device_index, in_sub)

    def _first_available(self, claim_index: int, request_index: int) -> bool:
        """Subrequests in order; the first that the rest of the search can live with wins."""
        index = 0
        while (claim_index, request_index, index) in self.slots:
            if self._allocate_one(claim_index, request_index, index, 0, True):
                self.selected_sub[(claim_index, request_index)] = index
                return True
            index += 1
        return False

    def _continue(self, slot: RequestSlot, device_index: int, in_sub: bool) -> bool:
        return self._allocate_one(
            slot.claim_index, slot.request_index, max(slot.sub_index, 0), device_index + 1, in_sub
        )

    def _allocate_all(self, slot: RequestSlot, device_index: int, in_sub: bool) -> bool:
        if slot.all_devices is None:
            raise RuntimeError("a request for all devices was planned without its device list")
        undo = self.try_device(slot, slot.all_devices[device_index], must=True)
        if undo is None:
            return False
        if self._continue(slot, device_index, in_sub):
            return True
        undo()
        return False

    def _allocate_next(self, slot: RequestSlot, device_index: int, in_sub: bool) -> bool:
        if not self._feasible(slot, device_index):
            return False
        for ref, error in self.candidates(slot):
            if slot.admin_access:
                if slot.claim_index in self.allocating.get(ref.id, set()):
                    continue
            elif self.in_use(ref.id) and not self.eligibility.shareable(ref):
                continue
            if error is not None:
                raise AllocationError(error)
            undo = self.try_device(slot, ref, must=False)
            if undo is None:
                continue
            if self._continue(slot, device_index, in_sub):
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

    def _usable(self, slot: RequestSlot, ref: DeviceRef, error: str | None) -> bool:
        if error is not None or self.eligibility.shareable(ref):
            return True
        if slot.admin_access:
            return slot.claim_index not in self.allocating.get(ref.id, ())
        return not self.in_use(ref.id)

    def _feasible(self, slot: RequestSlot, device_index: int) -> bool:
        """A necessary condition for completing the claim from here; pruning keeps first-fit results.

        Without it the depth-first search tries every ordering of every partial set, which is
        hopeless for "5 GPUs on one switch" over a thousand GPUs in four-GPU groups.
        """
        usable = sum(1 for ref, error in self.candidates(slot) if self._usable(slot, ref, error))
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
                key = (constraint.value.kind(), constraint.value.value())
                available = sum(1 for ref in values.get(key, []) if not self.in_use(ref.id))
                if available < needed:
                    return False
            elif isinstance(constraint, DistinctAttribute):
                taken = {(v.kind(), v.value()) for v in constraint.values}
                free = sum(
                    1
                    for key, refs in values.items()
                    if key not in taken and any(not self.in_use(r.id) for r in refs)
                )
                if free < needed:
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
        """``allocateDevice``: record ``ref`` for ``slot`` when it may be used, with its undo."""
        claim = self.claims[slot.claim_index]
        shareable = self.eligibility.shareable(ref)
        if slot.admin_access and not shareable and slot.claim_index in self.allocating.get(ref.id, set()):
            return None
        if not slot.admin_access and self.in_use(ref.id) and not shareable:
            return None
        if self.eligibility.untolerated(ref, slot):
            return None
        added: list[Constraint] = []
        for constraint in self.constraints[slot.claim_index]:
            if not constraint.add(slot, ref):
                for done in added:
                    done.remove(slot, ref)
                if must:
                    raise AllocationError(
                        f"claim {claim.key}, request {slot.name}: cannot add device {ref.label} because a "
                        "claim constraint would not be satisfied"
                    )
                return None
            added.append(constraint)
        if not shareable:
            self.allocating.setdefault(ref.id, set()).add(slot.claim_index)
        chosen = Chosen(slot, ref, str(uuid.uuid4()) if shareable else None)
        self.chosen[slot.claim_index].append(chosen)

        def undo() -> None:
            for constraint in added:
                constraint.remove(slot, ref)
            self.allocating.get(ref.id, set()).discard(slot.claim_index)
            self.chosen[slot.claim_index].remove(chosen)

        return undo
