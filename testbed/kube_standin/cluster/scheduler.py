"""Scheduler: bind pending pods to a node where all their claims can be allocated.

Mirrors kube-scheduler's DRA plugin (``pkg/scheduler/framework/plugins/dynamicresources``):

- Filter: a node fits when every allocated claim's ``allocation.nodeSelector`` matches it
  and the pod's unallocated claims can be allocated together there
  (:class:`dra_driver.selection.Allocator`, the same code as ``fabric-dra explain``), beside
  what allocated claims hold (:mod:`.claim_cache`): devices held whole, shares of
  ``allowMultipleAllocations`` devices with their ``consumedCapacity``, and through both the
  pools' shared counters — the claims this scheduler wrote count at once, as in-flight
  allocations do upstream;
- PreBind: add the ``resource.kubernetes.io/delete-protection`` finalizer, then write
  ``status.allocation`` (a shared device's result with its ``shareID`` and ``consumedCapacity``,
  as the allocator made it) and ``status.reservedFor`` in one status update (optimistic
  concurrency: a conflict means the world changed, so the pod is scheduled again);
- binding conditions (``isPodReadyForBinding``): when any allocated device carries
  ``bindingConditions``, wait until each is True in ``status.devices`` before binding; a
  true ``bindingFailureConditions`` entry, or ``--binding-timeout`` (600 s in Kubernetes),
  clears the allocation (Unreserve) and the pod is scheduled again. Like the real scheduler it
  remembers nothing about the failure: the allocator's first fit picks the same device again
  unless the driver took it out of allocation (a taint, or withheld from its slice) —
  ``allocateOne`` in ``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/*/
  allocator_*.go`` walks pools, slices and devices in the same order every time, and
  ``dynamicresources.go`` keeps no per-pod record of failed devices;
- the slices are read as the device taint tracker hands them out: with the taints of the
  DeviceTaintRules that select their devices, where the API server serves them (:mod:`.taint_tracker`);
- Filter also holds ``NodeUnschedulable``, the pod's ``nodeSelector`` and its
  ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` (``NodeAffinity``'s
  Filter: terms ORed, requirements ANDed, ``In NotIn Exists DoesNotExist Gt Lt`` as
  ``staging/src/k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go`` —
  :func:`dra_driver.selection.nodes.selector_matches`);
- Score: a weighted sum of normalised plugin scores, highest first (:func:`node_scores`), with
  the default weights of ``pkg/scheduler/apis/config/v1/default_plugins.go``:
  ``NodeAffinity`` 2 — the sum of the weights of the pod's matching
  ``preferredDuringSchedulingIgnoredDuringExecution`` terms, normalised by
  ``helper.DefaultNormalizeScore(MaxNodeScore, false, …)`` (``.../plugins/nodeaffinity/
  node_affinity.go``, ``.../plugins/helper/normalize_score.go``), as upstream;
  ``PodTopologySpread`` 2 — the hostname constraint of ``systemDefaultConstraints`` (maxSkew 3)
  scored and normalised as ``.../plugins/podtopologyspread/scoring.go`` does, with the pods of the
  same controller owner in the namespace standing in for the default selector (upstream builds it
  from the Services, ReplicaSets and StatefulSets selecting the pod), every node its own hostname
  and no zone constraint (the stand-in's nodes carry no zone label); a pod without owner gets no
  score from it, as upstream skips it without constraints;
  ``NodeResourcesFit`` 1 — least allocated (``noderesources/least_allocated.go``), approximated by
  the pods on the node against the kubelet's default ``maxPods`` (110): the stand-in's nodes
  declare no allocatable, and a pod without requests counts upstream as the scheduler's non-zero
  default (100m CPU, 200 MiB), about 0.9 points of 100 on a node of 11 CPUs.
  The other scoring plugins give every node of the stand-in the same score (no taints, images,
  pod affinities or volumes) and are left out; ``DynamicResources`` 1 — for a pod whose claims
  have ``firstAvailable`` requests, each node's allocation scored by the subrequests it used
  (:func:`first_available_score`, normalised over the nodes whose claims can be allocated, as
  upstream's Filter leaves them), 0 for ``exactly`` requests. Ties go to fewer pods of the same
  owner, fewer pods, then the name, where the real scheduler picks at random among equal scores
  (``selectHost`` in ``pkg/scheduler/schedule_one.go``). So pods sharing one claim land on
  different nodes unless its allocation's ``nodeSelector`` pins them (``bindsToNode`` or node-local
  devices: ``createNodeSelector`` in ``.../structured/internal/incubating/allocator_incubating.go``
  pins for ``bindsToNode`` with or without binding conditions) — as in a real cluster.
  *Where it simplifies.* Upstream normalises over the nodes that passed every Filter, DRA's
  included; the stand-in normalises over the nodes that pass the cheap Filters above and then
  tries them best first, taking the first whose claims can be allocated. For one preferred term
  (the warm-device recipe, docs/manager.md) the normalised ``NodeAffinity`` score of every node
  that fits is the same either way (100 where the term matches, else 0); with several terms the
  stand-in's maximum can only be larger, its affinity scores only smaller — never more pull
  towards a preferred node than upstream. The least-allocated approximation spans at most 100
  points, less than the 200 a matching term is worth; upstream's least-allocated and balanced
  allocation can together reach 200 only between an empty and a full node, so for the pods
  tested (no requests, a few per node) both prefer a node matching the term, as they do here;
- Bind: the ``pods/binding`` subresource, or setting ``spec.nodeName`` where the server has
  no such subresource.

Pods that stay unschedulable get a ``FailedScheduling`` event naming the reason per node, as
the real scheduler's "0/3 nodes are available: …" message.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from dra_driver.selection import (
    AllocatedState,
    AllocationError,
    Allocator,
    ClaimToAllocate,
    DeviceClass,
    Node,
    ResourceClaimSpec,
    ResourceSlice,
    SelectorCache,
)
from dra_driver.selection.celenv import SelectorOutcome
from dra_driver.selection.model import NodeSelector
from dra_driver.selection.nodes import selector_matches
from kube_standin.cluster.claim_cache import ClaimCache, claim_key
from kube_standin.cluster.claims import DELETE_PROTECTION, pod_claim_names
from kube_standin.cluster.events import EventRecorder
from kube_standin.cluster.taint_tracker import merged_slices, rules_digest
from plumbing.kube import ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim, is_allocated
from plumbing.kube.informer import Informer, reconcile_passes
from plumbing.kube.resources import PODS, RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = [
    "Scheduler",
    "SchedulerConfig",
    "first_available_score",
    "node_scores",
    "preferred_affinity_score",
    "required_affinity_matches",
]

log = get_logger(__name__)

#: selector outcomes kept across snapshots before the cache starts again (devices times expressions)
_OUTCOMES_MAX = 100_000


@dataclass
class SchedulerConfig:
    binding_timeout: float = 600.0


@dataclass
class _Binding:
    """A pod whose claims are allocated and which waits for binding conditions."""

    node: str
    claims: list[tuple[str, str]]
    started: float


@dataclass
class _PodState:
    last_reason: str = ""


class Scheduler:
    def __init__(
        self,
        kube: KubeClient,
        *,
        pods: Informer,
        nodes: Informer,
        claims: Informer,
        slices: Informer,
        classes: Informer,
        events: EventRecorder,
        config: SchedulerConfig | None = None,
        rules: Informer | None = None,
    ) -> None:
        self.kube = kube
        self.pods, self.nodes, self.claims, self.slices, self.classes = pods, nodes, claims, slices, classes
        #: DeviceTaintRules, where the API server serves them: their taints are merged into the
        #: slices allocated from, as the device taint tracker does (:mod:`.taint_tracker`)
        self.rules = rules
        self.events = events
        self.config = config or SchedulerConfig()
        self._binding: dict[str, _Binding] = {}
        self._state: dict[str, _PodState] = {}
        #: the allocator over one snapshot of slices, classes and nodes, and that snapshot's
        #: names and resourceVersions (:meth:`_allocator`)
        self._snapshot: tuple[tuple[str, str, str], ...] | None = None
        self._snapshot_allocator: Allocator | None = None
        #: compiled CEL by expression across snapshots, as ``cel.Cache`` in kube-scheduler
        self._selectors = SelectorCache()
        #: selector outcomes per (device content, expression), kept across snapshots
        self._outcomes: dict[tuple[str, str], SelectorOutcome] = {}
        #: validated slices: name → (resourceVersion, model)
        self._slice_models: dict[str, tuple[str, ResourceSlice]] = {}
        #: the claims with this scheduler's own writes, and what they hold
        self.claim_cache = ClaimCache(claims)

    async def run(self) -> None:
        informers: tuple[Informer, ...] = (self.pods, self.nodes, self.claims, self.slices, self.classes)
        if self.rules is not None:
            informers = (*informers, self.rules)
        await reconcile_passes("scheduling pass", informers, self.schedule_pending, resync=1.0)

    async def schedule_pending(self) -> None:
        pending = [
            p
            for p in self.pods.values()
            if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]
        pending_keys = {_pod_key(p) for p in pending}
        for key in list(self._state):
            if key not in pending_keys:
                self._state.pop(key, None)
                self._binding.pop(key, None)
        for pod in sorted(pending, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
            try:
                await self.schedule(pod)
            except (Conflict, NotFound) as err:
                log.info(
                    "pod changed while scheduling; retrying", pod=pod["metadata"]["name"], error=str(err)
                )

    # -- one pod ------------------------------------------------------------------------------

    async def schedule(self, pod: dict[str, Any]) -> None:
        key = _pod_key(pod)
        state = self._state.setdefault(key, _PodState())
        binding = self._binding.get(key)
        if binding is not None:
            await self._await_binding_conditions(pod, binding, state)
            return
        namespace = pod["metadata"].get("namespace") or "default"
        claims: list[dict[str, Any]] = []
        current = {claim_key(c): c for c in self.claim_cache.current()}
        for entry, claim_name in pod_claim_names(pod).items():
            claim = current.get(f"{namespace}/{claim_name}") if claim_name else None
            if claim is None:
                await self._unschedulable(pod, state, f"waiting for ResourceClaim of entry {entry}")
                return
            claims.append(claim)
        node, allocations, reasons = self._find_node(pod, claims, state)
        if node is None:
            summary = "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())) or "no nodes"
            await self._unschedulable(
                pod, state, f"0/{len(self.nodes.values())} nodes are available: {summary}"
            )
            return
        written = await self._reserve(pod, claims, allocations, node)
        if any(_has_binding_conditions(c) for c in written):
            self._binding[key] = _Binding(
                node, [(namespace, c["metadata"]["name"]) for c in written], time.monotonic()
            )
            await self.events.record(
                pod,
                "WaitingForBindingConditions",
                f"devices allocated on {node}; waiting for their binding conditions before binding",
            )
            return
        await self._bind(pod, node)

    def _find_node(
        self, pod: dict[str, Any], claims: list[dict[str, Any]], state: _PodState
    ) -> tuple[str | None, dict[str, dict[str, Any]], dict[str, str]]:
        allocator = self._allocator(self.claim_cache.held(exclude={claim_key(c) for c in claims}))
        to_allocate = [
            ClaimToAllocate(
                c["metadata"].get("namespace") or "default",
                c["metadata"]["name"],
                ResourceClaimSpec.model_validate(c.get("spec") or {}),
                c["metadata"].get("uid", ""),
            )
            for c in claims
            if not is_allocated(c)
        ]
        pod_selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        reasons: dict[str, str] = {}
        candidates: list[Node] = []
        for raw in self.nodes.values():
            node = Node.model_validate(raw)
            if (raw.get("spec") or {}).get("unschedulable"):
                reasons[node.name] = "unschedulable"
            elif any(node.metadata.labels.get(k) != v for k, v in pod_selector.items()):
                reasons[node.name] = "does not match the pod's nodeSelector"
            elif not required_affinity_matches(pod, node):
                reasons[node.name] = "does not match the pod's required node affinity"
            elif (mismatch := next((c for c in claims if not _allocation_allows(c, node)), None)) is not None:
                reasons[node.name] = f"claim {mismatch['metadata']['name']} is allocated for other nodes"
            else:
                candidates.append(node)
        if any(r.first_available for c in to_allocate for r in c.spec.devices.requests):
            return self._find_scored_node(pod, claims, to_allocate, allocator, candidates, reasons)
        # Without subrequests the score does not depend on the allocation, so trying the nodes in
        # score order and taking the first whose claims can be allocated is what Filter-then-Score
        # would choose (the normalisation aside: module docstring).
        for node in sorted(candidates, key=self._score_key(pod, candidates)):
            if not to_allocate:
                return node.name, {}, reasons
            found = _allocate_on(allocator, to_allocate, node, reasons)
            if found is not None:
                return node.name, found, reasons
        return None, {}, reasons

    def _find_scored_node(
        self,
        pod: dict[str, Any],
        claims: list[dict[str, Any]],
        to_allocate: list[ClaimToAllocate],
        allocator: Allocator,
        candidates: list[Node],
        reasons: dict[str, str],
    ) -> tuple[str | None, dict[str, dict[str, Any]], dict[str, str]]:
        """A pod with ``firstAvailable`` requests: upstream's Filter allocates on every node and
        its DRA ``Score`` ranks each by the subrequests its allocation used
        (:func:`first_available_score`), so here every candidate is allocated first and the
        feasible ones are scored with that term too. The allocator sees the devices held by
        claims this scheduler wrote, so a warm device taken a moment ago counts as taken at once,
        where a node label counting warm devices trails by a watch and a patch."""
        feasible: dict[str, dict[str, dict[str, Any]]] = {}
        for node in candidates:
            found = _allocate_on(allocator, to_allocate, node, reasons)
            if found is not None:
                feasible[node.name] = found
        if not feasible:
            return None, {}, reasons
        dra = _default_normalize(
            {name: first_available_score(claims, bodies) for name, bodies in feasible.items()}
        )
        best = min((n for n in candidates if n.name in feasible), key=self._score_key(pod, candidates, dra))
        return best.name, feasible[best.name], reasons

    def _allocator(self, held: AllocatedState) -> Allocator:
        """The allocator over the current slices, classes and nodes, ``held`` what claims hold.

        kube-scheduler's DRA plugin takes a snapshot of the slices per scheduling cycle
        (``PreFilter`` in ``pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go``)
        and its structured allocator evaluates each selector on each device it examines, the
        programs compiled once (``cel.Cache``). Here the snapshot, its validated slices and classes,
        its pool views per node and every selector's outcome per device are kept while no slice,
        class or node changed (by name and resourceVersion): a CEL expression's outcome depends
        on nothing but the expression and the device, so it is what the real scheduler would
        compute again, and every device is still examined by every search. Only the devices in
        use differ from pod to pod, and the allocator derives nothing cached from them. Building
        all this again for every pending pod made a pass cost pending pods times devices, and
        under a warm pool's slice churn kept pods pending for tens of seconds
        (docs/performance.md, "Warm devices")."""
        snapshot = tuple(
            sorted(
                (kind, f"{meta.get('namespace') or ''}/{meta.get('name')}", str(meta.get("resourceVersion")))
                for kind, informer in (("slice", self.slices), ("class", self.classes), ("node", self.nodes))
                for meta in (obj.get("metadata") or {} for obj in informer.values())
            )
        )
        rules = list(self.rules.values()) if self.rules is not None else []
        snapshot = (*snapshot, ("rules", rules_digest(rules), ""))
        allocator = self._snapshot_allocator
        if allocator is None or snapshot != self._snapshot:
            if len(self._outcomes) > _OUTCOMES_MAX:
                self._outcomes.clear()
            allocator = Allocator(
                [self._validated(s) for s in merged_slices(self.slices.values(), rules)],
                {c["metadata"]["name"]: DeviceClass.model_validate(c) for c in self.classes.values()},
                cache=self._selectors,
                outcomes=self._outcomes,
            )
            self._snapshot, self._snapshot_allocator = snapshot, allocator
        allocator.allocated = held
        return allocator

    def _validated(self, obj: dict[str, Any]) -> ResourceSlice:
        """The slice's model, validated once per name and resourceVersion: a warm pool rewrites
        two or three slices per change, and validating all of them again was most of a new
        snapshot's cost."""
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name")), str(meta.get("resourceVersion"))
        known = self._slice_models.get(name)
        if known is None or known[0] != version:
            known = self._slice_models[name] = (version, ResourceSlice.model_validate(obj))
        return known[1]

    def _score_key(
        self, pod: dict[str, Any], candidates: list[Node], dra: dict[str, int] | None = None
    ) -> Callable[[Node], tuple[int, int, int, str]]:
        """Lower is better: (minus the node's weighted score among ``candidates`` — with ``dra``,
        the normalised DRA score of each feasible node, weighted as upstream — pods of the same
        owner on it, pods on it, its name).

        A pod waiting for its binding conditions counts on the node it is assumed on, as the
        real scheduler's cache assumes it there."""
        owners = {o.get("uid") for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")}
        namespace = pod["metadata"].get("namespace")
        siblings: Counter[str] = Counter()
        everyone: Counter[str] = Counter()
        for other in self.pods.values():
            if other["metadata"].get("deletionTimestamp"):
                continue
            waiting = self._binding.get(_pod_key(other))
            node = (other.get("spec") or {}).get("nodeName") or (waiting.node if waiting else None)
            if not node:
                continue
            everyone[node] += 1
            other_owners = {o.get("uid") for o in other["metadata"].get("ownerReferences") or []}
            if owners & other_owners and other["metadata"].get("namespace") == namespace:
                siblings[node] += 1
        scores = node_scores(pod, candidates, siblings if owners else None, everyone)

        def key(node: Node) -> tuple[int, int, int, str]:
            score = scores[node.name] + DYNAMIC_RESOURCES_WEIGHT * (dra or {}).get(node.name, 0)
            return -score, siblings[node.name], everyone[node.name], node.name

        return key

    async def _reserve(
        self,
        pod: dict[str, Any],
        claims: list[dict[str, Any]],
        allocations: dict[str, dict[str, Any]],
        node: str,
    ) -> list[dict[str, Any]]:
        meta = pod["metadata"]
        consumer = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        written = []
        for cached in claims:
            # Write on top of the server's current object: the cache may trail our own writes.
            claim = await self.kube.get(
                RESOURCE_CLAIMS, cached["metadata"]["name"], cached["metadata"].get("namespace")
            )
            claim_meta = claim["metadata"]
            allocation = allocations.get(claim_meta["name"])
            if allocation is not None and is_allocated(claim):
                raise Conflict(409, "Conflict", f"claim {claim_meta['name']} was allocated meanwhile")
            if allocation is not None and DELETE_PROTECTION not in (claim_meta.get("finalizers") or []):
                finalizers = [*(claim_meta.get("finalizers") or []), DELETE_PROTECTION]
                claim = await self.kube.replace(
                    RESOURCE_CLAIMS, {**claim, "metadata": {**claim_meta, "finalizers": finalizers}}
                )
                self.claims.apply(claim)
            status = dict(claim.get("status") or {})
            if allocation is not None:
                if any(r.get("bindingConditions") for r in allocation["devices"]["results"]):
                    allocation = {**allocation, "allocationTimestamp": _now()}
                status["allocation"] = allocation
            reserved = list(status.get("reservedFor") or [])
            if not any(r.get("uid") == meta["uid"] for r in reserved):
                reserved.append(consumer)
            status["reservedFor"] = reserved
            claim = await self.kube.replace(
                RESOURCE_CLAIMS, {**claim, "status": status}, subresource="status"
            )
            self.claim_cache.assume(claim)
            written.append(claim)
            if allocation is not None:
                devices = ", ".join(f"{r['pool']}/{r['device']}" for r in allocation["devices"]["results"])
                log.info("claim allocated", claim=claim["metadata"]["name"], node=node, devices=devices)
                await self.events.record(
                    pod,
                    "AllocatedDevices",
                    f"claim {claim['metadata']['name']}: {devices or 'no devices'} for node {node}",
                )
        return written

    async def _await_binding_conditions(
        self, pod: dict[str, Any], binding: _Binding, state: _PodState
    ) -> None:
        key = _pod_key(pod)
        failure: str | None = None
        ready = True
        for namespace, name in binding.claims:
            obj = self.claim_cache.get(namespace, name)
            claim = ResourceClaim.read(obj) if obj is not None else None
            if claim is None or not claim.allocated:
                failure = f"claim {name} lost its allocation"
                break
            verdict = _binding_verdict(claim)
            if verdict is False:
                ready = False
            elif isinstance(verdict, str):
                failure = verdict
                break
        if failure is None and not ready and time.monotonic() - binding.started > self.config.binding_timeout:
            failure = f"binding conditions not met within {self.config.binding_timeout:.0f}s"
        if failure is not None:
            await self._unreserve(pod, binding)
            self._binding.pop(key, None)
            await self.events.record(pod, "FailedBinding", f"{failure}; scheduling again", type="Warning")
            return
        if ready:
            self._binding.pop(key, None)
            await self._bind(pod, binding.node)

    async def _unreserve(self, pod: dict[str, Any], binding: _Binding) -> None:
        for namespace, name in binding.claims:
            claim = self.claim_cache.get(namespace, name)
            if claim is None:
                continue
            status = {
                k: v
                for k, v in (claim.get("status") or {}).items()
                if k not in ("allocation", "reservedFor", "devices")
            }
            try:
                updated = await self.kube.replace(
                    RESOURCE_CLAIMS, {**claim, "status": status}, subresource="status"
                )
            except NotFound:
                continue
            self.claim_cache.assume(updated)
            log.info("claim deallocated after failed binding", claim=name, pod=pod["metadata"]["name"])

    async def _bind(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        namespace = meta.get("namespace") or "default"
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": namespace, "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.kube.request("POST", PODS.path(namespace, meta["name"], "binding"), body=binding)
            updated = await self.kube.get(PODS, meta["name"], namespace)
        except NotFound:
            # No pods/binding subresource on this server: set the node directly.
            updated = await self.kube.patch(PODS, meta["name"], {"spec": {"nodeName": node}}, namespace)
        except ApiError as err:
            if err.status not in (404, 405):
                raise
            updated = await self.kube.patch(PODS, meta["name"], {"spec": {"nodeName": node}}, namespace)
        self.pods.apply(updated)
        self._state.pop(_pod_key(pod), None)
        log.info("pod bound", pod=meta["name"], namespace=namespace, node=node)
        await self.events.record(
            pod, "Scheduled", f"Successfully assigned {namespace}/{meta['name']} to {node}"
        )

    async def _unschedulable(self, pod: dict[str, Any], state: _PodState, reason: str) -> None:
        if reason == state.last_reason:
            return
        state.last_reason = reason
        log.info("pod unschedulable", pod=pod["metadata"]["name"], reason=reason)
        await self.events.record(pod, "FailedScheduling", reason, type="Warning")


#: Score plugin weights of the default profile (``pkg/scheduler/apis/config/v1/default_plugins.go``)
NODE_AFFINITY_WEIGHT = 2
POD_TOPOLOGY_SPREAD_WEIGHT = 2
NODE_RESOURCES_FIT_WEIGHT = 1
#: ``DynamicResources`` is listed without a weight, and ``getScoreWeights`` in
#: ``pkg/scheduler/framework/runtime/framework.go`` makes a weight of 0 a 1
DYNAMIC_RESOURCES_WEIGHT = 1
#: ``resourceapi.FirstAvailableDeviceRequestMaxSize``: at most this many subrequests a request
FIRST_AVAILABLE_MAX = 8
#: ``framework.MaxNodeScore``
MAX_NODE_SCORE = 100
#: maxSkew of the hostname constraint in PodTopologySpread's ``systemDefaultConstraints``
_HOSTNAME_MAX_SKEW = 3
#: the kubelet's default ``maxPods``: the capacity the least-allocated approximation counts against
_MAX_PODS = 110


def _node_affinity(pod: dict[str, Any]) -> dict[str, Any]:
    return ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}


def required_affinity_matches(pod: dict[str, Any], node: Node) -> bool:
    """``NodeAffinity``'s Filter for ``requiredDuringSchedulingIgnoredDuringExecution`` (the pod's
    ``nodeSelector`` is checked beside it); a selector that does not parse matches no node, as
    upstream ignores the parse error and finds no match."""
    required = _node_affinity(pod).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    try:
        return selector_matches(NodeSelector.model_validate(required), node)
    except ValidationError:
        return False


def preferred_affinity_score(pod: dict[str, Any], node: Node) -> int:
    """``NodeAffinity``'s raw Score: the sum of the weights of the pod's
    ``preferredDuringSchedulingIgnoredDuringExecution`` terms that match ``node`` (a term of weight
    0, an empty term or one that does not parse counts for nothing: ``NewPreferredSchedulingTerms``)."""
    score = 0
    for term in _node_affinity(pod).get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        weight = int(term.get("weight") or 0)
        if not weight:
            continue
        try:
            selector = NodeSelector.model_validate({"nodeSelectorTerms": [term.get("preference") or {}]})
        except ValidationError:
            continue
        if selector_matches(selector, node):
            score += weight
    return score


def _default_normalize(scores: dict[str, int]) -> dict[str, int]:
    """``helper.DefaultNormalizeScore(MaxNodeScore, false, scores)``: scaled to the highest, in integers."""
    highest = max(scores.values(), default=0)
    if highest == 0:
        return scores
    return {name: MAX_NODE_SCORE * score // highest for name, score in scores.items()}


def _spread_scores(nodes: list[Node], siblings: Counter[str]) -> dict[str, int]:
    """PodTopologySpread's hostname score (``scoreForCount``: matching pods * log(nodes + 2) +
    maxSkew - 1, rounded) and its NormalizeScore: fewer matching pods, higher score."""
    weight = math.log(len(nodes) + 2)
    raw = {n.name: math.floor(siblings[n.name] * weight + (_HOSTNAME_MAX_SKEW - 1) + 0.5) for n in nodes}
    highest, lowest = max(raw.values(), default=0), min(raw.values(), default=0)
    if highest == 0:
        return dict.fromkeys(raw, MAX_NODE_SCORE)
    return {name: MAX_NODE_SCORE * (highest + lowest - score) // highest for name, score in raw.items()}


def node_scores(
    pod: dict[str, Any], nodes: list[Node], siblings: Counter[str] | None, pods: Counter[str]
) -> dict[str, int]:
    """Each node's weighted score among ``nodes`` (the module docstring says what is modelled):
    ``siblings`` counts the pods of the pod's owner per node (None: it has no owner, so no spread
    constraint), ``pods`` every pod per node."""
    if not nodes:
        return {}
    affinity = _default_normalize({n.name: preferred_affinity_score(pod, n) for n in nodes})
    spread = _spread_scores(nodes, siblings) if siblings is not None else dict.fromkeys(affinity, 0)
    return {
        n.name: NODE_AFFINITY_WEIGHT * affinity[n.name]
        + POD_TOPOLOGY_SPREAD_WEIGHT * spread[n.name]
        # the pod itself counts, as upstream adds its request to the node's
        + NODE_RESOURCES_FIT_WEIGHT * MAX_NODE_SCORE * max(_MAX_PODS - pods[n.name] - 1, 0) // _MAX_PODS
        for n in nodes
    }


def _allocate_on(
    allocator: Allocator, to_allocate: list[ClaimToAllocate], node: Node, reasons: dict[str, str]
) -> dict[str, dict[str, Any]] | None:
    """The claims' allocations on ``node`` by claim name, or None with the reason in ``reasons``."""
    try:
        results = allocator.allocate(to_allocate, node)
    except AllocationError as err:
        reasons[node.name] = str(err)
        return None
    if results is None:
        reasons[node.name] = "cannot allocate all claims"
        return None
    return {r.claim.name: r.body for r in results}


def first_available_score(claims: list[dict[str, Any]], allocations: Mapping[str, dict[str, Any]]) -> int:
    """The DRA plugin's raw ``Score`` of a node (``computeScore`` in ``pkg/scheduler/framework/
    plugins/dynamicresources/dynamicresources.go``): for each of the pod's claims, each
    ``firstAvailable`` request adds ``FirstAvailableDeviceRequestMaxSize - i`` for the subrequest
    ``i`` its allocation used; ``exactly`` requests add nothing. ``allocations`` are the
    allocations found on the node, by claim name; a claim allocated before keeps its own."""
    score = 0
    for claim in claims:
        name = claim["metadata"]["name"]
        body = allocations.get(name) or ((claim.get("status") or {}).get("allocation") or {})
        used = {str(r.get("request")) for r in (body.get("devices") or {}).get("results") or ()}
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            for index, sub in enumerate(request.get("firstAvailable") or ()):
                if f"{request.get('name')}/{sub.get('name')}" in used:
                    score += FIRST_AVAILABLE_MAX - index
    return score


def _pod_key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}/{pod['metadata'].get('uid')}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _allocation_allows(claim: dict[str, Any], node: Node) -> bool:
    view = ResourceClaim.read(claim)
    allocation = view.status.allocation if view is not None else None
    if allocation is None or not allocation.node_selector:
        return True
    return selector_matches(NodeSelector.model_validate(allocation.node_selector), node)


def _has_binding_conditions(claim: dict[str, Any]) -> bool:
    view = ResourceClaim.read(claim)
    allocation = view.status.allocation if view is not None else None
    return allocation is not None and allocation.has_binding_conditions


def _binding_verdict(claim: ResourceClaim) -> bool | str:
    """True when every binding condition is met, False while waiting, a message on failure.

    ``isClaimReadyForBinding`` in the scheduler plugin: a device's status entry is matched by
    driver/pool/device (and share ID); any failure condition that is True fails the binding.
    """
    for result in claim.results:
        if not result.binding_conditions:
            continue
        entry = claim.status.device_status(result)
        if entry is None:
            return False
        for failure in result.binding_failure_conditions:
            condition = entry.condition(failure)
            if condition is not None and condition.status == "True":
                return (
                    f"claim {claim.metadata.name} binding failed: "
                    f"reason={condition.reason}, message={condition.message!r}"
                )
        if not all(entry.is_true(wanted) for wanted in result.binding_conditions):
            return False
    return True
