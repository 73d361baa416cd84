"""One share's attempts on the fabric: carve its chunk and connect it to the node, or give it back.

A share's ledger entry (:class:`fabric.state.ledger.ShareRecord`, key ``<pool>/<shareID>``) is
written ``attaching`` before anything is sent; then each step the fabric takes is recorded durably
before the next is sent:

1. the chunk: found by its marker (an earlier run made it and crashed, or its answer was lost),
   else POSTed to the domain's ``MemoryChunks``; its URI recorded; read back to confirm its size;
2. the Connection: found among the fabric's Connections carrying the chunk to the node's host,
   else POSTed; its URI recorded; read back from the Connections collection to confirm.

Release (``detaching``, or the rollback of a failed attach) deletes every Connection of the chunk,
then the chunk — following the service's task while it sanitizes — and confirms it is gone.

A request whose outcome is unknown (no answer, the service unreachable, a task still running)
pauses the operation (:class:`~fabric.driver.attempts.Unresolved`); the resume reads the fabric
again before it sends anything, so a chunk is never made twice for one share.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from fabric.backends.base import Backend, BindContext
from fabric.backends.carving import MemoryCarver
from fabric.driver.attempts import ErrorHolder, FabricAttempts, Unresolved
from fabric.driver.records import OperationRecords
from fabric.driver.settings import OperationSettings
from fabric.state.ledger import LedgerEntry, ShareRecord
from fabric.state.model import DeviceRecord, HostRecord, MemoryDomainRecord
from fabric.state.operation_log import OperationLog
from manager_api.errors import AttachTimeout, BindFailed, FabricUnavailable, NotLeader
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["ShareAttempts"]

log = get_logger(__name__)


class ShareAttempts:
    def __init__(
        self,
        records: OperationRecords,
        operations: OperationLog,
        attempts: FabricAttempts,
        *,
        fence: Callable[[], None],
        settings: OperationSettings,
    ) -> None:
        self.records = records
        self.operations = operations
        self.attempts = attempts
        self.fence = fence
        self.settings = settings

    async def ensure(
        self,
        entry: LedgerEntry,
        record: DeviceRecord,
        host: HostRecord,
        backend: Backend,
        progress: ErrorHolder,
        *,
        bound: bool,
    ) -> None:
        """Make the share (``bound``) or give it back; raises :class:`Unresolved` to pause."""
        carver = getattr(backend, "carver", None)
        domain = record.memory_domain
        if not isinstance(carver, MemoryCarver) or domain is None or entry.share is None:
            raise BindFailed(f"{record.name} is no memory pool fabric-dra can carve chunks from")
        deadline = time.monotonic() + self.settings.operation_timeout
        try:
            self.fence()
            if entry.task_monitor:
                await self.attempts.settle_task(entry, deadline)
            if bound:
                await self._make(entry, record, host, carver, domain, deadline)
            else:
                await self._release(entry, carver, domain, deadline)
        except NotLeader as err:
            raise Unresolved(err) from None
        except (FabricUnavailable, AttachTimeout) as err:
            # Not known whether the fabric acted: the resume reads it again before sending.
            progress.error = err
            raise Unresolved(err) from None

    def _ctx(self, entry: LedgerEntry, bound: bool, deadline: float, action: str) -> BindContext:
        return BindContext(
            deadline=min(deadline, time.monotonic() + self.settings.task_timeout),
            fence=self.fence,
            on_task=functools.partial(self.attempts.record_task, entry, bound),
            on_progress=functools.partial(self.operations.progress, entry.operation_id),
            action=action,
        )

    async def _make(
        self,
        entry: LedgerEntry,
        pool: DeviceRecord,
        host: HostRecord,
        carver: MemoryCarver,
        domain: MemoryDomainRecord,
        deadline: float,
    ) -> None:
        share = _share(entry)
        if share.chunk is None:
            found = await carver.find_chunk(domain, share.share_id)
            uri = found.uri if found is not None else None
            if uri is None:
                ctx = self._ctx(entry, True, deadline, f"carve {share.chunk_mib} MiB from {pool.name}")
                uri = await carver.create_chunk(domain, share.chunk_mib, share.share_id, ctx)
                crash_point("manager.share.after-chunk-created")
                if uri is None:  # the service did not say where: its marker does
                    found = await carver.find_chunk(domain, share.share_id)
                    uri = found.uri if found is not None else None
            if uri is None:
                raise BindFailed(f"the fabric made no chunk of {share.chunk_mib} MiB in {pool.name}")
            await self.records.share_step(entry, chunk=uri)
            crash_point("manager.share.chunk-recorded")
        chunk = str(_share(entry).chunk)
        made = await carver.chunk(chunk)
        if made is None:
            await self.records.share_step(entry, chunk=None)
            raise BindFailed(f"chunk {chunk} of {pool.name} is gone from the fabric")
        if made.size_mib is not None and made.size_mib < share.chunk_mib:
            raise BindFailed(
                f"the fabric made chunk {chunk} of {made.size_mib} MiB; {share.chunk_mib} MiB was asked"
            )
        if _share(entry).connection is None:
            connected = [u for u, hosts in await carver.connections_of(chunk) if host.id in hosts]
            uri = connected[0] if connected else None
            if uri is None:
                ctx = self._ctx(entry, True, deadline, f"connect {chunk} to {host.id}")
                uri = await carver.connect(pool, chunk, host, share.share_id, ctx)
                crash_point("manager.share.after-connection")
                if uri is None:
                    connected = [u for u, hosts in await carver.connections_of(chunk) if host.id in hosts]
                    uri = connected[0] if connected else None
            if uri is None:
                raise BindFailed(f"the fabric made no Connection of {chunk} to {host.id}")
            await self.records.share_step(entry, connection=uri)
        connection = _share(entry).connection
        confirmed = any(
            u == connection and host.id in hosts for u, hosts in await carver.connections_of(chunk)
        )
        if not confirmed:
            await self.records.share_step(entry, connection=None)
            raise BindFailed(
                f"the Redfish service accepted Connection {connection} of {chunk} to {host.id} but its "
                "Connections collection does not show it"
            )

    async def _release(
        self, entry: LedgerEntry, carver: MemoryCarver, domain: MemoryDomainRecord, deadline: float
    ) -> None:
        share = _share(entry)
        chunk = share.chunk
        if chunk is None:
            found = await carver.find_chunk(domain, share.share_id)
            chunk = found.uri if found is not None else None
        if chunk is None:
            return  # never made: nothing to give back
        ctx = self._ctx(entry, False, deadline, f"release {chunk}")
        connections = [u for u, _ in await carver.connections_of(chunk)]
        if share.connection and share.connection not in connections:
            connections.append(share.connection)
        for uri in connections:
            await carver.delete(uri, ctx)
        if connections:
            crash_point("manager.share.after-connection-deleted")
        await carver.delete(chunk, self._ctx(entry, False, deadline, f"delete {chunk}"))
        if not await carver.gone(chunk):
            raise BindFailed(f"the fabric still has chunk {chunk} after its DELETE")
        log.info("share released", device=entry.device, node=entry.node, claim=entry.claim_uid, chunk=chunk)


def _share(entry: LedgerEntry) -> ShareRecord:
    if entry.share is None:
        raise BindFailed(f"ledger entry {entry.device} is no share")
    return entry.share
