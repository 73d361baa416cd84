"""The cluster's ResourceClaims as the attach check sees them: one informer, indexed by UID.

An attach names a claim by UID only, and a node's plugin token may attach for its node. Without a
check, a plugin could attach any free device for a claim UID it made up and keep it by reporting
the claim prepared: it could hoard the pool. So an attach is accepted only when, in the cached view
of ResourceClaims:

* the claim with that UID exists;
* its allocation has a result for the device, in the device's pool;
* where the allocation names a node (``bindsToNode``: a ``nodeSelector`` of one ``metadata.name``),
  it is the node of the attach.

The scheduler writes the allocation just before the kubelet (and so the plugin) acts on it, and the
informer may not have seen that write yet: a check that fails waits up to ``wait_seconds`` for the
cache to change before it refuses (403 ``PermissionDenied``, naming what is missing). Until the
first list arrived the check waits as long, then answers 503 (the API server cannot be read).

Without Kubernetes API access (``manager serve`` without ``--kubeconfig`` outside a pod: the
embedded demo, tests with a static token file) there are no claims to check: :mod:`fabric.service.manager`
builds no view and every attach is checked for node scope and device only, as before. The manager
logs this once at start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from manager_api.errors import FabricUnavailable, PermissionDenied
from plumbing.backoff import Backoff
from plumbing.kube.client import ApiError, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.informer import Change, Informer, Origin, object_uid
from plumbing.kube.resources import RESOURCE_API_VERSIONS, RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = ["ClaimView"]

log = get_logger(__name__)


class ClaimView:
    def __init__(self, kube: KubeClient, *, wait_seconds: float = 5.0) -> None:
        self.kube = kube
        self.wait_seconds = wait_seconds
        self.synced = asyncio.Event()
        self._by_uid: dict[str, ResourceClaim] = {}
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Find the served ``resource.k8s.io`` version, then list and watch claims until cancelled."""
        version = await self._served_version()
        informer = Informer(self.kube, RESOURCE_CLAIMS.with_version(version), on_changes=self._apply)
        runner = asyncio.create_task(informer.run(), name="claim-informer")
        try:
            await informer.synced.wait()
            self.synced.set()
            await runner
        finally:
            runner.cancel()

    async def _served_version(self) -> str:
        backoff = Backoff(initial=0.5, maximum=30.0)
        while True:
            for version in RESOURCE_API_VERSIONS:
                try:
                    await self.kube.list(RESOURCE_CLAIMS.with_version(version), limit=1)
                except NotFound:
                    continue
                except ApiError as err:
                    log.warning("cannot list ResourceClaims; retrying", error=str(err).splitlines()[0])
                    break
                return version
            else:
                log.warning("the API server serves no resource.k8s.io ResourceClaims; retrying")
            await backoff.sleep()

    def _apply(self, changes: Sequence[Change], origin: Origin) -> None:
        for change in changes:
            uid = object_uid(change.object)
            if not uid:
                continue
            claim = ResourceClaim.read(change.object) if change.type != "DELETED" else None
            if claim is None:
                self._by_uid.pop(uid, None)
            else:
                self._by_uid[uid] = claim
        # Wake every waiting check: each one captured the event it waits on before it looked.
        self._changed.set()
        self._changed = asyncio.Event()

    def exists(self, claim_uid: str) -> bool:
        return claim_uid in self._by_uid

    def get(self, claim_uid: str) -> ResourceClaim | None:
        """The claim of that UID as last seen (the usage accounting reads its namespace and owner)."""
        return self._by_uid.get(claim_uid)

    def problem(self, claim_uid: str, device: str, pool: str, node: str) -> str | None:
        """None when the claim allocates ``pool``/``device`` (to ``node``, if it names one); else
        what is missing."""
        claim = self._by_uid.get(claim_uid)
        if claim is None:
            return f"ResourceClaim {claim_uid} does not exist"
        name = f"ResourceClaim {claim.metadata.namespace}/{claim.metadata.name} ({claim_uid})"
        allocation = claim.status.allocation
        if allocation is None:
            return f"{name} is not allocated"
        if not any(r.device == device and r.pool == pool for r in allocation.results):
            return f"{name} does not allocate device {device} of pool {pool}"
        if allocation.node is not None and allocation.node != node:
            return f"{name} is allocated on node {allocation.node}, not on node {node}"
        return None

    async def check_attach(self, claim_uid: str, device: str, pool: str, node: str) -> None:
        """Return when the claim allows the attach; raise :class:`PermissionDenied` (or
        :class:`FabricUnavailable` while no list has arrived) once ``wait_seconds`` passed."""
        deadline = time.monotonic() + self.wait_seconds
        problem: str | None = None
        while True:
            changed = self._changed
            if self.synced.is_set():
                problem = self.problem(claim_uid, device, pool, node)
                if problem is None:
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waiter = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait([waiter], timeout=remaining)
            finally:
                waiter.cancel()
        if not self.synced.is_set():
            raise FabricUnavailable(
                "the fabric manager cannot read ResourceClaims from the API server yet, so it cannot "
                "check the claim of this attach; retry",
                device=device,
                node=node,
                retry_after=2.0,
            )
        log.warning(
            "attach refused by the claim check", claim=claim_uid, device=device, node=node, reason=problem
        )
        raise PermissionDenied(
            f"attach of device {device} to node {node} refused: {problem}; only a claim allocated "
            "this device (on this node) may attach it",
            device=device,
            node=node,
        )
