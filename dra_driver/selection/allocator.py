"""Allocate devices to claims on one node, the way kube-scheduler's DRA plugin does.

A port of the structured allocator (``k8s.io/dynamic-resource-allocation/structured``,
``internal/stable/allocator_stable.go`` with the ``experimental`` additions:
``distinctAttribute``, binding conditions, ``allowMultipleAllocations``): all claims of a pod
are allocated together by a first-fit, depth-first search over requests and devices,
backtracking when a constraint cannot be met. Its rules, which explanations rely on:

- a device is usable when it is reachable from the node, not allocated to another claim
  (admin access and ``allowMultipleAllocations`` excepted), matches the DeviceClass's and
  the request's CEL selectors, serves the node (per-device node selection), and has no
  NoSchedule/NoExecute taint the request does not tolerate;
- a CEL *runtime* error on a device the search examines aborts the allocation for this node
  with that error (``selectorsMatch`` returns it), exactly as in Kubernetes — the search
  order therefore matters, and :mod:`dra_driver.selection.explain` reports every device's
  outcome regardless;
- ``matchAttribute``: every device of the named requests has the attribute with one value;
  ``distinctAttribute``: values pairwise different; a device without the attribute fails both;
- ``firstAvailable`` subrequests are tried in order, the first that can be satisfied wins;
- ``allocationMode: All`` takes every matching device, and fails on incomplete pools.

Not covered: partitionable devices (shared counters) and consumable capacity requests.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.selection.celenv import CelCompileError, SelectorCache, SelectorOutcome
from dra_driver.selection.model import (
    DeviceAttribute,
    DeviceClass,
    DeviceSelector,
    DeviceToleration,
    Node,
    ResourceClaimSpec,
    ResourceSlice,
)
from dra_driver.selection.nodes import node_matches
from dra_driver.selection.pools import DeviceID, DeviceRef, PoolView, gather_pools
from dra_driver.selection.taints import untolerated_taints

__all__ = [
    "AllocationError",
    "AllocationResult",
    "Allocator",
    "ClaimToAllocate",
    "Features",
    "RequestSlot",
    "SelectorCheck",
    "lookup_attribute",
]

#: ``resourceapi.AllocationResultsMaxSize``: at most this many devices per claim.
ALLOCATION_RESULTS_MAX_SIZE = 32


class AllocationError(Exception):
    """Allocation on this node must stop (Kubernetes returns an error from ``Allocate``)."""


@dataclass(frozen=True)
class Features:
    """Feature gates of the scheduler being modelled; all on by default (Kubernetes 1.36)."""

    admin_access: bool = True
    prioritized_list: bool = True
    device_taints: bool = True
    binding_conditions: bool = True
    multiple_allocations: bool = True


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
class AllocationResult:
    """``status.allocation`` for one claim, as JSON for the API server."""

    claim: ClaimToAllocate
    body: dict[str, Any]

    @property
    def binding_conditions(self) -> bool:
        return any(r.get("bindingConditions") for r in self.body["devices"]["results"])


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
    num_devices: int = 0
    all_devices: list[DeviceRef] | None = None

    @property
    def name(self) -> str:
        return f"{self.base_name}/{self.sub_name}" if self.sub_name else self.base_name


@dataclass(frozen=True)
class SelectorCheck:
    """Why a device does or does not match a request's selectors."""

    matched: bool
    source: str = ""  # "class fabric-gpu" or "request gpus"
    index: int = -1
    expression: str = ""
    error: str | None = None

    def describe(self) -> str:
        where = f"{self.source} selector #{self.index}"
        if self.error is not None:
            return f"{where} failed with a CEL runtime error: {self.error} (expression: {self.expression})"
        return f"{where} is false: {self.expression}"


def lookup_attribute(ref: DeviceRef, qualified: str) -> DeviceAttribute | None:
    """``lookupAttribute``: the fully-qualified name, or the bare id when the domain is the driver's."""
    attributes = ref.device.attributes
    if qualified in attributes:
        return attributes[qualified]
    domain, sep, ident = qualified.partition("/")
    if sep and domain == ref.slice.spec.driver:
        return attributes.get(ident)
    return None


def _same_value(a: DeviceAttribute, b: DeviceAttribute) -> bool:
    return a.kind() == b.kind() and a.kind() != "unknown" and a.value() == b.value()


class _Constraint:
    def __init__(self, requests: Sequence[str], attribute: str) -> None:
        self.requests = set(requests)
        self.attribute = attribute

    def applies(self, slot: RequestSlot) -> bool:
        return not self.requests or slot.base_name in self.requests or slot.name in self.requests

    def add(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        raise NotImplementedError

    def remove(self, slot: RequestSlot, ref: DeviceRef) -> None:
        raise NotImplementedError


class _MatchAttribute(_Constraint):
    def __init__(self, requests: Sequence[str], attribute: str) -> None:
        super().__init__(requests, attribute)
        self.value: DeviceAttribute | None = None
        self.count = 0

    def add(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        if not self.applies(slot):
            return True
        attr = lookup_attribute(ref, self.attribute)
        if attr is None:
            return False
        if self.count == 0:
            self.value, self.count = attr, 1
            return True
        if self.value is None or not _same_value(attr, self.value):
            return False
        self.count += 1
        return True

    def remove(self, slot: RequestSlot, ref: DeviceRef) -> None:
        if self.applies(slot):
            self.count -= 1


class _DistinctAttribute(_Constraint):
    def __init__(self, requests: Sequence[str], attribute: str) -> None:
        super().__init__(requests, attribute)
        self.values: list[DeviceAttribute] = []

    def add(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        if not self.applies(slot):
            return True
        attr = lookup_attribute(ref, self.attribute)
        if attr is None or attr.kind() == "unknown":
            return False
        if any(_same_value(attr, seen) for seen in self.values):
            return False
        self.values.append(attr)
        return True

    def remove(self, slot: RequestSlot, ref: DeviceRef) -> None:
        if self.applies(slot):
            self.values.pop()


@dataclass
class _Chosen:
    slot: RequestSlot
    ref: DeviceRef
    share_id: str | None = None


@dataclass
class _Search:
    claims: Sequence[ClaimToAllocate]
    node: Node
    view: PoolView
    slots: dict[tuple[int, int, int], RequestSlot]
    constraints: list[list[_Constraint]]
    chosen: list[list[_Chosen]]
    allocating: dict[DeviceID, set[int]] = field(default_factory=dict)
    selected_sub: dict[tuple[int, int], int] = field(default_factory=dict)
    steps: int = 0
    #: per slot: the devices its selectors accept (or fail on), in search order
    candidates: dict[tuple[int, int, int], list[tuple[DeviceRef, str | None]]] = field(default_factory=dict)
    #: per (claim, constraint index): attribute value → candidate devices having it
    value_index: dict[tuple[int, int], dict[tuple[str, Any], list[DeviceRef]]] = field(default_factory=dict)


class Allocator:
    """Allocation over one snapshot of slices, classes and existing allocations.

    ``allocated`` maps every device already allocated (without admin access) to the claim
    holding it, ``namespace/name``. Selector outcomes are cached per device content and
    expression, so one Allocator serves many nodes and claims cheaply; ``outcomes`` shares that
    cache between allocators of successive snapshots (a device whose slice was rewritten without
    changing the device keeps its outcomes).
    """

    def __init__(
        self,
        slices: Sequence[ResourceSlice],
        classes: Mapping[str, DeviceClass],
        allocated: Mapping[DeviceID, str] | None = None,
        *,
        features: Features | None = None,
        cache: SelectorCache | None = None,
        outcomes: dict[tuple[str, str], SelectorOutcome] | None = None,
        max_steps: int = 200_000,
    ) -> None:
        self.slices = list(slices)
        self.classes = dict(classes)
        self.allocated = dict(allocated or {})
        self.features = features or Features()
        self.cache = cache or SelectorCache()
        self.max_steps = max_steps
        #: (device content, expression) → outcome: the outcome depends on nothing else
        self._outcomes: dict[tuple[str, str], SelectorOutcome] = {} if outcomes is None else outcomes
        self._views: dict[str, PoolView] = {}

    # -- shared pieces, also used by explanations ---------------------------------------------

    def pool_view(self, node: Node) -> PoolView:
        view = self._views.get(node.name)
        if view is None:
            view = self._views[node.name] = gather_pools(self.slices, node)
        return view

    def device_class(self, name: str, where: str) -> DeviceClass:
        if not name:
            raise AllocationError(f"{where}: missing device class name")
        device_class = self.classes.get(name)
        if device_class is None:
            raise AllocationError(f"{where}: device class {name} not found")
        return device_class

    def slots_for(self, claim_index: int, claim: ClaimToAllocate) -> list[RequestSlot]:
        """Every request and subrequest of a claim, validated as ``validateDeviceRequest`` does."""
        slots: list[RequestSlot] = []
        for request_index, request in enumerate(claim.spec.devices.requests):
            where = f"claim {claim.key}, request {request.name}"
            if request.first_available:
                if not self.features.prioritized_list:
                    raise AllocationError(
                        f"{where}: has subrequests, but the DRAPrioritizedList feature is off"
                    )
                for sub_index, sub in enumerate(request.first_available):
                    slots.append(
                        RequestSlot(
                            claim_index,
                            request_index,
                            sub_index,
                            request.name,
                            sub.name,
                            self.device_class(sub.device_class_name, f"{where}/{sub.name}"),
                            list(sub.selectors),
                            sub.allocation_mode,
                            sub.count,
                            False,
                            list(sub.tolerations),
                        )
                    )
            elif request.exactly is not None:
                exact = request.exactly
                if exact.admin_access is not None and not self.features.admin_access:
                    raise AllocationError(f"{where}: admin access is requested, but the feature is off")
                slots.append(
                    RequestSlot(
                        claim_index,
                        request_index,
                        -1,
                        request.name,
                        "",
                        self.device_class(exact.device_class_name, where),
                        list(exact.selectors),
                        exact.allocation_mode,
                        exact.count,
                        bool(exact.admin_access),
                        list(exact.tolerations),
                    )
                )
            else:
                raise AllocationError(f"{where}: neither exactly nor firstAvailable is set")
            for slot in slots:
                for index, selector in enumerate(slot.selectors):
                    if selector.cel is None:
                        raise AllocationError(f"{where}, selector #{index}: CEL expression empty")
        return slots

    def check_selectors(self, ref: DeviceRef, slot: RequestSlot) -> SelectorCheck:
        """Class selectors, then request selectors; the first that is false or fails decides."""
        groups = (
            (f"class {slot.device_class.name}", slot.device_class.spec.selectors),
            (f"request {slot.name}", slot.selectors),
        )
        for source, selectors in groups:
            for index, selector in enumerate(selectors):
                if selector.cel is None:
                    raise ValueError(f"{source}: selector {index} has no CEL expression")
                expression = selector.cel.expression
                key = (ref.content, expression)
                outcome = self._outcomes.get(key)
                if outcome is None:
                    outcome = self._evaluate(ref, expression)
                    self._outcomes[key] = outcome
                if outcome.matched is not True:
                    return SelectorCheck(False, source, index, expression, outcome.error)
        return SelectorCheck(True)

    def _evaluate(self, ref: DeviceRef, expression: str) -> SelectorOutcome:
        try:
            program = self.cache.get(expression)
        except CelCompileError as err:
            return SelectorOutcome(None, f"compilation failed: {err}")
        try:
            activation = ref.activation()
        except ValueError as err:
            return SelectorOutcome(None, str(err))
        return program.evaluate(activation)

    def device_serves_node(self, ref: DeviceRef, node: Node) -> bool:
        if not ref.slice.spec.per_device_node_selection:
            return True
        device = ref.device
        return node_matches(node, device.node_name, device.all_nodes, device.node_selector)

    def untolerated(self, ref: DeviceRef, slot: RequestSlot) -> list[str]:
        if not self.features.device_taints:
            return []
        return [t.display() for t in untolerated_taints(ref.device.taints, slot.tolerations)]

    def shareable(self, ref: DeviceRef) -> bool:
        return self.features.multiple_allocations and bool(ref.device.allow_multiple_allocations)

    # -- the search ---------------------------------------------------------------------------

    def allocate(self, claims: Sequence[ClaimToAllocate], node: Node) -> list[AllocationResult] | None:
        """Allocation results for every claim on ``node``, None when they do not fit.

        Raises :class:`AllocationError` when allocation must stop (unknown class, a CEL error
        on an examined device, …), as Kubernetes' ``Allocate`` returns an error.
        """
        view = self.pool_view(node)
        slots: dict[tuple[int, int, int], RequestSlot] = {}
        constraints: list[list[_Constraint]] = []
        for claim_index, claim in enumerate(claims):
            minimum = 0
            per_request: dict[int, int] = {}
            for slot in self.slots_for(claim_index, claim):
                if slot.mode == "All":
                    slot.all_devices = self._all_devices(slot, view, claim)
                    slot.num_devices = len(slot.all_devices)
                else:
                    slot.num_devices = slot.count
                slots[(claim_index, slot.request_index, max(slot.sub_index, 0))] = slot
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
            claim_constraints: list[_Constraint] = []
            for index, constraint in enumerate(claim.spec.devices.constraints):
                if constraint.match_attribute:
                    claim_constraints.append(_MatchAttribute(constraint.requests, constraint.match_attribute))
                elif constraint.distinct_attribute:
                    claim_constraints.append(
                        _DistinctAttribute(constraint.requests, constraint.distinct_attribute)
                    )
                else:
                    raise AllocationError(f"claim {claim.key}, constraint #{index}: empty constraint")
            constraints.append(claim_constraints)

        search = _Search(claims, node, view, slots, constraints, [[] for _ in claims])
        if not self._allocate_one(search, 0, 0, 0, 0, False):
            return None
        return [self._result(search, i, claim) for i, claim in enumerate(claims)]

    def _all_devices(self, slot: RequestSlot, view: PoolView, claim: ClaimToAllocate) -> list[DeviceRef]:
        devices: list[DeviceRef] = []
        for pool in view.pools:
            if pool.incomplete:
                raise AllocationError(
                    f"claim {claim.key}, request {slot.name}: asks for all devices, but resource pool "
                    f"{pool.driver}/{pool.name} is currently being updated"
                )
            if pool.invalid_reason:
                raise AllocationError(
                    f"claim {claim.key}, request {slot.name}: asks for all devices, but resource pool "
                    f"{pool.driver}/{pool.name} is invalid: {pool.invalid_reason}"
                )
            for ref in pool.refs:
                if self._selectable(slot, ref, view, claim):
                    devices.append(ref)
        return devices

    def _selectable(self, slot: RequestSlot, ref: DeviceRef, view: PoolView, claim: ClaimToAllocate) -> bool:
        if ref.device.binding_conditions and not self.features.binding_conditions:
            return False
        check = self.check_selectors(ref, slot)
        if check.error is not None:
            raise AllocationError(
                f"claim {claim.key}: {check.source} selector #{check.index} on device "
                f"{ref.label}: CEL runtime error: {check.error}"
            )
        if not check.matched:
            return False
        return self.device_serves_node(ref, view.node)

    def _in_use(self, search: _Search, device_id: DeviceID) -> bool:
        return device_id in self.allocated or bool(search.allocating.get(device_id))

    def _allocate_one(
        self,
        search: _Search,
        claim_index: int,
        request_index: int,
        sub_index: int,
        device_index: int,
        in_sub: bool,
    ) -> bool:
        search.steps += 1
        if search.steps > self.max_steps:
            raise AllocationError(f"search stopped after {self.max_steps} steps without a result")
        if claim_index >= len(search.claims):
            return True
        claim = search.claims[claim_index]
        if request_index >= len(claim.spec.devices.requests):
            return self._allocate_one(search, claim_index + 1, 0, 0, 0, False)
        slot = search.slots[(claim_index, request_index, sub_index)]

        if not in_sub and slot.sub_index >= 0:
            index = 0
            while (claim_index, request_index, index) in search.slots:
                if self._allocate_one(search, claim_index, request_index, index, 0, True):
                    search.selected_sub[(claim_index, request_index)] = index
                    return True
                index += 1
            return False

        if slot.mode == "All" and not slot.all_devices:
            return False
        if device_index >= slot.num_devices:
            return self._allocate_one(search, claim_index, request_index + 1, 0, 0, False)
        if len(search.chosen[claim_index]) + slot.num_devices - device_index > ALLOCATION_RESULTS_MAX_SIZE:
            return False

        if slot.mode == "All":
            if slot.all_devices is None:
                raise RuntimeError("a request for all devices was planned without its device list")
            ref = slot.all_devices[device_index]
            undo = self._try_device(search, slot, ref, must=True)
            if undo is None:
                return False
            if self._allocate_one(search, claim_index, request_index, sub_index, device_index + 1, in_sub):
                return True
            undo()
            return False

        if not self._feasible(search, slot, device_index):
            return False
        for ref, error in self._candidates(search, slot):
            if slot.admin_access:
                if claim_index in search.allocating.get(ref.id, set()):
                    continue
            elif self._in_use(search, ref.id) and not self.shareable(ref):
                continue
            if error is not None:
                raise AllocationError(error)
            undo = self._try_device(search, slot, ref, must=False)
            if undo is None:
                continue
            if self._allocate_one(search, claim_index, request_index, sub_index, device_index + 1, in_sub):
                return True
            undo()
        return False

    def _candidates(self, search: _Search, slot: RequestSlot) -> list[tuple[DeviceRef, str | None]]:
        """Devices the slot's selectors accept, plus those they fail on (with the error).

        The result does not depend on the search state, so it is computed once per search;
        an erroring device raises only when the search reaches it, as in Kubernetes.
        """
        key = (slot.claim_index, slot.request_index, max(slot.sub_index, 0))
        found = search.candidates.get(key)
        if found is None:
            claim = search.claims[slot.claim_index]
            found = []
            for pool in search.view.pools:
                if pool.incomplete or pool.invalid_reason:
                    continue
                for ref in pool.refs:
                    try:
                        if self._selectable(slot, ref, search.view, claim):
                            found.append((ref, None))
                    except AllocationError as err:
                        found.append((ref, str(err)))
            search.candidates[key] = found
        return found

    def _feasible(self, search: _Search, slot: RequestSlot, device_index: int) -> bool:
        """A necessary condition for completing the claim from here; pruning keeps first-fit results.

        Without it the depth-first search tries every ordering of every partial set, which is
        hopeless for "5 GPUs on one switch" over a thousand GPUs in four-GPU groups.
        """
        usable = sum(
            1
            for ref, error in self._candidates(search, slot)
            if error is not None
            or self.shareable(ref)
            or (
                slot.claim_index not in search.allocating.get(ref.id, ())
                if slot.admin_access
                else not self._in_use(search, ref.id)
            )
        )
        if usable < slot.num_devices - device_index:
            return False
        claim_index = slot.claim_index
        for index, constraint in enumerate(search.constraints[claim_index]):
            needed = self._still_needed(search, constraint, slot, device_index)
            if needed == 0:
                continue
            values = self._value_index(search, claim_index, index, constraint)
            if isinstance(constraint, _MatchAttribute):
                if constraint.count == 0 or constraint.value is None:
                    continue
                key = (constraint.value.kind(), constraint.value.value())
                available = sum(1 for ref in values.get(key, []) if not self._in_use(search, ref.id))
                if available < needed:
                    return False
            elif isinstance(constraint, _DistinctAttribute):
                taken = {(v.kind(), v.value()) for v in constraint.values}
                free = sum(
                    1
                    for key, refs in values.items()
                    if key not in taken and any(not self._in_use(search, r.id) for r in refs)
                )
                if free < needed:
                    return False
        return True

    @staticmethod
    def _still_needed(search: _Search, constraint: _Constraint, slot: RequestSlot, device_index: int) -> int:
        needed = slot.num_devices - device_index if constraint.applies(slot) else 0
        request_index = slot.request_index + 1
        while (slot.claim_index, request_index, 0) in search.slots:
            sub_index, least = 0, None
            while (key := (slot.claim_index, request_index, sub_index)) in search.slots:
                later = search.slots[key]
                count = later.num_devices if constraint.applies(later) else 0
                least = count if least is None else min(least, count)
                sub_index += 1
            needed += least or 0
            request_index += 1
        return needed

    def _value_index(
        self, search: _Search, claim_index: int, index: int, constraint: _Constraint
    ) -> dict[tuple[str, Any], list[DeviceRef]]:
        found = search.value_index.get((claim_index, index))
        if found is None:
            found = {}
            seen: set[DeviceID] = set()
            for key, slot in search.slots.items():
                if key[0] != claim_index or not constraint.applies(slot):
                    continue
                for ref, error in self._candidates(search, slot):
                    attr = lookup_attribute(ref, constraint.attribute)
                    if error is None and attr is not None and ref.id not in seen:
                        seen.add(ref.id)
                        found.setdefault((attr.kind(), attr.value()), []).append(ref)
            search.value_index[(claim_index, index)] = found
        return found

    def _try_device(self, search: _Search, slot: RequestSlot, ref: DeviceRef, must: bool) -> Any:
        claim = search.claims[slot.claim_index]
        shareable = self.shareable(ref)
        if slot.admin_access and not shareable and slot.claim_index in search.allocating.get(ref.id, set()):
            return None
        if not slot.admin_access and self._in_use(search, ref.id) and not shareable:
            return None
        if self.untolerated(ref, slot):
            return None
        added: list[_Constraint] = []
        for constraint in search.constraints[slot.claim_index]:
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
            search.allocating.setdefault(ref.id, set()).add(slot.claim_index)
        chosen = _Chosen(slot, ref, str(uuid.uuid4()) if shareable else None)
        search.chosen[slot.claim_index].append(chosen)

        def undo() -> None:
            for constraint in added:
                constraint.remove(slot, ref)
            search.allocating.get(ref.id, set()).discard(slot.claim_index)
            search.chosen[slot.claim_index].remove(chosen)

        return undo

    # -- results ------------------------------------------------------------------------------

    def _result(self, search: _Search, claim_index: int, claim: ClaimToAllocate) -> AllocationResult:
        results: list[dict[str, Any]] = []
        for chosen in search.chosen[claim_index]:
            slot, ref = chosen.slot, chosen.ref
            entry: dict[str, Any] = {
                "request": slot.name,
                "driver": ref.slice.spec.driver,
                "pool": ref.slice.spec.pool.name,
                "device": ref.device.name,
            }
            if slot.admin_access:
                entry["adminAccess"] = True
            if slot.tolerations:
                entry["tolerations"] = [
                    t.model_dump(by_alias=True, exclude_none=True) for t in slot.tolerations
                ]
            if self.features.binding_conditions and ref.device.binding_conditions:
                entry["bindingConditions"] = list(ref.device.binding_conditions)
                entry["bindingFailureConditions"] = list(ref.device.binding_failure_conditions)
            if chosen.share_id:
                entry["shareID"] = chosen.share_id
            results.append(entry)
        body: dict[str, Any] = {"devices": {"results": results}}
        config = self._config(search, claim_index, claim)
        if config:
            body["devices"]["config"] = config
        node_selector = self._node_selector(search, claim_index)
        if node_selector is not None:
            body["nodeSelector"] = node_selector
        return AllocationResult(claim, body)

    def _config(self, search: _Search, claim_index: int, claim: ClaimToAllocate) -> list[dict[str, Any]]:
        config: list[dict[str, Any]] = []
        used_slots: list[RequestSlot] = []
        for request_index, _ in enumerate(claim.spec.devices.requests):
            sub = search.selected_sub.get((claim_index, request_index), 0)
            used_slots.append(search.slots[(claim_index, request_index, sub)])
        by_class: dict[str, list[str]] = {}
        for slot in used_slots:
            by_class.setdefault(slot.device_class.name, []).append(slot.name)
        for class_name, names in by_class.items():
            for entry in self.classes[class_name].spec.config:
                config.append({"source": "FromClass", "requests": list(names), **entry})
        selected_names = {s.name for s in used_slots}
        for entry in claim.spec.devices.config:
            wanted = entry.get("requests") or []
            if not wanted or any(
                name in selected_names or name in {s.base_name for s in used_slots} for name in wanted
            ):
                config.append({"source": "FromClaim", **entry})
        for entry in config:
            if len(entry.get("requests") or []) == len(claim.spec.devices.requests):
                entry.pop("requests", None)
        return config

    def _node_selector(self, search: _Search, claim_index: int) -> dict[str, Any] | None:
        """``createNodeSelector``: pin to the node for node-local or bindsToNode devices."""
        expressions: list[dict[str, Any]] = []
        fields: list[dict[str, Any]] = []
        for chosen in search.chosen[claim_index]:
            ref = chosen.ref
            spec = ref.slice.spec
            if spec.per_device_node_selection:
                node_name, selector = ref.device.node_name, ref.device.node_selector
            else:
                node_name, selector = spec.node_name, spec.node_selector
            if node_name or ref.device.binds_to_node:
                return {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [search.node.name]}
                            ]
                        }
                    ]
                }
            if selector is not None and len(selector.node_selector_terms) == 1:
                term = selector.node_selector_terms[0]
                for requirement, target in (
                    *((r, expressions) for r in term.match_expressions),
                    *((r, fields) for r in term.match_fields),
                ):
                    dumped = requirement.model_dump(by_alias=True, exclude_defaults=False)
                    if not dumped.get("values"):
                        dumped.pop("values", None)
                    if dumped not in target:
                        target.append(dumped)
        if not expressions and not fields:
            return None
        term_out: dict[str, Any] = {}
        if expressions:
            term_out["matchExpressions"] = expressions
        if fields:
            term_out["matchFields"] = fields
        return {"nodeSelectorTerms": [term_out]}
