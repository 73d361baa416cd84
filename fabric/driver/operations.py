"""The operation driver: at most one operation at a time per device, from durable intent to result.

* **One operation at a time per device.** Each device has at most one *driver* task that moves its
  ledger entry to where it should be (``attaching`` → bound, ``detaching`` → gone), step by step.
  Whoever asks for an operation (:mod:`fabric.bindings`) records its intent first
  (:class:`fabric.driver.records.OperationRecords`), then starts or joins the device's task
  (:meth:`OperationDriver.kick`) and waits on the device's slot (:mod:`fabric.driver.slots`).
* **Nothing half-done.** An attach that fails for good turns into a rollback (``detaching`` with
  ``rollback``): the driver makes sure the device is not bound, then drops the entry.
* **Held until the fabric lets go.** An unbind the fabric refuses keeps the device held and is
  tried again after growing pauses.
* **Paused, not lost.** An operation that cannot finish now (the fabric unreachable, a task still
  running, the Lease lost) keeps its entry and is resumed later (:meth:`OperationDriver.resume`).
* **Leader only.** Every fabric mutation is fenced by the Lease (:class:`manager_api.errors.NotLeader`).
* **Reset between tenants.** A warm device given back ``reset: pending`` is reset before anything
  else happens to it (:mod:`fabric.driver.resets`).

What one operation does on the fabric, reading before every change, is
:class:`fabric.driver.attempts.FabricAttempts`; what it leaves behind is
:class:`fabric.driver.records.OperationRecords`; resuming what was left unfinished is
:mod:`fabric.bindings.reconcile`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fabric.backends.base import Backend, BindContext
from fabric.backends.carving import MemoryCarver
from fabric.driver.attempts import FabricAttempts, TaskControl, Unresolved
from fabric.driver.records import OperationRecords
from fabric.driver.resets import TenantResets
from fabric.driver.settings import OperationSettings
from fabric.driver.shares import ShareAttempts
from fabric.driver.slots import DeviceSlot, DeviceSlots
from fabric.state.inventory import Inventory
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState
from fabric.state.metrics import ManagerMetrics
from fabric.state.model import DeviceRecord, HostRecord
from fabric.state.operation_log import OperationLog
from manager_api.errors import FabricError, NotLeader
from plumbing.kube.events import EventRecorder
from plumbing.logs import get_logger

__all__ = ["OperationDriver"]

log = get_logger(__name__)


class OperationDriver:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        backend_for: Callable[[DeviceRecord], Backend],
        tasks: TaskControl,
        *,
        operations: OperationLog | None = None,
        metrics: ManagerMetrics | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        settings: OperationSettings | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.backend_for = backend_for
        self.operations = operations or OperationLog()
        self.is_leader = is_leader
        self.settings = settings or OperationSettings()
        self.slots = DeviceSlots(self.settings.retry_seconds)
        self.records = OperationRecords(inventory, ledger, self.operations, self.slots, metrics=metrics)
        self.attempts = FabricAttempts(
            ledger,
            self.operations,
            tasks,
            node_for_host=inventory.node_for_host,
            fence=self.fence,
            settings=self.settings,
        )
        #: shares of memory pools: a chunk carved and connected, or given back
        self.shares = ShareAttempts(
            self.records, self.operations, self.attempts, fence=self.fence, settings=self.settings
        )
        self.resets = TenantResets(
            inventory,
            ledger,
            self.records,
            self.slots,
            backend_for,
            fence=self.fence,
            settings=self.settings,
            metrics=metrics,
            events=events,
        )

    def fence(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica lost its leadership", retry_after=2.0)

    def slot(self, device: str) -> DeviceSlot:
        return self.slots(device)

    async def read_binding(self, record: DeviceRecord, host_id: str) -> tuple[str, ...] | None:
        """The hosts the fabric binds ``record`` to, read now through its backend (asking
        ``host_id``'s side too where a style keeps the binding there); None when it cannot be read
        (the service failed, or no backend serves the device's fabric any more)."""
        try:
            host = self.inventory.host(host_id)
            return await self.backend_for(record).read_binding(record, (host,) if host else ())
        except (FabricError, KeyError):
            return None

    async def chunks_made(self, pool: DeviceRecord) -> list[str] | None:
        """The chunks fabric-dra made (its marker) in memory pool ``pool``, read now; None when
        they cannot be read."""
        domain = pool.memory_domain
        carver = getattr(self.backend_for(pool), "carver", None) if domain is not None else None
        if domain is None or not isinstance(carver, MemoryCarver):
            return None
        try:
            return [c.uri for c in await carver.chunks(domain) if c.share_id is not None]
        except (FabricError, KeyError):
            return None

    async def remove_chunk(self, pool: DeviceRecord, chunk: str) -> None:
        """Delete a chunk fabric-dra made that no ledger entry knows (an orphan): its Connections,
        then it (following the sanitize task)."""
        carver = getattr(self.backend_for(pool), "carver", None)
        if not isinstance(carver, MemoryCarver):
            return
        ctx = BindContext(
            deadline=time.monotonic() + self.settings.task_timeout, fence=self.fence, action=f"remove {chunk}"
        )
        for uri, _ in await carver.connections_of(chunk):
            await carver.delete(uri, ctx)
        await carver.delete(chunk, ctx)

    def kick(self, device: str) -> None:
        """Start the device's task, unless it runs: it moves the device's entry to where it should be."""
        slot = self.slot(device)
        if slot.driver is None or slot.driver.done():
            slot.driver = asyncio.create_task(self._drive(device), name=f"drive-{device}")

    def resume(self, device: str, *, now: float, fabric_back_at: float) -> None:
        """Start the driver of an unfinished entry once its pause is over, or at once when the
        fabric came back (``fabric_back_at``) after the operation paused."""
        slot = self.slot(device)
        if now >= slot.retry_at or fabric_back_at > slot.paused_at:
            self.kick(device)

    # -- the device's task -----------------------------------------------------------------------

    async def _drive(self, device: str) -> None:
        slot = self.slot(device)
        try:
            while await self._step(device, slot):
                pass
        except Exception:
            log.exception("device driver crashed", device=device)
            slot.retry_at = time.monotonic() + self.settings.retry_seconds
        finally:
            slot.driver = None
            slot.signal()

    async def _step(self, device: str, slot: DeviceSlot) -> bool:
        """One step of the device's operation; whether another step follows."""
        entry = self.ledger.get(device)
        if entry is not None and self.resets.due(entry):
            # True: cleaned, or taken out of the pool (see where it stands); False: nothing changed
            return await self.resets.reset(entry)
        if entry is None or entry.state.settled:
            return False
        self.records.adopt(entry)
        # a share's entry is keyed by the share; its device is the pool
        record = self.inventory.device(entry.share.pool if entry.share is not None else device)
        host = self.inventory.host(entry.host)
        if record is None or host is None:
            await self.records.vanished(entry, record is None)
            return False
        backend = self.backend_for(record)
        try:
            return await self._attempt(entry, record, host, backend, slot)
        finally:
            slot.signal()

    async def _attempt(
        self, entry: LedgerEntry, record: DeviceRecord, host: HostRecord, backend: Backend, slot: DeviceSlot
    ) -> bool:
        """Bind (an ``attaching`` entry) or unbind on the fabric and record the result; whether
        another step follows."""
        binding = entry.state is LedgerState.ATTACHING
        ensure = self.shares.ensure if entry.share is not None else self.attempts.ensure
        try:
            await ensure(entry, record, host, backend, slot, bound=binding)
        except Unresolved as err:
            self._paused(entry, slot, err.cause)
            return False
        except FabricError as err:
            if binding:
                await self.records.attach_failed(entry, record, err)
                return True  # drive the rollback
            self._unbind_refused(entry, slot, err)
            return False
        if binding:
            await self.records.attached(entry, record)
            return True
        slot.refused.reset()
        await self.records.detached(entry, record)
        return False

    def _paused(self, entry: LedgerEntry, slot: DeviceSlot, cause: FabricError) -> None:
        """The operation cannot finish now: its entry stays, resumed after a pause (or at once when
        the fabric comes back)."""
        slot.error = cause
        slot.paused_at = time.monotonic()
        slot.retry_at = slot.paused_at + self.settings.retry_seconds
        self.operations.running(entry.operation_id, error=cause)
        log.warning(
            "operation paused, will resume",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            state=str(entry.state),
            error=cause.message,
        )

    def _unbind_refused(self, entry: LedgerEntry, slot: DeviceSlot, err: FabricError) -> None:
        """The device stays held (never lost, never given to another node) and the unbind is
        retried with growing pauses; the operation shows the error."""
        slot.error = err
        pause = slot.refused.next()
        slot.retry_at = time.monotonic() + pause
        entry.error = err.message
        self.operations.running(entry.operation_id, error=err)
        log.error(
            "unbind failed, will retry",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            retry_in=round(pause, 1),
            error=err.message,
        )
