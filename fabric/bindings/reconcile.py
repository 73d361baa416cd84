"""Reconciliation: the ledger against the fabric, at start-up and after every discovery pass.

* **Crash-safe.** Every unfinished ledger entry (``attaching``, ``detaching``) is resumed from the
  fabric's state by its device's driver (:mod:`fabric.driver.operations`): finished, or rolled back,
  never sent twice. An operation that paused (fabric unreachable, task still running, refused
  unbind) is resumed after its pause, or at once when the fabric comes back.
* **The fabric is the truth.** A ``bound`` entry whose binding the fabric no longer has (removed
  outside fabric-dra) is dropped and logged.
* **Bindings made outside fabric-dra** (on the fabric, with no ledger entry) are never touched:
  :class:`ForeignBindings` logs each once when it appears and when it goes; the inventory shows
  them ``managed: false`` and the metrics count them (``fabric_dra_unmanaged_bindings{pool}``).
* **Leader only.** A follower reconciles nothing.
* **After a pass, what changed.** Every ``retry_seconds`` (:meth:`Reconciler.run`), after a full
  pass, and after a ledger load, every entry is checked; after a bindings-only pass
  (:meth:`Reconciler.reconcile_changes`), the entries whose device's bound hosts the pass changed,
  the entries changed since the last check, those left unchecked then (an operation running, the
  fabric not read) and every unfinished one — the rest were found bound and nothing they depend on
  moved. At 10,000 bindings the walk over every entry after each pass (about one a second while
  attaches go on) held the manager's loop ~15 ms each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

from fabric.driver.operations import OperationDriver
from fabric.state.inventory import DeviceFacts, Inventory
from fabric.state.ledger import Ledger, LedgerEntry
from fabric.state.model import DeviceRecord
from manager_api import models as api
from manager_api.errors import FabricError
from plumbing.logs import get_logger

__all__ = ["ForeignBindings", "Reconciler"]

log = get_logger(__name__)


class Reconciler:
    def __init__(
        self, inventory: Inventory, ledger: Ledger, driver: OperationDriver, *, chunk_grace: float = 0.0
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver
        #: seconds a chunk fabric-dra made stays unknown to the ledger before it is removed (0: never)
        self.chunk_grace = chunk_grace
        #: orphan chunk → ``time.monotonic()`` when first found unknown
        self._unknown_chunks: dict[str, float] = {}
        #: devices whose entries changed, or were left unchecked, since the last check; and the
        #: unfinished entries (resumed at every check): what :meth:`reconcile_changes` looks at
        self._suspects: set[str] = set()
        self._unsettled: set[str] = set()
        #: the next check walks every entry (a ledger load, or none has run)
        self._walk = True
        ledger.listeners.append(self._ledger_changed)

    def _ledger_changed(self, device: str | None) -> None:
        if device is None:
            self._walk = True
            self._unsettled = {e.device for e in self.ledger.entries() if not e.state.settled}
            return
        self._suspects.add(device)
        entry = self.ledger.get(device)
        if entry is not None and not entry.state.settled:
            self._unsettled.add(device)
        else:
            self._unsettled.discard(device)

    async def sweep_chunks(self) -> list[str]:
        """Remove the chunks fabric-dra made (its marker) that no share's ledger entry knows, once
        each was unknown for ``chunk_grace`` seconds without a break: what a crash between the
        chunk's creation and its record leaves when the share is never asked for again. A share
        still being made names no chunk yet; the grace covers the time it takes to record one."""
        if not self.driver.is_leader() or self.chunk_grace <= 0:
            return []
        now = time.monotonic()
        seen: set[str] = set()
        removed: list[str] = []
        for pool in self.inventory.devices():
            if pool.memory_domain is None:
                continue
            made = await self.driver.chunks_made(pool)
            if made is None:
                continue
            known = {e.share.chunk for e in self.ledger.shares_of(pool.name) if e.share is not None}
            for chunk in made:
                if chunk in known:
                    continue
                seen.add(chunk)
                since = self._unknown_chunks.setdefault(chunk, now)
                if now - since < self.chunk_grace:
                    continue
                try:
                    await self.driver.remove_chunk(pool, chunk)
                except FabricError as err:
                    log.warning(
                        "orphan chunk not removed; will retry",
                        device=pool.name,
                        chunk=chunk,
                        error=err.message,
                    )
                    continue
                log.warning(
                    "removed a memory chunk fabric-dra made that no share holds",
                    device=pool.name,
                    chunk=chunk,
                    unknown_seconds=round(now - since, 1),
                )
                removed.append(chunk)
                seen.discard(chunk)
        self._unknown_chunks = {c: t for c, t in self._unknown_chunks.items() if c in seen}
        return removed

    async def reconcile(self) -> None:
        """Resume unfinished entries; drop bound entries whose binding the fabric no longer has.

        Not before the first full pass: a device the inventory does not hold yet is no device
        the fabric lost (at 10,000 bindings a restart's pass takes longer than ``retry_seconds``,
        and a reconcile run before it forgot every bound entry)."""
        if not self.driver.is_leader() or not self.inventory.loaded.is_set():
            return
        self._walk = False
        self._suspects = set()
        self.inventory.binding_changes()  # every device is looked at now
        now = time.monotonic()
        for entry in self.ledger.entries():
            await self._check(entry, now)

    async def reconcile_changes(self) -> None:
        """After a bindings-only pass: the entries that may have changed (the module's docstring);
        every entry when the inventory cannot say which devices' bindings changed."""
        if not self.driver.is_leader() or not self.inventory.loaded.is_set():
            return
        changed = self.inventory.binding_changes()
        if changed is None or self._walk:
            await self.reconcile()
            return
        names = changed | self._suspects | self._unsettled
        self._suspects = set()
        now = time.monotonic()
        for name in sorted(names):
            entry = self.ledger.get(name)
            if entry is not None:
                await self._check(entry, now)

    async def _check(self, entry: LedgerEntry, now: float) -> None:
        if self.driver.slot(entry.device).running:
            self._suspects.add(entry.device)  # its operation's end puts the entry: looked at then
            return
        if not entry.state.settled:  # bound, or warm: both are bindings the fabric must hold
            self.driver.resume(entry.device, now=now, fabric_back_at=self.inventory.recovered_at)
            return
        if entry.share is not None:
            return  # a share's chunk and Connection were confirmed when made; no device to read
        record = self.inventory.device(entry.device)
        if record is not None and entry.host in record.bound_hosts:
            return
        await self._verify_bound(entry, record)

    async def _verify_bound(self, entry: LedgerEntry, record: DeviceRecord | None) -> None:
        if record is not None:
            current = await self.driver.read_binding(record, entry.host)
            if current is None:
                self._suspects.add(entry.device)  # the fabric not read: looked at again next time
                return
            if entry.host in current:
                self.inventory.note_binding(entry.device, current)
                return
        async with self.driver.slot(entry.device).lock:
            if self.ledger.get(entry.device) is not entry or not entry.state.settled:
                return
            self.ledger.remove(entry.device)
            with contextlib.suppress(FabricError):
                await self.ledger.commit()
        log.warning(
            "binding removed outside fabric-dra; forgetting it",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
        )
        self.inventory.changed(entry.device)

    async def run(self) -> None:
        """Resume paused operations every ``retry_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(self.driver.settings.retry_seconds)
            with contextlib.suppress(FabricError):
                await self.reconcile()
            with contextlib.suppress(FabricError):
                await self.sweep_chunks()


class ForeignBindings:
    """Logs bindings made outside fabric-dra as they appear and go (never touches them)."""

    def __init__(self, devices: Callable[[], Iterable[DeviceFacts]]) -> None:
        self._devices = devices
        self._known: dict[str, str] = {}

    async def check(self) -> None:
        seen = {
            d.name: (d.node or f"host {d.host}")
            for d in self._devices()
            if not d.managed and d.state is api.BindingState.BOUND
        }
        for device, where in sorted(seen.items()):
            if self._known.get(device) != where:
                log.warning(
                    "device bound outside fabric-dra; reported, never touched",
                    device=device,
                    node=where,
                )
        for device in sorted(set(self._known) - set(seen)):
            log.info("binding made outside fabric-dra is gone", device=device, node=self._known[device])
        self._known = seen
