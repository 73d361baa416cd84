"""Several fabric managers, one per Redfish service: each one's inventory as its own pools' writers
see it, and whether it can be read.

The controller runs one publisher, node labeller and (with binding conditions) claim binder per
manager (:mod:`.app`), each fed by that manager's :class:`ManagerGate`: the manager's inventory less
the pools another manager listed before it keeps (:class:`~manager_api.fleet.PoolOwners`; a
collision is one error line and ``fabric_dra_controller_pool_collisions``), and an availability
that turns to down once the inventory has been unreadable for ``down_grace`` seconds. Down, the
gate's publisher taints every device of that manager's pools ``<driver>/fabric-unavailable`` (or
withholds them); the other managers' pools are untouched, as their gates and publishers are
their own. Readable again, the taint goes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from dra_driver.controller.metrics import MANAGER_UP, POOL_COLLISIONS
from manager_api.feed import InventoryFeed, InventorySource
from manager_api.fleet import ManagerEndpoint, PoolCollision, PoolOwners
from manager_api.models import Inventory
from plumbing.logs import get_logger

__all__ = ["Fleet", "ManagerGate"]

log = get_logger(__name__)


class Fleet:
    """The managers' gates and who keeps which pool; a change of owner re-filters every gate."""

    def __init__(self, endpoints: list[ManagerEndpoint]) -> None:
        self.owners = PoolOwners([e.name for e in endpoints])
        self.gates: dict[str, ManagerGate] = {}
        self._labels = {e.name: e.label for e in endpoints}

    def observe(self, manager: str, pools: list[str]) -> None:
        """``manager`` reported ``pools``; log and count each collision as it appears or ends."""
        before = set(self.owners.collisions())
        for collision in self.owners.update(manager, pools):
            self._count(collision, 1)
            log.error(
                "two fabric managers report the same pool; the one listed first keeps it and the other's "
                "devices of it are not published (give one of them another --fabric-name)",
                pool=collision.pool,
                kept_by=self._labels[collision.owner],
                refused=self._labels[collision.refused],
            )
        after = set(self.owners.collisions())
        for ended in before - after:
            self._count(ended, 0)
            log.info("pool collision ended", pool=ended.pool, refused=self._labels[ended.refused])
        if before != after:
            for gate in self.gates.values():
                gate.refilter()

    def _count(self, collision: PoolCollision, value: int) -> None:
        POOL_COLLISIONS.labels(pool=collision.pool, refused=self._labels[collision.refused]).set(value)


class ManagerGate(InventorySource):
    """One manager's inventory, without the pools another manager keeps, and whether it is up."""

    def __init__(
        self,
        endpoint: ManagerEndpoint,
        feed: InventoryFeed,
        fleet: Fleet,
        *,
        down_grace: float,
        check_every: float = 1.0,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.feed = feed
        self._fleet = fleet
        self.down_grace = down_grace
        self._check_every = min(check_every, down_grace / 4)
        self.up = True
        #: called with the new availability when it turns
        self.on_availability: Callable[[bool], None] | None = None
        #: called when the latest inventory was filtered anew without a new version
        self.on_refiltered: Callable[[], None] | None = None
        fleet.gates[endpoint.name] = self
        MANAGER_UP.labels(manager=endpoint.label).set(1)

    @property
    def name(self) -> str:
        return self.endpoint.name

    def _filtered(self, inventory: Inventory) -> Inventory:
        refused = self._fleet.owners.refused(self.name)
        if not refused:
            return inventory
        return inventory.model_copy(
            update={
                "pools": [p for p in inventory.pools if p.pool not in refused],
                "devices": [d for d in inventory.devices if d.pool not in refused],
                "nodes": [
                    n.model_copy(update={"pools": [p for p in n.pools if p not in refused]})
                    for n in inventory.nodes
                ],
            }
        )

    def refilter(self) -> None:
        """The pools this manager keeps changed: the same inventory, filtered anew."""
        inventory = self.feed.latest
        if inventory is None:
            return
        self.latest = self._filtered(inventory)
        if self.on_refiltered is not None:
            self.on_refiltered()

    async def run(self) -> None:
        """Follow the manager's feed and watch its availability, until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._follow())
            tasks.create_task(self._watch_availability())

    async def _follow(self) -> None:
        version: int | None = None
        while True:
            inventory = await self.feed.wait_newer(version)
            version = inventory.version
            self._fleet.observe(self.name, [p.pool for p in inventory.pools])
            await self.put(self._filtered(inventory))

    async def _watch_availability(self) -> None:
        """Down once the feed has failed for ``down_grace`` seconds since its last success (or
        since the start, for a manager never read); up at its next success."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(self._check_every)
            failing = self.feed.last_error is not None or self.feed.latest is None
            since = max(self.feed.last_success, started)
            up = not (failing and time.monotonic() - since >= self.down_grace)
            if up != self.up:
                self._turn(up)

    def _turn(self, up: bool) -> None:
        self.up = up
        MANAGER_UP.labels(manager=self.endpoint.label).set(1 if up else 0)
        if up:
            log.info(
                "fabric manager readable again; its pools' devices are offered again",
                manager=self.endpoint.label,
            )
        else:
            log.warning(
                "fabric manager unreadable past its grace; its pools' devices are tainted fabric-unavailable "
                "(or withheld), the other managers' pools are untouched",
                manager=self.endpoint.label,
                error=self.feed.last_error,
                grace_seconds=self.down_grace,
            )
        if self.on_availability is not None:
            self.on_availability(up)
