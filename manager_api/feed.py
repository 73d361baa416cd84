"""The fabric manager's inventory as one reader follows it: the controller and the kubelet plugin.

One feed per manager feeds every consumer in a process — in the controller the slice publisher, the
node labeller and the binding controller, which run it (:meth:`InventoryFeed.run`); in the plugin
its device health, which drives it one read at a time (:meth:`InventoryFeed.read`) — so a device
added, removed or turning unhealthy is known as soon as the manager knows.

The feed reads the whole inventory once (``GET /api/v1/inventory``), then follows its change feed
(``GET /api/v1/inventory/changes?epoch=E&since=V``, a long poll answering only the devices changed,
added and removed) and applies each answer to its own copy (:class:`InventoryModel`): a device that
did not change stays the same object from version to version, which is what lets the publisher
render and compare only what changed. When the manager answers ``410 ResyncRequired`` (the feed fell
behind the manager's bounded history, or the manager restarted: another epoch) the feed reads the
whole inventory once again; its memory is the current inventory, never a backlog. A manager without
the change feed (no ``epoch`` in its inventory), or ``mode="full"``, is long-polled whole
(``GET /api/v1/inventory?after=V``).

A feed given a ``node`` (a kubelet plugin's) asks for that node's changes only (``&node=N``): its
copy then keeps the devices bound or attached to the node current, and the others as they were
at the last full read. A manager that does not filter says so by not echoing ``node`` in its
answer (an older one ignores the parameter) or by refusing it (400/422); the feed then takes that
answer as it is (every device's changes) and asks unfiltered from then on.

What a role does with each new inventory beyond keeping it (the controller's version gauge) is its
``on_publish`` hook: this floor knows no role.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

from pydantic import ValidationError

from manager_api.client import ManagerClient
from manager_api.errors import FabricError, InvalidRequest, ResyncRequired
from manager_api.models import Device, Inventory, InventoryChanges
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
        self._sort()

    def _sort(self) -> None:
        """The devices in name order, and each name's place in it."""
        self._listing = [self._devices[name] for name in sorted(self._devices)]
        self._place = {d.name: i for i, d in enumerate(self._listing)}

    def apply(self, changes: InventoryChanges) -> Inventory | None:
        """The inventory after ``changes``; None when they bring nothing new (a long poll's timeout)
        or are older than what is kept (two reads of one feed crossing). Unchanged devices stay the
        very objects they were."""
        if changes.epoch != self.inventory.epoch or changes.version < self.inventory.version:
            return None
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
            self._sort()
        else:
            # a copy (the inventory handed out before stays as it was) with the changed put in
            # place: no pass over every device for a change of one
            self._listing = list(self._listing)
            for device in changes.devices:
                self._listing[self._place[device.name]] = device
        # the manager's validation is not repeated for the devices already validated on arrival
        self.inventory = Inventory.model_construct(
            version=changes.version,
            pools=changes.pools,
            devices=self._listing,
            nodes=changes.nodes,
            notices=changes.notices,
            epoch=changes.epoch,
        )
        return self.inventory

    def devices(self) -> dict[str, Device]:
        """The devices by name, as a copy the next change leaves alone."""
        return dict(self._devices)


class InventoryFeed(InventorySource):
    """One manager's inventory as it reads it (one feed per manager: each holds its own cursor)."""

    def __init__(
        self,
        client: ManagerClient,
        *,
        poll_timeout: float = 30.0,
        mode: FeedMode = "changes",
        on_publish: Callable[[Inventory], None] | None = None,
        node: str | None = None,
    ) -> None:
        super().__init__()
        self._client = client
        self._poll_timeout = poll_timeout
        self.mode: FeedMode = mode
        self._on_publish = on_publish
        self._model: InventoryModel | None = None
        self.last_error: str | None = None
        self.last_success = 0.0
        #: full reads after the first: the manager could not say what changed (410 ResyncRequired)
        self.resyncs = 0
        #: the node whose changes only are asked for; None: every device's (also once the
        #: manager turned out not to filter)
        self.node = node

    def devices(self) -> dict[str, Device]:
        """The latest inventory's devices by name (a copy; empty before the first read)."""
        if self._model is not None:
            return self._model.devices()
        return {d.name: d for d in self.latest.devices} if self.latest is not None else {}

    async def _next(self, wait: float) -> Inventory | None:
        """The next inventory: by the change feed where it can, else read whole; ``wait`` s at most
        for a change (0: answer at once)."""
        model = self._model
        epoch = model.inventory.epoch if model is not None else None
        if model is not None and epoch is not None:
            changes = await self._changes(epoch, model.inventory.version, wait)
            # another read of this feed resynced while this one waited: its answer is of no model
            return model.apply(changes) if self._model is model else None
        # the first read or a resync (at once), or a manager without the change feed (a long poll)
        waits = wait > 0 and (self.mode == "full" or model is not None)
        after = self.latest.version if self.latest is not None and waits else None
        inventory = await self._client.inventory(after=after, timeout_seconds=wait)
        if self.mode == "changes":
            self._model = InventoryModel(inventory)
        return inventory

    async def _changes(self, epoch: int, since: int, wait: float) -> InventoryChanges:
        """The change feed's answer: this feed's node's changes where the manager filters them."""
        node = self.node
        try:
            changes = await self._client.inventory_changes(
                epoch=epoch, since=since, timeout_seconds=wait, node=node
            )
        except InvalidRequest as err:
            if node is None:
                raise
            log.info(
                "the fabric manager refuses the per-node change feed; following every change", error=str(err)
            )
            self.node = None
            return await self._client.inventory_changes(epoch=epoch, since=since, timeout_seconds=wait)
        if node is not None and changes.node != node:
            # an older manager ignored ``node``: this answer has every change, and so will the next
            log.info("the fabric manager does not filter the change feed by node; following every change")
            self.node = None
        return changes

    async def read(self, wait: float | None = None) -> Inventory | None:
        """One read: the inventory it brought (also kept as ``latest``), None when nothing changed
        within ``wait`` s (default: the poll timeout; 0 answers at once). A ``410 ResyncRequired``
        is followed by one full read; any other failure is raised."""
        try:
            inventory = await self._next(self._poll_timeout if wait is None else wait)
        except ResyncRequired as err:
            # Fell behind the manager's history, or it restarted: read it all once, now.
            self.resyncs += 1
            self._model = None
            log.info("inventory changes no longer known; reading it whole", reason=str(err).splitlines()[0])
            inventory = await self._next(0)
        if inventory is None and self._model is not None:
            # what the model holds is published even when this read brought nothing: a read
            # cancelled between applying its answer and publishing it must not leave it unsaid
            inventory = self._model.inventory
        latest = self.latest
        if inventory is None or (
            latest is not None and (inventory.version, inventory.epoch) == (latest.version, latest.epoch)
        ):
            return None
        await self._publish(inventory)
        return inventory

    async def run(self) -> None:
        """Fetch, then follow newer versions, forever; errors are retried with backoff."""
        backoff = Backoff(initial=0.5, maximum=30.0)
        failing_since: float | None = None
        if self.mode == "full":
            self._model = None
        while True:
            try:
                await self.read()
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

    async def _publish(self, inventory: Inventory) -> None:
        await self.put(inventory)
        if self._on_publish is not None:
            self._on_publish(inventory)
        log.debug(
            "inventory received",
            version=inventory.version,
            devices=len(inventory.devices),
            pools=len(inventory.pools),
        )
