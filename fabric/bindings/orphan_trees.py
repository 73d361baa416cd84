"""Claims an agent orchestrator left behind when it crashed (docs/manager.md, "Orphaned agent trees").

An orchestrator spawns workers and their claims as a tree (:mod:`fabric.bindings.trees`). When the
orchestrator crashes, its root object goes, and its workers may linger: their pods deleted but stuck
``Terminating`` on a node that no longer answers, or gone while their claims stay (a claim made by
the orchestrator itself has nothing that deletes it). Their devices stay bound, billed and useless.

The leader's :class:`OrphanedTrees` looks, every ``interval`` seconds, at every claim that holds a
binding fabric-dra made. A claim is an **orphaned tree claim** when both hold:

* **its tree's root is gone**: by owner chain, a reference up the claim's ``ownerReferences`` names
  an object that no longer exists (or exists with another UID); by label (``--tree-root-label
  KEY=apiVersion/Kind``), the claim carries ``KEY`` and no object of that kind with the label's value
  as its name exists in the claim's namespace. A root that cannot be read (a kind not served, no
  RBAC, the API server unavailable) is *unknown*, never gone;
* **no pod uses it any more**: every pod in ``status.reservedFor`` is gone (or replaced: another UID)
  or was deleted more than ``grace`` seconds ago and is still there (stuck ``Terminating``).

A claim whose pods are merely gone must stay so for ``grace`` seconds without a break; one whose
pods are stuck is reported at once (their deletion is already ``grace`` old). Each is reported in
the gauge ``fabric_dra_orphaned_tree_claims{namespace, reason}``, with one Warning Event
``OrphanedAgentTree`` on the claim, and by ``GET /api/v1/trees/orphaned`` (``fabric-dra status``).

With ``--orphaned-trees release`` the leader also detaches the claim's bindings — except any whose
node's plugin still reports the claim prepared (a container may be running there: a pod stuck
Terminating on a live node is the kubelet's to finish, not ours) — with an Event
``OrphanedAgentTreeReleased`` and the counter ``fabric_dra_orphaned_tree_claims_released_total``.
The claim itself is left alone: deleting it is its owner's or the garbage collector's business.
The default is ``report``; ``off`` does nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fabric.bindings.attachments import Attachments
from fabric.bindings.orphans import Held, held_of
from fabric.bindings.trees import Fetch, OwnerChains, TreeRootLabel
from fabric.state.claims import ClaimView
from fabric.state.ledger import LedgerState
from fabric.state.metrics import ManagerMetrics
from fabric.state.reports import PluginReports
from manager_api import models as api
from manager_api.errors import FabricError
from plumbing.kube.client import ApiError
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.logs import get_logger

__all__ = ["POLICIES", "OrphanedTrees"]

log = get_logger(__name__)

#: what the leader does with an orphaned tree claim
POLICIES = ("off", "report", "release")
PODS_GONE = "root-gone-pods-gone"
PODS_TERMINATING = "root-gone-pods-terminating"


@dataclass
class _Finding:
    claim: ResourceClaim
    reason: str
    root: str
    pods: list[str]
    since: float
    found_at: datetime
    announced: bool = False

    @property
    def reported(self) -> bool:
        return self.announced


def _by_name(finding: _Finding) -> tuple[str, str]:
    return finding.claim.metadata.namespace or "", finding.claim.metadata.name


def _deleted_at(pod: Mapping[str, Any]) -> datetime | None:
    meta = pod.get("metadata")
    stamp = meta.get("deletionTimestamp") if isinstance(meta, dict) else None
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


class OrphanedTrees:
    def __init__(
        self,
        attachments: Attachments,
        claims: ClaimView,
        fetch: Fetch,
        reports: PluginReports,
        *,
        policy: str,
        grace_seconds: float,
        interval: float,
        root_label: TreeRootLabel | None = None,
        metrics: ManagerMetrics | None = None,
        events: EventRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown orphaned-tree policy {policy!r}: one of {', '.join(POLICIES)}")
        self.attachments = attachments
        self.claims = claims
        self.fetch = fetch
        self.chains = OwnerChains(fetch, ttl=interval / 2)
        self.reports = reports
        self.policy = policy
        self.grace_seconds = grace_seconds
        self.interval = interval
        self.root_label = root_label
        self.metrics = metrics
        self.events = events
        self._clock = clock
        self._wall = wall
        self._findings: dict[str, _Finding] = {}
        self._leading_since: float | None = None

    # -- judging ---------------------------------------------------------------------------------

    async def _root_gone(self, claim: ResourceClaim) -> str | None:
        """What is gone of the claim's tree (``Job orchestrator-1``), None while its root is there
        or cannot be told."""
        meta = claim.metadata
        namespace = meta.namespace or ""
        label = self.root_label
        if label is not None and meta.labels.get(label.key):
            name = meta.labels[label.key]
            try:
                root = await self.fetch(label.api_version, label.kind, namespace, name)
            except (LookupError, ApiError) as err:
                log.warning(
                    "cannot read a tree's root", kind=label.kind, name=name, error=str(err).splitlines()[0]
                )
                return None
            return None if root is not None else f"{label.kind} {name}"
        if not meta.owner_references:
            return None
        lookup = await self.chains.root_of(namespace, meta.owner_references)
        if lookup.gone and lookup.missing is not None:
            return f"{lookup.missing.kind} {lookup.missing.name}"
        return None

    async def _pods_unused(self, claim: ResourceClaim) -> tuple[str, list[str]] | None:
        """``(reason, pods)`` when no pod the claim is reserved for uses it any more; None while one may."""
        namespace = claim.metadata.namespace or ""
        stuck = False
        names: list[str] = []
        for ref in claim.status.reserved_for:
            if ref.resource != "pods" or ref.api_group:
                return None  # reserved for something that is not a pod: not ours to judge
            try:
                pod = await self.fetch("v1", "Pod", namespace, ref.name)
            except (LookupError, ApiError) as err:
                log.warning("cannot read a claim's pod", pod=ref.name, error=str(err).splitlines()[0])
                return None
            meta = (pod or {}).get("metadata") or {}
            if pod is None or meta.get("uid") != ref.uid:
                names.append(f"{ref.name} (gone)")
                continue
            deleted = _deleted_at(pod)
            if deleted is None or (self._wall() - deleted).total_seconds() < self.grace_seconds:
                return None  # running, or terminating within its grace
            stuck = True
            names.append(f"{ref.name} (Terminating since {deleted.isoformat()})")
        return (PODS_TERMINATING if stuck else PODS_GONE), names

    async def _judge(self, claim: ResourceClaim, now: float) -> _Finding | None:
        uid = claim.metadata.uid
        gone = await self._root_gone(claim)
        unused = await self._pods_unused(claim) if gone is not None else None
        if gone is None or unused is None:
            return None
        reason, pods = unused
        finding = self._findings.get(uid)
        if finding is None:
            finding = _Finding(claim, reason, gone, pods, now, self._wall())
        finding.claim, finding.reason, finding.root, finding.pods = claim, reason, gone, pods
        return finding

    # -- the pass --------------------------------------------------------------------------------

    def _holdings(self) -> dict[str, list[Held]]:
        held: dict[str, list[Held]] = {}
        for entry in self.attachments.ledger.entries():
            if entry.state is LedgerState.BOUND:
                for h in held_of(entry):
                    held.setdefault(h.claim_uid, []).append(h)
        return held

    async def sweep(self) -> list[str]:
        """One pass; returns the claims whose bindings it released."""
        if self.policy == "off" or not self.attachments.is_leader() or not self.claims.synced.is_set():
            self._findings.clear()
            self._leading_since = None
            self._count()
            return []
        now = self._clock()
        if self._leading_since is None:
            self._leading_since = now
        holdings = self._holdings()
        found: dict[str, _Finding] = {}
        for uid in holdings:
            claim = self.claims.get(uid)
            if claim is None:
                continue  # the claim is gone: fabric.bindings.orphans releases its bindings
            finding = await self._judge(claim, now)
            if finding is not None:
                found[uid] = finding
        self._findings = found
        released: list[str] = []
        for uid, finding in found.items():
            if finding.reason == PODS_GONE and now - finding.since < self.grace_seconds:
                continue
            if not finding.announced:
                finding.announced = True
                await self._announce(finding)
            # A node's plugin counts as silent only once this leader has waited a report period.
            if now - self._leading_since < self.reports.ttl:
                continue
            if self.policy == "release" and await self._release(finding, holdings[uid]):
                released.append(uid)
        self._count()
        return released

    def _count(self) -> None:
        if self.metrics is None:
            return
        counts: dict[tuple[str, str], int] = {}
        for f in self._findings.values():
            if f.reported:
                key = (f.claim.metadata.namespace or "", f.reason)
                counts[key] = counts.get(key, 0) + 1
        self.metrics.set_orphaned_tree_claims(counts)

    async def _announce(self, finding: _Finding) -> None:
        meta = finding.claim.metadata
        log.warning(
            "claim of an orphaned agent tree",
            claim=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            reason=finding.reason,
            root=finding.root,
            policy=self.policy,
        )
        what = (
            "its devices are released" if self.policy == "release" else "nothing is released (policy report)"
        )
        pods = "; pods: " + ", ".join(finding.pods) if finding.pods else "; reserved for no pod"
        await self._event(
            finding,
            "OrphanedAgentTree",
            "Report",
            f"the root of this claim's agent tree ({finding.root}) is gone and no pod uses the claim"
            f"{pods}; {what}",
        )

    async def _release(self, finding: _Finding, held: Iterable[Held]) -> bool:
        uid = finding.claim.metadata.uid
        released: list[str] = []
        for h in held:
            if self.reports.holds(h.node, uid, h.device):
                continue  # the node's plugin says prepared: a container may use it
            try:
                await self.attachments.detach(h.device, uid, h.node, wait=0, share_id=h.share_id)
            except FabricError as err:
                log.warning("orphaned tree release not started; will retry", device=h.key, error=err.message)
                continue
            released.append(h.label)
        if not released:
            return False
        if self.metrics is not None:
            self.metrics.orphaned_tree_released.labels(finding.claim.metadata.namespace or "").inc()
        await self._event(
            finding,
            "OrphanedAgentTreeReleased",
            "Detach",
            f"released {', '.join(released)}: the root of this claim's agent tree ({finding.root}) is gone "
            "and no pod uses the claim",
        )
        return True

    async def _event(self, finding: _Finding, reason: str, action: str, note: str) -> None:
        if self.events is None:
            return
        meta = finding.claim.metadata
        ref = ObjectRef("ResourceClaim", meta.name, meta.namespace or "", finding.claim.api_version, meta.uid)
        await self.events.record(ref, reason=reason, action=action, event_type="Warning", note=note)

    def findings(self) -> api.OrphanedTreeClaims:
        """What the last pass reported (for ``GET /api/v1/trees/orphaned``)."""
        return api.OrphanedTreeClaims(
            policy=self.policy,
            claims=[
                api.OrphanedTreeClaim(
                    namespace=f.claim.metadata.namespace or "",
                    name=f.claim.metadata.name,
                    uid=f.claim.metadata.uid,
                    reason=f.reason,
                    root=f.root,
                    pods=f.pods,
                    since=f.found_at,
                )
                for f in sorted(
                    self._findings.values(),
                    key=lambda f: (f.claim.metadata.namespace or "", f.claim.metadata.name),
                )
                if f.reported
            ],
        )

    async def run(self) -> None:
        await self.claims.synced.wait()
        while True:
            try:
                await self.sweep()
            except FabricError as err:
                log.warning("orphaned-tree check failed; retrying", error=err.message)
            except Exception:
                log.exception("orphaned-tree check crashed; retrying")
            await asyncio.sleep(self.interval)
