"""The orphan reconciler: devices still bound for ResourceClaims that no longer exist.

Normally the kubelet's NodeUnprepareResources makes the plugin detach a claim's devices. When that
never happens — the node died, the plugin was removed, the claim was force-deleted — the device
would stay bound for nothing. The leader lists the cluster's ResourceClaims every ``interval``
seconds and detaches (as the claim's own holder would) every bound device whose claim UID is
gone, once its binding is older than ``grace`` seconds (a claim being created, or a list from a
lagging cache, must not cost a pod its device). Without API access, or when claims cannot be
listed, it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from dra_driver.kube.client import ApiError, KubeClient, NotFound
from dra_driver.kube.resources import RESOURCE_CLAIMS
from dra_driver.logs import get_logger
from fabric.binder import Binder
from fabric.errors import FabricError
from fabric.ledger import LedgerState

__all__ = ["OrphanReconciler"]

log = get_logger(__name__)
#: resource.k8s.io versions that serve ResourceClaims, newest first (v1 from Kubernetes 1.34)
_VERSIONS = ("v1", "v1beta2", "v1beta1")


class OrphanReconciler:
    def __init__(self, kube: KubeClient, binder: Binder, *, grace_seconds: float, interval: float) -> None:
        self.kube = kube
        self.binder = binder
        self.grace_seconds = grace_seconds
        self.interval = interval
        self._version: str | None = None

    async def claim_uids(self) -> set[str] | None:
        """UIDs of every ResourceClaim in the cluster; None when they cannot be listed."""
        versions = [self._version] if self._version else list(_VERSIONS)
        for version in versions:
            try:
                items, _ = await self.kube.list_all(RESOURCE_CLAIMS.with_version(str(version)))
            except NotFound:
                continue
            except ApiError as err:
                log.warning("cannot list ResourceClaims; orphan check skipped", error=str(err))
                return None
            self._version = version
            return {str((i.get("metadata") or {}).get("uid")) for i in items}
        log.warning("the API server serves no resource.k8s.io ResourceClaims; orphan check skipped")
        return None

    async def sweep(self) -> list[str]:
        """Detach devices of claims that are gone; returns the devices it detached."""
        if not self.binder.is_leader():
            return []
        uids = await self.claim_uids()
        if uids is None:
            return []
        now = datetime.now(UTC)
        detached = []
        for entry in self.binder.ledger.entries():
            if entry.state is not LedgerState.BOUND or entry.claim_uid in uids:
                continue
            if (now - entry.updated_at).total_seconds() < self.grace_seconds:
                continue
            log.warning(
                "claim no longer exists; detaching its device",
                device=entry.device,
                node=entry.node,
                claim=entry.claim_uid,
            )
            try:
                await self.binder.detach(entry.device, entry.claim_uid, entry.node, wait=0)
            except FabricError as err:
                log.warning("orphan detach not started", device=entry.device, error=err.message)
                continue
            detached.append(entry.device)
        return detached

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(FabricError):
                await self.sweep()
