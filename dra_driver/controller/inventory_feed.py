"""The fabric manager's inventory as an event source.

One long poll (``GET /api/v1/inventory?after=V``) feeds every consumer in this process — the
slice publisher, the node labeller and the binding controller — so a device added, removed or
turning unhealthy reaches the slices as soon as the manager knows, with no polling interval.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import ValidationError

from dra_driver.controller.metrics import INVENTORY_VERSION
from manager_api.client import ManagerClient
from manager_api.errors import FabricError
from manager_api.models import Inventory
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["InventoryFeed", "InventorySource"]

log = get_logger(__name__)


class InventorySource:
    """The latest inventory of some stage, and a wait for a newer one."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self.latest: Inventory | None = None

    async def put(self, inventory: Inventory) -> None:
        async with self._changed:
            self.latest = inventory
            self._changed.notify_all()

    async def wait_newer(self, version: int | None) -> Inventory:
        """The first inventory whose version differs from ``version`` (any, when None)."""
        async with self._changed:
            while self.latest is None or (version is not None and self.latest.version == version):
                await self._changed.wait()
            return self.latest


class InventoryFeed(InventorySource):
    """The manager's inventory as it reads it."""

    def __init__(self, client: ManagerClient, *, poll_timeout: float = 30.0) -> None:
        super().__init__()
        self._client = client
        self._poll_timeout = poll_timeout
        self.last_error: str | None = None
        self.last_success = 0.0

    async def run(self) -> None:
        """Fetch, then long-poll for newer versions, forever; errors are retried with backoff."""
        backoff = Backoff(initial=0.5, maximum=30.0)
        failing_since: float | None = None
        while True:
            after = self.latest.version if self.latest is not None else None
            try:
                inventory = await self._client.inventory(after=after, timeout_seconds=self._poll_timeout)
            except (FabricError, ValidationError) as err:
                message = str(err).splitlines()[0]
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning(
                        "cannot read the fabric manager's inventory; slices stay as they are",
                        error=message,
                    )
                self.last_error = message
                await asyncio.sleep(backoff.next())
                continue
            if failing_since is not None:
                log.info("fabric manager inventory readable again", version=inventory.version)
                failing_since = None
            backoff.reset()
            self.last_error = None
            self.last_success = time.monotonic()
            if self.latest is None or inventory.version != self.latest.version:
                await self._publish(inventory)

    async def _publish(self, inventory: Inventory) -> None:
        await self.put(inventory)
        INVENTORY_VERSION.set(inventory.version)
        log.debug(
            "inventory received",
            version=inventory.version,
            devices=len(inventory.devices),
            pools=len(inventory.pools),
        )
