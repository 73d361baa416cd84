"""Bindings fabric-dra made that nothing explains any more.

**Orphans.** Normally the kubelet's NodeUnprepareResources makes the plugin detach a claim's
devices. When that never happens — the claim was deleted while its node was down, the node is
gone, the plugin lost its checkpoint — the device would stay bound for nothing. The leader's
:class:`OrphanReconciler` looks at every binding fabric-dra made (a ``bound`` ledger entry) every
``interval`` seconds. The binding is *in use*, and never touched, while any of these holds:

* its ResourceClaim (same UID) exists, its allocation includes the device, and it is reserved
  for a pod (``status.reservedFor``) — the pod may run or be about to;
* its ResourceClaim exists and allocates the device with binding conditions (the binding-condition
  flow: the controller attached it and the scheduler waits in PreBind before it reserves);
* its ResourceClaim exists and the plugin of the bound node reported the claim prepared with this
  device within the last ``report_ttl`` seconds (``PUT /api/v1/nodes/{node}/claims``): a container
  may be using it, whatever the claim's status says. A report for a claim that does not exist
  counts for nothing — else a plugin could keep any device by reporting a made-up claim.

A binding that is none of these for ``grace`` seconds without a break is detached as its holder
would detach it, with a Warning Event (``events.k8s.io/v1``) and the counter
``fabric_dra_orphans_detached_total{reason}``; when first found it gets an Event saying when it
will be released. A new leader judges a node's plugin silent only after ``report_ttl`` seconds of
its own, so a fail-over never costs a pod its device. Without API access, or while claims cannot
be listed, nothing is judged (so nothing is detached).

**Partitions and shares.** Each holder of a GPU serving partitions is judged on its own, as a
binding of its partition device to the GPU's node: an abandoned holder is released as its plugin
would release it (the GPU is unbound with its last holder). A share of a memory pool is judged by
its pool device *and* its shareID: the claim's allocation must still name that share (a claim
allocated anew gets another shareID), and a plugin's report counts for the claim's pool device on
the share's node.

**Bindings made outside fabric-dra** (on the fabric, with no ledger entry) are never touched by
anything here: they have no claim to explain them, and :class:`fabric.bindings.reconcile.ForeignBindings`
reports them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabric.bindings.attachments import Attachments
from fabric.state.ledger import LedgerEntry, LedgerState
from fabric.state.metrics import ManagerMetrics
from fabric.state.reports import PluginReports
from manager_api.errors import FabricError
from plumbing.kube.client import ApiError, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.kube.resources import RESOURCE_API_VERSIONS, RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = ["Held", "OrphanReconciler", "held_of"]

log = get_logger(__name__)

#: why a binding is an orphan → how the Event and the log say it
_REASONS = {
    "claim-deleted": "its ResourceClaim {claim} no longer exists",
    "not-allocated": "its ResourceClaim {claim} no longer allocates it to this node",
    "not-reserved": "its ResourceClaim {claim} allocates it but is reserved for no pod",
}


@dataclass(frozen=True)
class Held:
    """One thing a claim holds that a plugin releases: a whole device, a partition of a GPU, or a
    share of a memory pool — the device the claim's allocation names (a partition's, a pool's)."""

    #: what the reconciler tracks it by: the ledger key (a share's ``<pool>/<shareID>``), or the
    #: partition's device name
    key: str
    device: str
    node: str
    claim_uid: str
    share_id: str | None = None
    #: a partition's GPU
    gpu: str | None = None

    @property
    def label(self) -> str:
        """How an Event names it: ``device gpu0``, ``partition gpu0-1g10gb-3 of GPU gpu0``,
        ``share <id> of memory pool cxlpool0-pool``."""
        if self.share_id is not None:
            return f"share {self.share_id} of memory pool {self.device}"
        if self.gpu is not None:
            return f"partition {self.device} of GPU {self.gpu}"
        return f"device {self.device}"


def held_of(entry: LedgerEntry) -> list[Held]:
    """What ``entry`` holds for claims: its device, its share, or every partition holder of its GPU."""
    if entry.partition_held:
        gpu, node = entry.device, entry.node
        return [Held(h.partition, h.partition, node, h.claim_uid, gpu=gpu) for h in entry.partitions]
    if entry.share is not None:
        return [Held(entry.device, entry.share.pool, entry.node, entry.claim_uid, entry.share.share_id)]
    return [Held(entry.device, entry.device, entry.node, entry.claim_uid)]


@dataclass
class _Candidate:
    claim_uid: str
    reason: str
    since: float
    announced: bool = False


@dataclass
class _Claims:
    """The cluster's ResourceClaims, by UID."""

    by_uid: dict[str, dict[str, Any]] = field(default_factory=dict)


def _claim_name(claim: Mapping[str, Any] | None, uid: str) -> str:
    meta = (claim or {}).get("metadata") or {}
    if meta.get("name"):
        return f"{meta.get('namespace')}/{meta.get('name')} ({uid})"
    return uid


class OrphanReconciler:
    def __init__(
        self,
        kube: KubeClient,
        attachments: Attachments,
        *,
        grace_seconds: float,
        interval: float,
        reports: PluginReports,
        metrics: ManagerMetrics | None = None,
        events: EventRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.attachments = attachments
        self.grace_seconds = grace_seconds
        self.interval = interval
        self.reports = reports
        self.metrics = metrics
        self.events = events
        self._clock = clock
        self._version: str | None = None
        self._candidates: dict[str, _Candidate] = {}
        self._leading_since: float | None = None

    async def claims(self) -> _Claims | None:
        """Every ResourceClaim in the cluster; None when they cannot be listed."""
        versions = [self._version] if self._version else list(RESOURCE_API_VERSIONS)
        for version in versions:
            try:
                items, _ = await self.kube.list_all(RESOURCE_CLAIMS.with_version(str(version)))
            except NotFound:
                continue
            except ApiError as err:
                log.warning("cannot list ResourceClaims; orphan check skipped", error=str(err))
                return None
            self._version = version
            found = _Claims()
            for item in items:
                uid = str((item.get("metadata") or {}).get("uid") or "")
                if uid:
                    found.by_uid[uid] = item
            return found
        log.warning("the API server serves no resource.k8s.io ResourceClaims; orphan check skipped")
        return None

    def why_orphan(self, held: Held, claims: _Claims) -> str | None:
        """None while something explains what ``held`` is; else the reason it is an orphan."""
        claim = claims.by_uid.get(held.claim_uid)
        if claim is None:
            # A report cannot keep a claim alive that does not exist: a plugin could report made-up
            # claims to hold devices for ever.
            return "claim-deleted"
        if self.reports.holds(held.node, held.claim_uid, held.device):
            return None
        view = ResourceClaim.read(claim)
        if view is None:
            return None  # not readable as a claim: nothing proves the binding is an orphan
        result = next(
            (
                r
                for r in view.results
                if r.device == held.device and (held.share_id is None or r.share_id == held.share_id)
            ),
            None,
        )
        allocation = view.status.allocation
        node = allocation.node if allocation is not None else None
        if result is None or (node is not None and node != held.node):
            return "not-allocated"  # deallocated, or allocated anew (on another node, another share)
        if view.status.reserved_for or result.binding_conditions:
            return None
        return "not-reserved"

    def in_grace(self) -> int:
        """Bindings judged orphans and not detached yet (stranded capacity, :mod:`fabric.bindings.usage`)."""
        return len(self._candidates)

    def _forget(self) -> None:
        self._candidates.clear()
        self._leading_since = None
        if self.metrics is not None:
            self.metrics.orphan_bindings.set(0)

    async def sweep(self) -> list[str]:
        """One pass; returns the devices whose detach it started."""
        if not self.attachments.is_leader():
            self._forget()
            return []
        now = self._clock()
        if self._leading_since is None:
            self._leading_since = now
        claims = await self.claims()
        if claims is None:
            return []
        # Each holder of a GPU serving partitions is judged on its own (the GPU goes with its last).
        bound = {
            held.key: held
            for e in self.attachments.ledger.entries()
            if e.state is LedgerState.BOUND
            for held in held_of(e)
        }
        for key in set(self._candidates) - set(bound):
            del self._candidates[key]
        detached: list[str] = []
        for key, held in bound.items():
            reason = self.why_orphan(held, claims)
            previous = self._candidates.get(key)
            if reason is None:
                if previous is not None:
                    log.info("binding explained again; not an orphan", device=key, claim=held.claim_uid)
                    del self._candidates[key]
                continue
            if previous is None or previous.claim_uid != held.claim_uid:
                previous = self._candidates[key] = _Candidate(held.claim_uid, reason, now)
            previous.reason = reason
            claim = claims.by_uid.get(held.claim_uid)
            if not previous.announced:
                previous.announced = True
                await self._announce(held, claim, previous)
            # A node's plugin counts as silent only once this leader has waited a report period.
            if now - previous.since < self.grace_seconds or now - self._leading_since < self.reports.ttl:
                continue
            if await self._detach(held, claim, previous):
                detached.append(key)
        if self.metrics is not None:
            self.metrics.orphan_bindings.set(len(self._candidates))
        return detached

    def _describe(self, held: Held, claim: Mapping[str, Any] | None, candidate: _Candidate) -> str:
        return _REASONS[candidate.reason].format(claim=_claim_name(claim, held.claim_uid))

    def _refs(self, held: Held, claim: Mapping[str, Any] | None) -> tuple[ObjectRef, ObjectRef | None]:
        node = ObjectRef(kind="Node", name=held.node)
        if claim is None:
            return node, None
        meta = claim.get("metadata") or {}
        ref = ObjectRef(
            kind="ResourceClaim",
            api_version=f"resource.k8s.io/{self._version or 'v1'}",
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            uid=held.claim_uid,
        )
        return ref, node

    async def _announce(self, held: Held, claim: Mapping[str, Any] | None, candidate: _Candidate) -> None:
        why = self._describe(held, claim, candidate)
        log.warning(
            "orphaned binding found; it is detached unless something uses it again",
            device=held.key,
            node=held.node,
            claim=held.claim_uid,
            reason=candidate.reason,
            grace_seconds=self.grace_seconds,
        )
        await self._event(
            held,
            claim,
            "OrphanedBinding",
            "Found",
            f"{held.label} is bound to node {held.node} for claim {held.claim_uid}, "
            f"but {why} and the node's plugin does not report it prepared; it will be detached in "
            f"{self.grace_seconds:.0f}s unless a claim or the plugin explains it again",
        )

    async def _detach(self, held: Held, claim: Mapping[str, Any] | None, candidate: _Candidate) -> bool:
        why = self._describe(held, claim, candidate)
        try:
            # as its plugin would: the partition device, or the pool with the shareID
            await self.attachments.detach(
                held.device, held.claim_uid, held.node, wait=0, share_id=held.share_id
            )
        except FabricError as err:
            log.warning("orphan detach not started; will retry", device=held.key, error=err.message)
            return False
        del self._candidates[held.key]
        unexplained = self._clock() - candidate.since
        log.warning(
            "detaching an orphaned binding",
            device=held.key,
            node=held.node,
            claim=held.claim_uid,
            reason=candidate.reason,
            unexplained_seconds=round(unexplained, 1),
        )
        if self.metrics is not None:
            self.metrics.orphans_detached.labels(candidate.reason).inc()
        await self._event(
            held,
            claim,
            "OrphanDetached",
            "Detach",
            f"released {held.label} from node {held.node}: it was bound for claim "
            f"{held.claim_uid}, but {why} and the node's plugin has not reported it prepared "
            f"for {unexplained:.0f}s; it returns to the pool",
        )
        return True

    async def _event(
        self, held: Held, claim: Mapping[str, Any] | None, reason: str, action: str, note: str
    ) -> None:
        """A Warning Event about the binding of ``held``: on its claim (the node related), or on
        the node when the claim is gone."""
        if self.events is not None:
            regarding, related = self._refs(held, claim)
            await self.events.record(
                regarding, reason=reason, action=action, event_type="Warning", related=related, note=note
            )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep()
            except FabricError as err:
                log.warning("orphan check failed; retrying", error=err.message)
            except Exception:
                log.exception("orphan check crashed; retrying")
