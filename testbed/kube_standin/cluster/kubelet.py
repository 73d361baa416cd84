"""The kubelet's part for DRA: prepare a pod's claims on its node before it runs, unprepare them
before it goes away.

For each node: pods bound to it get the stand-in's finalizer ``fabric-dra.io/stand-in-kubelet``
(so the pod object outlives its unprepare, which a real kubelet achieves by deleting the pod
itself only after its containers and resources are gone); their claims — which must list the
pod in ``reservedFor`` — are prepared with ``NodePrepareResources`` on each claim's drivers,
and the pod is set Running (phase, conditions, container statuses). A failure leaves the pod
Pending with a ``FailedPrepareDynamicResources`` event carrying the plugin's error and is
retried with back-off, as the kubelet does. When the pod is being deleted,
``NodeUnprepareResources`` runs first, then the finalizer is removed.

Pods of one node are worked on concurrently, one worker per pod UID, as the kubelet's pod
workers do (``pkg/kubelet/pod_workers.go``: ``UpdatePod`` starts a goroutine running
``podWorkerLoop`` per pod UID and signals it through a channel of capacity one; the worker then
syncs the latest state of its pod). A pod's own steps — finalizer, prepare, Running, later
unprepare and finalizer removal — run in order inside its worker and never overlap; different
pods' ``NodePrepareResources`` calls do overlap, as in the kubelet, whose DRA manager
(``pkg/kubelet/cm/dra/manager.go``, ``prepareResources``) holds its claim info cache lock only
while it records claims, not across the plugin call. At most ``max_workers`` pods sync at once
(default 110, the kubelet's default ``maxPods``).

The node's plugins are found the kubelet's way: sockets in the node's plugin registry dir
answer ``pluginregistration.Registration/GetInfo`` with their driver name, DRA endpoint and
supported versions (``v1.DRAPlugin`` preferred over ``v1beta1.DRAPlugin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kube_standin.cluster.claims import pod_claim_names
from kube_standin.cluster.events import EventRecorder
from kube_standin.kubelet_client import ClaimRef, DRAPluginClient, KubeletError, PluginManager
from plumbing.backoff import Backoff
from plumbing.kube import ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.informer import Informer, object_key, wait_any
from plumbing.kube.resources import PODS
from plumbing.logs import get_logger

__all__ = ["KUBELET_FINALIZER", "ClaimRef", "DraNodeClient", "KubeletLoop", "PluginManagerClient"]

log = get_logger(__name__)

KUBELET_FINALIZER = "fabric-dra.io/stand-in-kubelet"


class DraNodeClient(Protocol):
    """Talks to the DRA plugins of one node; errors are per claim (empty string: success)."""

    async def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]: ...

    async def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]: ...

    async def close(self) -> None: ...


class PluginNotRegistered(KubeletError):
    """No plugin of the driver is registered with this kubelet (the kubelet's own words)."""


class PluginManagerClient:
    """A node's DRA plugins reached through the kubelet-protocol client (:mod:`kube_standin.kubelet_client`):
    registration from the node's registry dir, service-version choice and the calls themselves
    happen there exactly as the kubelet makes them; this adapter only groups answers per claim."""

    def __init__(self, registry_dir: Path, *, register_within: float = 5.0) -> None:
        self.manager = PluginManager(registry_dir, watch_health=False)
        self.register_within = register_within
        self._task: asyncio.Task[None] | None = None

    async def _client(self, driver: str) -> DRAPluginClient:
        if self._task is None:
            self._task = asyncio.create_task(self.manager.run(), name=f"plugins:{self.manager.registry_dir}")
        client = self.manager.plugin(driver)
        if client is not None:
            return client
        try:
            return await self.manager.wait_for_plugin(driver, within=self.register_within)
        except KubeletError as err:
            # The kubelet's own words for a claim whose driver has no plugin on the node.
            raise PluginNotRegistered(
                f"driver name {driver} not found in the list of registered DRA drivers: {err}"
            ) from err

    async def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        results = await (await self._client(driver)).node_prepare_resources(claims)
        return _errors(claims, {uid: result.error for uid, result in results.items()})

    async def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        errors = await (await self._client(driver)).node_unprepare_resources(claims)
        return _errors(claims, errors)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def _cancel_until_done(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that went on.

    A task's cancel can be lost: on Python 3.11 a task awaiting another task is not cancelled
    itself when the awaited one catches the cancel and returns (``Task.cancel`` hands it to
    ``_fut_waiter`` only), and grpc's aio unary call does exactly that (``UnaryUnaryCall._invoke``
    in ``grpc/aio/_call.py`` catches ``CancelledError`` and returns the answer it has). A pod
    worker that lost its cancel in ``NodePrepareResources`` would go back to waiting for its
    next wake, which never comes, and the kubelet would never stop."""
    while tasks:
        for task in tasks:
            task.cancel()
        done, tasks = await asyncio.wait(tasks, timeout=0.5)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a worker logs its own errors where they happen


@dataclass
class _PodProgress:
    prepared: list[tuple[str, ClaimRef]] = field(default_factory=list)
    next_try: float = 0.0
    #: the kubelet retries a pod's failed prepare (and unprepare) with growing pauses
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=10.0, jitter=0))
    last_error: str = ""


@dataclass(eq=False)
class _PodWorker:
    """One pod's worker (the kubelet's per-UID goroutine): woken by the node's loop, it syncs its
    pod from the cache, one sync at a time."""

    key: str  # namespace/name in the pods cache
    uid: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    progress: _PodProgress = field(default_factory=_PodProgress)
    task: asyncio.Task[None] | None = None
    #: the pod's resourceVersion when the worker was last woken
    woken_at: str = ""


#: the kubelet's default ``maxPods``: a node never has more pods, so never more pod workers at work
MAX_POD_WORKERS = 110


class KubeletLoop:
    """The stand-in kubelet of one node: one worker per pod UID (at most ``max_workers`` syncing at
    once), so a slow prepare of one pod does not hold up the node's other pods."""

    def __init__(
        self,
        kube: KubeClient,
        node: str,
        pods: Informer,
        claims: Informer,
        client: DraNodeClient,
        events: EventRecorder,
        *,
        max_workers: int = MAX_POD_WORKERS,
    ) -> None:
        self.kube = kube
        self.node = node
        self.pods = pods
        self.claims = claims
        self.client = client
        self.events = events
        self._workers: dict[str, _PodWorker] = {}
        self._slots = asyncio.Semaphore(max_workers)
        self._stopping = False

    async def run(self) -> None:
        wakes = [self.pods.listen(), self.claims.listen()]
        await self.pods.synced.wait()
        await self.claims.synced.wait()
        try:
            while True:
                await wait_any(*wakes, resync=0.5)
                for wake in wakes:
                    wake.clear()
                self._dispatch()
        finally:
            self._stopping = True
            await _cancel_until_done({w.task for w in self._workers.values() if w.task is not None})
            await self.client.close()

    def _dispatch(self) -> None:
        """Wake the worker of each pod of this node that changed or still has work (starting the
        missing workers), and the workers whose pod left the cache, so they end: the kubelet's
        ``UpdatePod``. A Running pod that did not change has nothing to do; one still preparing
        or being deleted is woken every pass, for its claims may have changed or its back-off
        ended."""
        seen: set[str] = set()
        for pod in self.pods.values():
            if (pod.get("spec") or {}).get("nodeName") != self.node:
                continue
            meta = pod["metadata"]
            uid = str(meta["uid"])
            seen.add(uid)
            worker = self._workers.get(uid)
            if worker is None:
                worker = _PodWorker(object_key(pod), uid)
                worker.task = asyncio.create_task(
                    self._work(worker), name=f"kubelet:{self.node}:{worker.key}"
                )
                self._workers[uid] = worker
            version = str(meta.get("resourceVersion") or "")
            settled = (pod.get("status") or {}).get("phase") == "Running" and not meta.get(
                "deletionTimestamp"
            )
            if version != worker.woken_at or not settled:
                worker.woken_at = version
                worker.wake.set()
        for uid, worker in self._workers.items():
            if uid not in seen:
                worker.wake.set()

    def _current(self, worker: _PodWorker) -> dict[str, Any] | None:
        """The worker's pod as the cache has it now; None once it left the cache or this node."""
        pod = self.pods.items.get(worker.key)  # read only, as the node's loop reads the cache
        if pod is None or pod["metadata"].get("uid") != worker.uid:
            return None
        if (pod.get("spec") or {}).get("nodeName") != self.node:
            return None
        return pod

    async def _work(self, worker: _PodWorker) -> None:
        try:
            while True:
                await worker.wake.wait()
                worker.wake.clear()
                pod = self._current(worker)
                if pod is None or self._stopping:
                    return
                async with self._slots:
                    await self._sync_guarded(pod, worker)
        finally:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]

    async def _sync_guarded(self, pod: dict[str, Any], worker: _PodWorker) -> None:
        try:
            await self.sync(pod, worker.progress)
        except (Conflict, NotFound):
            worker.wake.set()  # a stale copy: try again with the cache's next one
        except ApiError as err:
            log.warning("kubelet sync failed", node=self.node, pod=pod["metadata"]["name"], error=str(err))
        except Exception:  # a bug must not stop the kubelet; log it and go on
            log.exception("unexpected error; continuing", node=self.node, pod=pod["metadata"]["name"])
            await asyncio.sleep(1.0)

    async def sync(self, pod: dict[str, Any], progress: _PodProgress) -> None:
        """One pass over one pod: finalizer, prepare and Running, or unprepare and release."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            await self._terminate(pod, progress)
            return
        if KUBELET_FINALIZER not in (meta.get("finalizers") or []):
            updated = await self.kube.patch(
                PODS,
                meta["name"],
                {
                    "metadata": {
                        "finalizers": [*(meta.get("finalizers") or []), KUBELET_FINALIZER],
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
                meta.get("namespace"),
            )
            self.pods.apply(updated)
            pod = updated
        if (pod.get("status") or {}).get("phase") == "Running" or time.monotonic() < progress.next_try:
            return
        claims, problem = self._claims_of(pod)
        if problem is None:
            problem = await self._prepare(claims, progress)
        if problem is not None:
            progress.next_try = time.monotonic() + progress.backoff.next()
            if problem != progress.last_error:
                progress.last_error = problem
                await self.events.record(pod, "FailedPrepareDynamicResources", problem, type="Warning")
            return
        await self._set_running(pod)

    def _claims_of(self, pod: dict[str, Any]) -> tuple[list[tuple[str, ClaimRef]], str | None]:
        meta = pod["metadata"]
        namespace = meta.get("namespace") or "default"
        found: list[tuple[str, ClaimRef]] = []
        for entry, name in pod_claim_names(pod).items():
            obj = self.claims.get(namespace, name) if name else None
            claim = ResourceClaim.read(obj) if obj is not None else None
            if claim is None:
                return [], f"claim for entry {entry} not found"
            if not claim.reserved_for_uid(meta["uid"]):
                return [], f"pod {meta['name']} is not reserved for claim {name}"
            ref = ClaimRef(namespace, claim.metadata.name, claim.metadata.uid)
            for driver in sorted(claim.drivers()):
                found.append((driver, ref))
        return found, None

    async def _prepare(self, claims: list[tuple[str, ClaimRef]], progress: _PodProgress) -> str | None:
        by_driver: dict[str, list[ClaimRef]] = {}
        for driver, ref in claims:
            by_driver.setdefault(driver, []).append(ref)
        for driver, refs in by_driver.items():
            try:
                errors = await self.client.prepare(driver, refs)
            except (KubeletError, OSError) as err:
                return f"prepare dynamic resources: NodePrepareResources for {driver}: {err}"
            for ref in refs:
                if (driver, ref) not in progress.prepared:
                    progress.prepared.append((driver, ref))  # unprepare even a partial prepare
            failed = {uid: e for uid, e in errors.items() if e}
            if failed:
                names = {r.uid: r.name for r in refs}
                return "prepare dynamic resources: " + "; ".join(
                    f"NodePrepareResources failed for claim {names.get(uid, uid)}: {e}"
                    for uid, e in failed.items()
                )
            log.info("claims prepared", node=self.node, driver=driver, claims=[r.name for r in refs])
        return None

    async def _set_running(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        containers = (pod.get("spec") or {}).get("containers") or []
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        status = {
            "phase": "Running",
            "startTime": now,
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": c.get("name", f"c{i}"),
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for i, c in enumerate(containers)
            ],
        }
        updated = await self.kube.patch(
            PODS, meta["name"], {"status": status}, meta.get("namespace"), subresource="status"
        )
        self.pods.apply(updated)
        log.info("pod running", node=self.node, pod=meta["name"])
        await self.events.record(pod, "Started", f"Started pod on {self.node} with its claims prepared")

    async def _terminate(self, pod: dict[str, Any], progress: _PodProgress) -> None:
        meta = pod["metadata"]
        if KUBELET_FINALIZER not in (meta.get("finalizers") or []):
            return
        claims, _ = self._claims_of(pod)
        to_unprepare = list(dict.fromkeys([*progress.prepared, *claims]))
        by_driver: dict[str, list[ClaimRef]] = {}
        for driver, ref in to_unprepare:
            by_driver.setdefault(driver, []).append(ref)
        for driver, refs in by_driver.items():
            try:
                errors = await self.client.unprepare(driver, refs)
            except (KubeletError, OSError) as err:
                await self._unprepare_failed(
                    pod, progress, f"NodeUnprepareResources for driver {driver}: {err}"
                )
                return
            failed = [e for e in errors.values() if e]
            if failed:
                await self._unprepare_failed(pod, progress, "; ".join(failed))
                return
            log.info("claims unprepared", node=self.node, driver=driver, claims=[r.name for r in refs])
        finalizers = [f for f in meta.get("finalizers") or [] if f != KUBELET_FINALIZER]
        updated = await self.kube.patch(
            PODS,
            meta["name"],
            {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}},
            meta.get("namespace"),
        )
        progress.prepared.clear()
        if (updated.get("metadata") or {}).get("deletionTimestamp") and not finalizers:
            self.pods.forget(updated)

    async def _unprepare_failed(self, pod: dict[str, Any], progress: _PodProgress, problem: str) -> None:
        if problem != progress.last_error:
            progress.last_error = problem
            await self.events.record(pod, "FailedUnprepareDynamicResources", problem, type="Warning")
        await progress.backoff.sleep(at_most=2.0)


def _errors(claims: Sequence[ClaimRef], answered: dict[str, str]) -> dict[str, str]:
    return {c.uid: answered.get(c.uid, "the plugin returned no result for this claim") for c in claims}
