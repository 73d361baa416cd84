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

__all__ = ["OrphanReconciler"]

log = get_logger(__name__)

#: why a binding is an orphan → how the Event and the log say it
_REASONS = {
    "claim-deleted": "its ResourceClaim {claim} no longer exists",
    "not-allocated": "its ResourceClaim {claim} no longer allocates it to this node",
    "not-reserved": "its ResourceClaim {claim} allocates it but is reserved for no pod",
}


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

    def why_orphan(self, entry: LedgerEntry, claims: _Claims) -> str | None:
        """None while something explains the binding; else the reason it is an orphan."""
        claim = claims.by_uid.get(entry.claim_uid)
        if claim is None:
            # A report cannot keep a claim alive that does not exist: a plugin could report made-up
            # claims to hold devices for ever.
            return "claim-deleted"
        # a share's entry is keyed by the share; the claim allocates its pool
        device = entry.share.pool if entry.share is not None else entry.device
        if self.reports.holds(entry.node, entry.claim_uid, device):
            return None
        view = ResourceClaim.read(claim)
        if view is None:
            return None  # not readable as a claim: nothing proves the binding is an orphan
        result = next((r for r in view.results if r.device == device), None)
        allocation = view.status.allocation
        node = allocation.node if allocation is not None else None
        if result is None or (node is not None and node != entry.node):
            return "not-allocated"  # deallocated, or allocated anew on another node
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
        # A GPU serving partitions is released by its holders' claims (each a partition device),
        # not judged as one binding here.
        bound = {
            e.device: e
            for e in self.attachments.ledger.entries()
            if e.state is LedgerState.BOUND and not e.partition_held
        }
        for device in set(self._candidates) - set(bound):
            del self._candidates[device]
        detached: list[str] = []
        for device, entry in bound.items():
            reason = self.why_orphan(entry, claims)
            previous = self._candidates.get(device)
            if reason is None:
                if previous is not None:
                    log.info("binding explained again; not an orphan", device=device, claim=entry.claim_uid)
                    del self._candidates[device]
                continue
            if previous is None or previous.claim_uid != entry.claim_uid:
                previous = self._candidates[device] = _Candidate(entry.claim_uid, reason, now)
            previous.reason = reason
            claim = claims.by_uid.get(entry.claim_uid)
            if not previous.announced:
                previous.announced = True
                await self._announce(entry, claim, previous)
            # A node's plugin counts as silent only once this leader has waited a report period.
            if now - previous.since < self.grace_seconds or now - self._leading_since < self.reports.ttl:
                continue
            if await self._detach(entry, claim, previous):
                detached.append(device)
        if self.metrics is not None:
            self.metrics.orphan_bindings.set(len(self._candidates))
        return detached

    def _describe(self, entry: LedgerEntry, claim: Mapping[str, Any] | None, candidate: _Candidate) -> str:
        return _REASONS[candidate.reason].format(claim=_claim_name(claim, entry.claim_uid))

    def _refs(
        self, entry: LedgerEntry, claim: Mapping[str, Any] | None
    ) -> tuple[ObjectRef, ObjectRef | None]:
        node = ObjectRef(kind="Node", name=entry.node)
        if claim is None:
            return node, None
        meta = claim.get("metadata") or {}
        ref = ObjectRef(
            kind="ResourceClaim",
            api_version=f"resource.k8s.io/{self._version or 'v1'}",
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            uid=entry.claim_uid,
        )
        return ref, node

    async def _announce(
        self, entry: LedgerEntry, claim: Mapping[str, Any] | None, candidate: _Candidate
    ) -> None:
        why = self._describe(entry, claim, candidate)
        log.warning(
            "orphaned binding found; it is detached unless something uses it again",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            reason=candidate.reason,
            grace_seconds=self.grace_seconds,
        )
        await self._event(
            entry,
            claim,
            "OrphanedBinding",
            "Found",
            f"device {entry.device} is bound to node {entry.node} for claim {entry.claim_uid}, "
            f"but {why} and the node's plugin does not report it prepared; it will be detached in "
            f"{self.grace_seconds:.0f}s unless a claim or the plugin explains it again",
        )

    async def _detach(
        self, entry: LedgerEntry, claim: Mapping[str, Any] | None, candidate: _Candidate
    ) -> bool:
        why = self._describe(entry, claim, candidate)
        try:
            if entry.share is not None:
                await self.attachments.detach(
                    entry.share.pool, entry.claim_uid, entry.node, wait=0, share_id=entry.share.share_id
                )
            else:
                await self.attachments.detach(entry.device, entry.claim_uid, entry.node, wait=0)
        except FabricError as err:
            log.warning("orphan detach not started; will retry", device=entry.device, error=err.message)
            return False
        del self._candidates[entry.device]
        unexplained = self._clock() - candidate.since
        log.warning(
            "detaching an orphaned binding",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            reason=candidate.reason,
            unexplained_seconds=round(unexplained, 1),
        )
        if self.metrics is not None:
            self.metrics.orphans_detached.labels(candidate.reason).inc()
        await self._event(
            entry,
            claim,
            "OrphanDetached",
            "Detach",
            f"detached device {entry.device} from node {entry.node}: it was bound for claim "
            f"{entry.claim_uid}, but {why} and the node's plugin has not reported it prepared "
            f"for {unexplained:.0f}s; the device returns to the free pool",
        )
        return True

    async def _event(
        self, entry: LedgerEntry, claim: Mapping[str, Any] | None, reason: str, action: str, note: str
    ) -> None:
        """A Warning Event about the binding of ``entry``: on its claim (the node related), or on
        the node when the claim is gone."""
        if self.events is not None:
            regarding, related = self._refs(entry, claim)
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
