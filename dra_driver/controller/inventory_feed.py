"""The fabric manager's inventory as an event source.

One feed per manager feeds every consumer in this process — the slice publisher, the node labeller
and the binding controller — so a device added, removed or turning unhealthy reaches the slices as
soon as the manager knows, with no polling interval.

The feed reads the whole inventory once (``GET /api/v1/inventory``), then follows its change feed
(``GET /api/v1/inventory/changes?epoch=E&since=V``, a long poll answering only the devices changed,
added and removed) and applies each answer to its own copy (:class:`InventoryModel`): a device that
did not change stays the same object from version to version, which is what lets the publisher
render and compare only what changed. When the manager answers ``410 ResyncRequired`` (the feed fell
behind the manager's bounded history, or the manager restarted: another epoch) the feed reads the
whole inventory once again; its memory is the current inventory, never a backlog. A manager without
the change feed (no ``epoch`` in its inventory), or ``mode="full"``, is long-polled whole
(``GET /api/v1/inventory?after=V``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from pydantic import ValidationError

from dra_driver.controller.metrics import INVENTORY_VERSION
from manager_api.client import ManagerClient
from manager_api.errors import FabricError, ResyncRequired
from manager_api.models import Inventory, InventoryChanges
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["FeedMode", "InventoryFeed", "InventoryModel", "InventorySource"]

log = get_logger(__name__)

#: ``changes``: one full read, then the change feed; ``full``: every change read whole
FeedMode = Literal["changes", "full"]


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


class InventoryModel:
    """An inventory kept current by change answers: the devices by name, in the order served."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._devices = {d.name: d for d in inventory.devices}
        self._order = sorted(self._devices)

    def apply(self, changes: InventoryChanges) -> Inventory | None:
        """The inventory after ``changes``; None when they bring nothing new (a long poll's timeout).
        Unchanged devices stay the very objects they were."""
        if changes.version == self.inventory.version and not changes.devices and not changes.removed:
            return None
        devices = self._devices
        reordered = False
        for name in changes.removed:
            reordered |= devices.pop(name, None) is not None
        for device in changes.devices:
            reordered |= device.name not in devices
            devices[device.name] = device
        if reordered:
            self._order = sorted(devices)
        # the manager's validation is not repeated for the devices already validated on arrival
        self.inventory = Inventory.model_construct(
            version=changes.version,
            pools=changes.pools,
            devices=[devices[name] for name in self._order],
            nodes=changes.nodes,
            notices=changes.notices,
            epoch=changes.epoch,
        )
        return self.inventory


class InventoryFeed(InventorySource):
    """One manager's inventory as it reads it (one feed per manager: each holds its own cursor)."""

    def __init__(
        self, client: ManagerClient, *, poll_timeout: float = 30.0, mode: FeedMode = "changes"
    ) -> None:
        super().__init__()
        self._client = client
        self._poll_timeout = poll_timeout
        self.mode: FeedMode = mode
        self._model: InventoryModel | None = None
        self.last_error: str | None = None
        self.last_success = 0.0
        #: full reads after the first: the manager could not say what changed (410 ResyncRequired)
        self.resyncs = 0

    async def _next(self) -> Inventory | None:
        """The next inventory: by the change feed where it can, else read whole."""
        model = self._model
        epoch = model.inventory.epoch if model is not None else None
        if model is not None and epoch is not None:
            changes = await self._client.inventory_changes(
                epoch=epoch, since=model.inventory.version, timeout_seconds=self._poll_timeout
            )
            return model.apply(changes)
        # the first read or a resync (at once), or a manager without the change feed (a long poll)
        waits = self.mode == "full" or model is not None
        after = self.latest.version if self.latest is not None and waits else None
        inventory = await self._client.inventory(after=after, timeout_seconds=self._poll_timeout)
        if self.mode == "changes":
            self._model = InventoryModel(inventory)
        return inventory

    async def run(self) -> None:
        """Fetch, then follow newer versions, forever; errors are retried with backoff."""
        backoff = Backoff(initial=0.5, maximum=30.0)
        failing_since: float | None = None
        if self.mode == "full":
            self._model = None
        while True:
            try:
                inventory = await self._next()
            except ResyncRequired as err:
                # Fell behind the manager's history, or it restarted: read it all once, now.
                self.resyncs += 1
                self._model = None
                log.info(
                    "inventory changes no longer known; reading it whole", reason=str(err).splitlines()[0]
                )
                continue
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
                log.info(
                    "fabric manager inventory readable again", version=self.latest and self.latest.version
                )
                failing_since = None
            backoff.reset()
            self.last_error = None
            self.last_success = time.monotonic()
            latest = self.latest
            if inventory is not None and (
                latest is None or (inventory.version, inventory.epoch) != (latest.version, latest.epoch)
            ):
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
