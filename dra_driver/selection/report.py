"""Why claims do or do not fit on a node, device by device: the data behind ``fabric-dra explain``.

:func:`explain_node` runs the same :class:`~dra_driver.selection.allocator.Allocator` the
stand-in scheduler uses, then looks at every published device for every request and says
what decided about it, in this order: reachability from the node (slice node selection,
pool generation), pool state, binding-condition support, DeviceClass selectors, request
selectors, per-device node selection, existing allocations, consumable capacity, shared
counters (:mod:`.misfits` says whose claims hold them), taints. When the requests
could each be met but the claim still does not fit, the claim's constraints are analysed:
for ``matchAttribute`` the fitting devices are grouped by the attribute's value ("needs 3
devices with equal fabric-dra.io/switch; sw1 has 2, sw2 has 2").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dra_driver.selection.allocator import (
    AllocationError,
    AllocationResult,
    Allocator,
    ClaimToAllocate,
    RequestSlot,
    lookup_attribute,
)
from dra_driver.selection.misfits import capacity_misfit, counter_misfit
from dra_driver.selection.model import Node
from dra_driver.selection.pools import DeviceID, DeviceRef, Pool, PoolView

__all__ = ["ConstraintReport", "DeviceVerdict", "NodeReport", "Reason", "RequestReport", "explain_node"]

Reason = Literal[
    "fits",
    "unreachable",
    "pool",
    "binding-conditions",
    "selector",
    "selector-error",
    "node",
    "taint",
    "allocated",
    "capacity",
    "counters",
    "constraint",
]


@dataclass
class DeviceVerdict:
    device: str  # pool/device
    driver: str
    reason: Reason
    detail: str = ""


@dataclass
class RequestReport:
    claim: str
    request: str
    device_class: str
    mode: str
    count: int
    needed: int
    fitting: list[str] = field(default_factory=list)
    rejected: list[DeviceVerdict] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)
    problem: str | None = None


@dataclass
class ConstraintReport:
    claim: str
    kind: Literal["matchAttribute", "distinctAttribute"]
    attribute: str
    requests: list[str]
    needed: int
    groups: dict[str, int]
    lacking: int
    satisfiable: bool
    message: str


@dataclass
class NodeReport:
    node: str
    satisfiable: bool
    summary: str
    error: str | None = None
    requests: list[RequestReport] = field(default_factory=list)
    constraints: list[ConstraintReport] = field(default_factory=list)
    allocations: list[dict[str, Any]] = field(default_factory=list)


def _all_refs(allocator: Allocator, view: PoolView) -> list[tuple[DeviceRef, Pool | None, str | None]]:
    """Every published device, usable ones first (in search order), each with its pool in this
    node's view and why it is not usable."""
    refs: list[tuple[DeviceRef, Pool | None, str | None]] = []
    seen: set[DeviceID] = set()
    for pool in view.pools:
        if pool.incomplete:
            problem: str | None = f"pool {pool.name} is being updated (not all of its slices are published)"
        elif pool.invalid_reason:
            problem = f"pool {pool.name} is invalid: {pool.invalid_reason}"
        else:
            problem = None
        for ref in pool.refs:
            refs.append((ref, pool, problem))
            seen.add(ref.id)
    for slice_ in sorted(allocator.slices, key=lambda s: (s.spec.driver, s.spec.pool.name, s.name)):
        for device in slice_.spec.devices:
            ref = DeviceRef(slice_, device)
            if ref.id not in seen:
                seen.add(ref.id)
                refs.append((ref, None, view.unreachable.get(ref.id, "not reachable from this node")))
    return refs


def _verdict(
    allocator: Allocator,
    slot: RequestSlot,
    ref: DeviceRef,
    pool: Pool | None,
    problem: str | None,
    view: PoolView,
) -> DeviceVerdict:
    driver = ref.slice.spec.driver

    def verdict(reason: Reason, detail: str = "") -> DeviceVerdict:
        return DeviceVerdict(ref.label, driver, reason, detail)

    if problem is not None or pool is None:
        problem = problem or "not reachable from this node"
        reason: Reason = "pool" if problem.startswith("pool ") else "unreachable"
        return verdict(reason, problem)
    if ref.device.binding_conditions and not allocator.features.binding_conditions:
        return verdict("binding-conditions", "has binding conditions, which this scheduler does not support")
    check = allocator.check_selectors(ref, slot)
    if check.error is not None:
        return verdict("selector-error", check.describe())
    if not check.matched:
        return verdict("selector", check.describe())
    if not allocator.device_serves_node(ref, view.node):
        return verdict("node", f"device does not serve node {view.node.name} (per-device node selection)")
    holder = allocator.allocated.devices.get(ref.id)
    if holder is not None and not slot.admin_access:
        return verdict("allocated", f"allocated to claim {holder}")
    found = _shared_resource_misfit(allocator, slot, ref, pool)
    if found is not None:
        return verdict(*found)
    taints = allocator.untolerated(ref, slot)
    if taints:
        return verdict(
            "taint", "tainted " + ", ".join(taints) + f"; request {slot.name} does not tolerate it"
        )
    return verdict("fits")


def _shared_resource_misfit(
    allocator: Allocator, slot: RequestSlot, ref: DeviceRef, pool: Pool
) -> tuple[Reason, str] | None:
    """Consumable capacity, then shared counters (the allocator's order), over what is allocated."""
    if allocator.features.consumable_capacity:
        misfit = capacity_misfit(ref, slot.capacity, allocator.allocated)
        if misfit is not None:
            return "capacity", misfit
    if not ref.device.consumes_counters:
        return None
    if not allocator.features.partitionable_devices:
        return "counters", "consumes shared counters, which this scheduler does not support"
    if allocator.shareable(ref) and allocator.allocated.aggregated(ref.id) is not None:
        return None  # a shared device in use already holds its counters
    shortfall = allocator.counters.shortfall(pool, ref)
    return ("counters", counter_misfit(shortfall)) if shortfall is not None else None


def _value_key(ref: DeviceRef, attribute: str) -> str | None:
    attr = lookup_attribute(ref, attribute)
    return None if attr is None or attr.kind() == "unknown" else f"{attr.display()}"


def _analyse_constraints(
    claim: ClaimToAllocate,
    slots: Sequence[RequestSlot],
    eligible: dict[str, list[DeviceRef]],
) -> list[ConstraintReport]:
    reports: list[ConstraintReport] = []
    for constraint in claim.spec.devices.constraints:
        kind: Literal["matchAttribute", "distinctAttribute"]
        if constraint.match_attribute:
            kind, attribute = "matchAttribute", constraint.match_attribute
        elif constraint.distinct_attribute:
            kind, attribute = "distinctAttribute", constraint.distinct_attribute
        else:
            continue
        names = set(constraint.requests)
        covered = [s for s in slots if not names or s.base_name in names or s.name in names]
        needed_by_request: dict[int, int] = {}
        devices: dict[DeviceID, DeviceRef] = {}
        for slot in covered:
            count = slot.num_devices if slot.mode == "All" else slot.count
            current = needed_by_request.get(slot.request_index)
            needed_by_request[slot.request_index] = count if current is None else min(current, count)
            for ref in eligible.get(slot.name, []):
                devices[ref.id] = ref
        needed = sum(needed_by_request.values())
        groups: dict[str, int] = {}
        lacking = 0
        for ref in devices.values():
            value = _value_key(ref, attribute)
            if value is None:
                lacking += 1
            else:
                groups[value] = groups.get(value, 0) + 1
        scope = ", ".join(sorted({s.base_name for s in covered})) or "all requests"
        short = attribute.rpartition("/")[2]
        listing = ", ".join(
            f"{short} {v} has {n}" for v, n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        if kind == "matchAttribute":
            satisfiable = any(n >= needed for n in groups.values())
            message = f"needs {needed} devices with equal {attribute} (requests: {scope}); " + (
                listing or "no fitting device has the attribute"
            )
        else:
            satisfiable = len(groups) >= needed
            message = (
                f"needs {needed} devices with distinct {attribute} (requests: {scope}); "
                f"fitting devices have {len(groups)} distinct value(s)" + (f": {listing}" if listing else "")
            )
        if lacking:
            message += f"; {lacking} fitting device(s) lack the attribute"
        reports.append(
            ConstraintReport(
                claim.key, kind, attribute, sorted(names), needed, groups, lacking, satisfiable, message
            )
        )
    return reports


def explain_node(allocator: Allocator, claims: Sequence[ClaimToAllocate], node: Node) -> NodeReport:
    """Allocate ``claims`` together on ``node`` and explain every device's part in the outcome."""
    results: list[AllocationResult] | None = None
    error: str | None = None
    try:
        results = allocator.allocate(claims, node)
    except AllocationError as err:
        error = str(err)
    report = NodeReport(node.name, results is not None, "", error)
    view = allocator.pool_view(node)
    refs = _all_refs(allocator, view)
    chosen: dict[tuple[str, str], list[str]] = {}
    for result in results or []:
        report.allocations.append({"claim": result.claim.key, "allocation": result.body})
        for entry in result.body["devices"]["results"]:
            chosen.setdefault((result.claim.key, entry["request"]), []).append(
                f"{entry['pool']}/{entry['device']}"
            )
    problems: list[str] = []
    for claim_index, claim in enumerate(claims):
        try:
            slots = allocator.slots_for(claim_index, claim)
        except AllocationError as err:
            problems.append(str(err))
            continue
        eligible: dict[str, list[DeviceRef]] = {}
        for slot in slots:
            request = RequestReport(
                claim.key,
                slot.name,
                slot.device_class.name,
                slot.mode,
                slot.count,
                slot.count if slot.mode == "ExactCount" else 0,
                chosen=chosen.get((claim.key, slot.name), []),
            )
            fits: list[DeviceRef] = []
            for ref, pool, problem in refs:
                verdict = _verdict(allocator, slot, ref, pool, problem, view)
                if verdict.reason == "fits":
                    fits.append(ref)
                else:
                    request.rejected.append(verdict)
            eligible[slot.name] = fits
            if slot.mode == "All":
                slot.num_devices = request.needed = len(fits)
                if not fits:
                    request.problem = f"request {slot.name} asks for all matching devices, but none fits"
            elif len(fits) < slot.count:
                request.problem = f"request {slot.name} needs {slot.count} device(s), {len(fits)} fit"
            else:
                slot.num_devices = slot.count
            request.fitting = [ref.label for ref in fits]
            report.requests.append(request)
        if results is None and error is None:
            constraint_reports = _analyse_constraints(claim, slots, eligible)
            report.constraints.extend(constraint_reports)
            _mark_constraint_rejections(report, claim, slots, eligible, constraint_reports)
        problems.extend(r.problem for r in report.requests if r.claim == claim.key and r.problem)
    report.summary = _summary(report, claims, problems)
    return report


def _mark_constraint_rejections(
    report: NodeReport,
    claim: ClaimToAllocate,
    slots: Sequence[RequestSlot],
    eligible: dict[str, list[DeviceRef]],
    constraints: Sequence[ConstraintReport],
) -> None:
    """Move fitting devices that an unsatisfiable constraint rules out to the rejected list."""
    for constraint in constraints:
        if constraint.satisfiable:
            continue
        for request in report.requests:
            if request.claim != claim.key:
                continue
            slot = next(s for s in slots if s.name == request.request)
            if constraint.requests and not ({slot.base_name, slot.name} & set(constraint.requests)):
                continue
            keep: list[str] = []
            for ref in eligible.get(slot.name, []):
                value = _value_key(ref, constraint.attribute)
                if value is None:
                    detail = f"lacks {constraint.attribute}, which {constraint.kind} requires"
                elif constraint.kind == "matchAttribute":
                    detail = (
                        f"{constraint.kind} {constraint.attribute}: only {constraint.groups[value]} fitting "
                        f"device(s) share the value {value}, {constraint.needed} needed"
                    )
                else:
                    detail = (
                        f"{constraint.kind} {constraint.attribute}: only {len(constraint.groups)} distinct "
                        f"value(s) among fitting devices, {constraint.needed} needed"
                    )
                if ref.label in request.fitting:
                    request.rejected.append(
                        DeviceVerdict(ref.label, ref.slice.spec.driver, "constraint", detail)
                    )
                else:
                    keep.append(ref.label)
            request.fitting = [label for label in request.fitting if label in keep]


def _summary(report: NodeReport, claims: Sequence[ClaimToAllocate], problems: list[str]) -> str:
    names = ", ".join(c.key for c in claims)
    if report.satisfiable:
        parts = [f"{r.request} → {', '.join(r.chosen)}" for r in report.requests if r.chosen]
        return f"fits: {'; '.join(parts)}" if parts else f"fits ({names} request no devices)"
    if report.error is not None:
        return f"allocation stopped: {report.error}"
    if problems:
        return "; ".join(problems)
    failing = [c.message for c in report.constraints if not c.satisfiable]
    if failing:
        return "; ".join(failing)
    return (
        "the requests cannot all be met at once by the fitting devices (constraints or overlapping requests)"
    )
