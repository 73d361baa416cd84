"""Several fabric managers, one per Redfish service: each device's attach and detach goes to the
manager of its pool.

:class:`RoutedBackend` is the device backend of a plugin given several managers (``--manager
NAME=URL``): one :class:`~dra_driver.plugin.backend.FabricBackend` per manager, all on this host's
one scanner, partitioner and memory. A pool's manager is the one whose inventory reports it; two
reporting one pool, the one listed first (:class:`~manager_api.fleet.PoolOwners`, the rule the
controller follows too). A pool no manager has reported yet is looked up again in every manager's
inventory before an attach gives up with a retriable error, so a plugin that started while one
manager was down attaches from it once it is back.

The fabric's view for device health merges the managers' inventories: each is followed by its own
change feed (:class:`~manager_api.feed.InventoryFeed`, one per manager: read whole once, then only
what changed), so a manager that is down leaves its pools' devices *unknown* (:meth:`blind_pools`)
while the other managers' devices are judged as always.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from dra_driver.plugin.backend import AttachedDevice, AttachNotes, FabricBackend, ShareAsk
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.partitioner import Partitioner
from manager_api.errors import FabricError, FabricUnavailable
from manager_api.fleet import ManagerEndpoint, PoolOwners
from manager_api.models import Device, Inventory
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["RoutedBackend"]

log = get_logger(__name__)


class _Follower:
    """One manager's latest inventory as this plugin read it, and whether it can be read now."""

    def __init__(self, endpoint: ManagerEndpoint, backend: FabricBackend) -> None:
        self.endpoint = endpoint
        self.backend = backend
        self.inventory: Inventory | None = None
        self.reachable = False

    async def read(self, wait: float) -> Inventory:
        """The manager's inventory after one read of its change feed (``wait`` s at most for a
        change; 0: at once)."""
        feed = self.backend.feed
        await feed.read(wait)
        if feed.latest is None:  # only while another read of this feed is resyncing
            raise FabricUnavailable(f"{self.endpoint.label}: its inventory is being read again")
        return feed.latest


class RoutedBackend:
    name = "fabric"

    def __init__(self, backends: Sequence[tuple[ManagerEndpoint, FabricBackend]], *, node: str) -> None:
        if not backends:
            raise ValueError("a routed backend needs at least one manager")
        self.node = node
        self._followers = {e.name: _Follower(e, b) for e, b in backends}
        self.owners = PoolOwners([e.name for e, _ in backends])
        #: moves whenever a manager's inventory or reachability does (the merged view's version)
        self._version = 0
        self._changed = asyncio.Condition()
        self._polls: list[asyncio.Task[None]] = []

    @property
    def partitioner(self) -> Partitioner | None:
        return next(iter(self._followers.values())).backend.partitioner

    def backend_of(self, manager: str) -> FabricBackend:
        return self._followers[manager].backend

    # -- routing ------------------------------------------------------------------------------

    async def route(self, pool: str | None, device: str) -> FabricBackend:
        """The backend of the manager that serves ``pool``; every manager asked again when none
        has reported it yet."""
        if pool is None:
            raise FabricError(
                f"device {device} has no pool: with several managers the pool says which", device=device
            )
        owner = self.owners.owner(pool)
        if owner is None:
            await self._read_all()
            owner = self.owners.owner(pool)
        if owner is None:
            unreachable = sorted(f.endpoint.label for f in self._followers.values() if not f.reachable)
            raise FabricUnavailable(
                f"no fabric manager reports pool {pool}"
                + (f" (cannot read: {', '.join(unreachable)})" if unreachable else ""),
                device=device,
                node=self.node,
            )
        return self._followers[owner].backend

    def owner_of(self, pool: str) -> str | None:
        return self.owners.owner(pool)

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        notes: AttachNotes,
        pool: str | None = None,
        namespace: str | None = None,
        share: ShareAsk | None = None,
        known: PreparedDevice | None = None,
    ) -> AttachedDevice:
        backend = await self.route(pool, device)
        return await backend.attach(
            claim_uid, device, notes=notes, pool=pool, namespace=namespace, share=share, known=known
        )

    async def release(
        self, claim_uid: str, prepared: PreparedDevice, *, within: float, last_on_gpu: bool = True
    ) -> None:
        backend = await self.route(prepared.pool, prepared.device)
        await backend.release(claim_uid, prepared, within=within, last_on_gpu=last_on_gpu)

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        for follower in self._followers.values():
            err = follower.backend.pending_error(claim_uid, device)
            if err is not None:
                return err
        return None

    # -- what the fabric holds ----------------------------------------------------------------

    async def bindings(self) -> list[Device] | None:
        """Every manager's bindings to this node; any manager that cannot say fails the whole
        answer (a partial one would read as "not bound" for the missing manager's devices)."""
        await self._read_all(strict=True)
        return [
            d
            for f in self._followers.values()
            if f.inventory is not None
            for d in f.inventory.devices
            if self.owners.owner(d.pool) == f.endpoint.name and FabricBackend.holds_here(d, self.node)
        ]

    def blind_pools(self) -> frozenset[str]:
        """The pools of the managers that cannot be read now (as they last reported them)."""
        return frozenset(
            pool
            for f in self._followers.values()
            if not f.reachable
            for pool in self.owners.owned(f.endpoint.name)
        )

    def _merged(self) -> dict[str, Device]:
        """Every readable manager's devices of the pools it keeps, by ``<pool>/<name>`` — two
        services may both have a ``gpu0`` — and by name (the first manager's, where names repeat)."""
        merged: dict[str, Device] = {}
        for f in self._followers.values():
            if not f.reachable or f.inventory is None:
                continue
            for d in f.inventory.devices:
                if self.owners.owner(d.pool) == f.endpoint.name:
                    merged[f"{d.pool}/{d.name}"] = d
                    merged.setdefault(d.name, d)
        return merged

    async def _note(self, follower: _Follower, inventory: Inventory | None) -> None:
        """``follower`` read ``inventory`` (None: could not); the version moves if anything did."""
        before = follower.inventory
        moved = (inventory is not None) != follower.reachable or (
            inventory is not None
            and (before is None or (before.version, before.epoch) != (inventory.version, inventory.epoch))
        )
        if inventory is None:
            if follower.reachable:
                log.warning(
                    "cannot read a fabric manager; its pools' devices are of unknown health",
                    manager=follower.endpoint.label,
                    node=self.node,
                )
            follower.reachable = False
        else:
            if not follower.reachable and follower.inventory is not None:
                log.info("fabric manager readable again", manager=follower.endpoint.label, node=self.node)
            follower.inventory, follower.reachable = inventory, True
            self.owners.update(follower.endpoint.name, [p.pool for p in inventory.pools])
        if moved:
            async with self._changed:
                self._version += 1
                self._changed.notify_all()

    async def _read_all(self, *, strict: bool = False) -> None:
        """Read every manager's inventory now; ``strict``: raise when any cannot be read, else
        only when none can."""
        followers = list(self._followers.values())
        answers = await asyncio.gather(*(f.read(0) for f in followers), return_exceptions=True)
        failures: list[BaseException] = []
        for follower, answer in zip(followers, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                failures.append(answer)
                await self._note(follower, None)
            else:
                await self._note(follower, answer)
        if failures and (strict or len(failures) == len(followers)):
            raise failures[0]

    async def _follow(self, follower: _Follower, wait_seconds: float) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        while True:
            known = follower.reachable and follower.inventory is not None
            try:
                inventory = await follower.read(wait_seconds if known else 0)
            except asyncio.CancelledError:
                raise
            except Exception:  # any failure: this manager's devices are unknown until it answers
                await self._note(follower, None)
                await backoff.sleep()
                continue
            backoff.reset()
            await self._note(follower, inventory)

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        """The merged view of the managers that can be read: at once for ``after=None`` (read
        fresh), else once its version passes ``after`` or ``wait_seconds`` pass."""
        if after is None:
            await self._read_all()
            return self._version, self._merged()
        if not any(f.reachable for f in self._followers.values()):
            await self._read_all()  # raises while no manager can be read: every device is unknown
        if not self._polls:
            self._polls = [
                asyncio.create_task(self._follow(f, wait_seconds), name=f"inventory-{f.endpoint.label}")
                for f in self._followers.values()
            ]
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self._version != after), wait_seconds)
            return self._version, self._merged()

    async def aclose(self) -> None:
        for task in self._polls:
            task.cancel()
        for task in self._polls:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for follower in self._followers.values():
            await follower.backend.aclose()
