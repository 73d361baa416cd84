"""Memory chunks carved from a CXL device's pool: created by a POST to its memory domain's
``MemoryChunks`` (MemoryDomain v1_5_0 ``AllowsMemoryChunkCreation``), deleted by a DELETE.

A chunk's size is the domain's ``MinMemoryChunkSizeMiB`` plus a whole number of
``MemoryChunkIncrementMiB`` (MemoryDomain_v1.xml), no more than the domain's free memory. The
memory is counted by the total: a chunk may be made of several ranges of the domain, as a CXL
dynamic-capacity device hands out extents, so a domain never refuses memory it has free.

Checks and changes run without an ``await`` in between on the one event loop (as every change of
the engine), so concurrent creates never carve more than a domain has. A carved chunk is a target
like a pre-made one: connected to a host by a Connection, and not deletable while one holds it. Its
release (the DELETE) changes the state only when it completes — after the profile's sanitize time,
in a task when the profile has tasks — so after a crash the chunk is there or gone, never half.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.errors import ChunkSizeRefused, DomainExhausted, TargetBusy
from emulator.redfish.engine.bindings import BindingTable
from emulator.redfish.engine.events import EventBus, FabricEvent
from emulator.redfish.engine.journal import Change
from emulator.redfish.engine.operation import Operation
from emulator.redfish.model import uris
from emulator.redfish.model.state import ChunkRecord, FabricState, utcnow
from emulator.topology import Chunk, Device, FabricIndex
from emulator.topology.index import chunk_id
from plumbing.logs import get_logger

__all__ = ["Carver"]

log = get_logger(__name__)

_MIB = 1 << 20


def _chunk(record: ChunkRecord) -> Chunk:
    return Chunk(
        id=record.id,
        device=record.device,
        index=record.index,
        size_bytes=record.size_mib * _MIB,
        offset_bytes=record.extents[0][0] * _MIB,
        carved=True,
    )


@dataclass(eq=False)
class Carver:
    index: FabricIndex
    table: BindingTable
    events: EventBus

    @property
    def state(self) -> FabricState:
        return self.table.state

    def restore(self) -> None:
        """At start: every durable chunk of a pool the topology still has is a target again."""
        for ident, record in list(self.state.chunks.items()):
            device = self.index.devices.get(record.device)
            if device is None or device.pool is None:
                log.warning("dropping a memory chunk of a pool the topology no longer has", device=ident)
                del self.state.chunks[ident]
                continue
            self.index.carve(_chunk(record))

    def records(self, device: Device) -> list[ChunkRecord]:
        return [r for r in self.state.chunks.values() if r.device == device.id]

    def used_mib(self, device: Device) -> int:
        """The memory of ``device``'s pool in its chunks (a chunk being released counts until it is gone)."""
        return sum(r.size_mib for r in self.records(device))

    def total_mib(self, device: Device) -> int:
        return int(device.model.memory or 0) // _MIB

    # --- create --------------------------------------------------------------------------------

    def create(
        self, device: Device, size_mib: int, *, name: str | None = None, description: str | None = None
    ) -> tuple[Chunk, Change]:
        """Carve a chunk of ``size_mib`` from ``device``'s pool, now (synchronously); raises
        :class:`ChunkSizeRefused` or :class:`DomainExhausted` when the domain cannot."""
        pool = device.pool
        if pool is None:
            raise ValueError(f"{device.id} has no pool to carve chunks from")
        total = self.total_mib(device)
        domain = uris.memory_domain(device.id)
        if size_mib < pool.min_chunk_mib or size_mib > total:
            raise ChunkSizeRefused(
                f"A chunk of {device.id} is {pool.min_chunk_mib} to {total} MiB; {size_mib} MiB was asked.",
                size_mib,
                misaligned=False,
            )
        if (size_mib - pool.min_chunk_mib) % pool.increment_mib:
            below = size_mib - (size_mib - pool.min_chunk_mib) % pool.increment_mib
            raise ChunkSizeRefused(
                f"A chunk of {device.id} is {pool.min_chunk_mib} MiB plus a multiple of "
                f"{pool.increment_mib} MiB; {size_mib} MiB is not (the nearest are {below} and "
                f"{below + pool.increment_mib} MiB).",
                size_mib,
                misaligned=True,
            )
        records = self.records(device)
        if len(records) >= pool.max_chunks:
            raise DomainExhausted(
                f"{device.id} holds {pool.max_chunks} chunks, as many as it can; delete one first.",
                domain,
                limit=True,
            )
        free = total - sum(r.size_mib for r in records)
        if size_mib > free:
            raise DomainExhausted(
                f"{device.id} has {free} MiB of its {total} MiB free; {size_mib} MiB was asked.", domain
            )
        number = int(self.state.allocate_id())
        record = ChunkRecord(
            id=chunk_id(device.id, number),
            device=device.id,
            index=number,
            size_mib=size_mib,
            extents=_allocate(sorted(e for r in records for e in r.extents), total, size_mib),
            name=name,
            description=description,
            created=utcnow(),
        )
        self.state.chunks[record.id] = record
        chunk = _chunk(record)
        self.index.carve(chunk)
        self.table.revision.bump()
        log.info("memory chunk created", device=record.id, size_mib=size_mib, free_mib=free - size_mib)
        events = [
            self.events.make("ResourceCreated", prefix="ResourceEvent", origin=uris.chunk(device.id, number)),
            self.events.make("ResourceChanged", prefix="ResourceEvent", origin=domain),
        ]
        return chunk, ([], events)

    # --- release -------------------------------------------------------------------------------

    def check_release(self, op: Operation) -> None:
        """Raise unless ``op``'s chunks may be deleted now: connected to no host, nothing in flight."""
        for t in op.targets:
            bound = self.state.bindings.get(t)
            if bound is not None:
                through = f" through connection {bound.connection}" if bound.connection else ""
                raise TargetBusy(f"{t} is connected to {bound.host}{through}; delete the connection first.")
            task_id = self.table.inflight.get(t)
            if task_id is not None:
                raise TargetBusy(f"{t} has an operation in progress (task {task_id}).")

    def release(self, op: Operation) -> Change:
        """Delete ``op``'s chunks (synchronously): their memory is free again."""
        events: list[FabricEvent] = []
        for t in op.targets:
            record = self.state.chunks.pop(t, None)
            if record is None:
                continue
            self.index.uncarve(t)
            log.info("memory chunk deleted", device=t, size_mib=record.size_mib)
            events += [
                self.events.make(
                    "ResourceRemoved", prefix="ResourceEvent", origin=uris.chunk(record.device, record.index)
                ),
                self.events.make(
                    "ResourceChanged", prefix="ResourceEvent", origin=uris.memory_domain(record.device)
                ),
            ]
        self.table.revision.bump()
        return [], events


def _allocate(used: list[tuple[int, int]], total: int, size: int) -> list[tuple[int, int]]:
    """Ranges ``(offset, size)`` for ``size`` MiB in a domain of ``total`` MiB whose ranges
    ``used`` (sorted) are taken: the first free range that holds all of it, else the free ranges
    from the lowest up (the caller checked that enough is free)."""
    gaps: list[tuple[int, int]] = []
    at = 0
    for offset, length in used:
        if offset > at:
            gaps.append((at, offset - at))
        at = max(at, offset + length)
    if total > at:
        gaps.append((at, total - at))
    whole = next((g for g in gaps if g[1] >= size), None)
    if whole is not None:
        return [(whole[0], size)]
    taken: list[tuple[int, int]] = []
    for offset, length in gaps:
        part = min(length, size - sum(t[1] for t in taken))
        taken.append((offset, part))
        if sum(t[1] for t in taken) == size:
            break
    return taken
