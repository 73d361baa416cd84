"""Tell the fabric manager which claims this node has prepared.

Every ``interval`` seconds (and once at start) the plugin sends ``PUT /api/v1/nodes/<node>/claims``
with the claims its checkpoint records as *PrepareCompleted* and their devices. The manager's
orphan reconciler never detaches a device a plugin reports, whatever the API server says: a
container may be using it (a claim force-deleted under a running pod). Claims the plugin merely
re-adopted from the fabric (*PrepareStarted*, nobody asked for them) are not reported, so they are
released once no claim explains them. A manager that cannot be reached is logged once per outage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dra_driver.plugin.checkpoint import CheckpointStore, ClaimState
from manager_api.client import ManagerClient
from manager_api.errors import FabricError
from plumbing.logs import get_logger

__all__ = ["PreparedReporter", "prepared_claims"]

log = get_logger(__name__)


def prepared_claims(
    store: CheckpointStore, keep: Callable[[str], bool] | None = None
) -> dict[str, list[str]]:
    """Claim UID → device names of every PrepareCompleted claim in the checkpoint (a partition by
    its partition device, the shares of a pool once by the pool); with ``keep``, only the devices
    of the pools it keeps (one manager's among several), and only claims with any."""
    out: dict[str, list[str]] = {}
    for uid, entry in store.claims().items():
        if entry.state is not ClaimState.PREPARE_COMPLETED:
            continue
        devices = sorted({d.device for d in entry.devices if keep is None or keep(d.pool)})
        if devices or keep is None:
            out[uid] = devices
    return out


class PreparedReporter:
    def __init__(
        self,
        client: ManagerClient,
        store: CheckpointStore,
        *,
        node: str,
        interval: float,
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        """``keep``: with several managers, the pools of this ``client``'s manager (a pool none has
        reported yet is kept by every manager: a report protects, it never releases)."""
        self.client = client
        self.keep = keep
        self.store = store
        self.node = node
        self.interval = interval
        self._failing = False

    async def report_once(self) -> bool:
        self.store.refresh()
        claims = prepared_claims(self.store, self.keep)
        try:
            await self.client.report_claims(self.node, claims)
        except FabricError as err:
            if not self._failing:
                log.warning(
                    "cannot tell the fabric manager which claims are prepared; retrying",
                    node=self.node,
                    error=err.message,
                )
            self._failing = True
            return False
        if self._failing:
            log.info("the fabric manager knows this node's prepared claims again", node=self.node)
        self._failing = False
        return True

    async def run(self) -> None:
        while True:
            await self.report_once()
            await asyncio.sleep(self.interval)
