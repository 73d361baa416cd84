"""Scheduler: bind pending pods to a node where all their claims can be allocated.

Mirrors kube-scheduler's DRA plugin (``pkg/scheduler/framework/plugins/dynamicresources``):

- Filter: a node fits when every allocated claim's ``allocation.nodeSelector`` matches it
  and the pod's unallocated claims can be allocated together there
  (:class:`dra_driver.selection.Allocator`, the same code as ``fabric-dra explain``);
- PreBind: add the ``resource.kubernetes.io/delete-protection`` finalizer, then write
  ``status.allocation`` and ``status.reservedFor`` in one status update (optimistic
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
- Score: among the nodes that fit, the one with the fewest pods of the same owner, then the
  fewest pods (the default ``PodTopologySpread`` system constraints spread a workload's pods
  over hostnames — ``systemDefaultConstraints`` in
  ``pkg/scheduler/framework/plugins/podtopologyspread/plugin.go``; ``NodeResourcesFit``
  prefers the least allocated node, ``noderesources/least_allocated.go``), then by name where
  the real scheduler picks at random among equal scores (``selectHost`` in
  ``pkg/scheduler/schedule_one.go``). So pods sharing one claim land on different
  nodes unless its allocation's ``nodeSelector`` pins them (``bindsToNode`` or node-local
  devices: ``createNodeSelector`` in ``.../structured/internal/incubating/allocator_incubating.go``
  pins for ``bindsToNode`` with or without binding conditions) — as in a real cluster;
- Bind: the ``pods/binding`` subresource, or setting ``spec.nodeName`` where the server has
  no such subresource.

Pods that stay unschedulable get a ``FailedScheduling`` event naming the reason per node, as
the real scheduler's "0/3 nodes are available: …" message.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_driver.selection import (
    AllocationError,
    Allocator,
    ClaimToAllocate,
    DeviceClass,
    Node,
    ResourceClaimSpec,
    ResourceSlice,
    allocated_devices,
)
from dra_driver.selection.model import NodeSelector
from dra_driver.selection.nodes import selector_matches
from kube_standin.cluster.claims import DELETE_PROTECTION, pod_claim_names
from kube_standin.cluster.events import EventRecorder
from plumbing.kube import ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim, is_allocated
from plumbing.kube.informer import Informer, reconcile_passes
from plumbing.kube.resources import PODS, RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = ["Scheduler", "SchedulerConfig"]

log = get_logger(__name__)


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
    ) -> None:
        self.kube = kube
        self.pods, self.nodes, self.claims, self.slices, self.classes = pods, nodes, claims, slices, classes
        self.events = events
        self.config = config or SchedulerConfig()
        self._binding: dict[str, _Binding] = {}
        self._state: dict[str, _PodState] = {}

    async def run(self) -> None:
        informers = (self.pods, self.nodes, self.claims, self.slices, self.classes)
        await reconcile_passes("scheduling pass", informers, self.schedule_pending, resync=1.0)

    async def schedule_pending(self) -> None:
        pending = [
            p
            for p in self.pods.values()
            if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]
        for key in list(self._state):
            if not any(_pod_key(p) == key for p in pending):
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
        for entry, claim_name in pod_claim_names(pod).items():
            claim = self.claims.get(namespace, claim_name) if claim_name else None
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
        own = {f"{c['metadata'].get('namespace')}/{c['metadata']['name']}" for c in claims}
        held = allocated_devices(self.claims.values(), exclude=own)
        allocator = Allocator(
            [ResourceSlice.model_validate(s) for s in self.slices.values()],
            {c["metadata"]["name"]: DeviceClass.model_validate(c) for c in self.classes.values()},
            held,
        )
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
        # Filter is binary and Score does not depend on the allocation, so trying the nodes in
        # score order and taking the first that fits is what Filter-then-Score would choose.
        for raw in sorted(self.nodes.values(), key=self._score_key(pod)):
            node = Node.model_validate(raw)
            if (raw.get("spec") or {}).get("unschedulable"):
                reasons[node.name] = "unschedulable"
                continue
            if any(node.metadata.labels.get(k) != v for k, v in pod_selector.items()):
                reasons[node.name] = "does not match the pod's nodeSelector"
                continue
            mismatch = next((c for c in claims if not _allocation_allows(c, node)), None)
            if mismatch is not None:
                reasons[node.name] = f"claim {mismatch['metadata']['name']} is allocated for other nodes"
                continue
            if not to_allocate:
                return node.name, {}, reasons
            try:
                results = allocator.allocate(to_allocate, node)
            except AllocationError as err:
                reasons[node.name] = str(err)
                continue
            if results is None:
                reasons[node.name] = "cannot allocate all claims"
                continue
            return node.name, {r.claim.name: r.body for r in results}, reasons
        return None, {}, reasons

    def _score_key(self, pod: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[int, int, str]]:
        """Lower is better: (pods of the same owner on the node, pods on the node, node name).

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

        def score(node: dict[str, Any]) -> tuple[int, int, str]:
            name = str(node["metadata"]["name"])
            return siblings[name], everyone[name], name

        return score

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
            self.claims.apply(claim)
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
            obj = self.claims.get(namespace, name)
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
            claim = self.claims.get(namespace, name)
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
            self.claims.apply(updated)
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
