"""The emulator's durable state and how it reaches the disk.

The fabric state — which target is bound to which host, through which zone or connection,
the tasks and the injected faults — is one pydantic document, ``<state-dir>/fabric-state.json``.
Every mutation is committed by rewriting that file atomically (temp file, fsync, rename,
fsync of the directory), so after a crash the file holds the state before or after a
mutation, never half of one. Concurrent mutations share one write (group commit): each waits
for the first write that starts after its change, so a response is only sent once the change
it reports is on disk.

The document is serialised binding by binding, each binding's JSON kept while its record is the
same object (records are replaced, never changed in place): a bind serialises one record, not
the 10,000 of a large fabric (90 ms of the event loop at that size, on every commit).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from manager_api.devices import BindingStyle
from plumbing.fsutil import atomic_write
from plumbing.logs import get_logger

__all__ = [
    "STATE_FILE",
    "BindingRecord",
    "ChunkRecord",
    "ClientRecord",
    "ConnectionRecord",
    "FabricState",
    "HostAddress",
    "OperationKind",
    "StateStore",
    "TaskRecord",
    "TaskResult",
    "ZoneRecord",
    "id_order",
    "utcnow",
]

log = get_logger(__name__)

STATE_FILE = "fabric-state.json"
#: Finished tasks kept for their monitors and the TaskService; older ones are dropped.
MAX_FINISHED_TASKS = 256


def utcnow() -> datetime:
    return datetime.now(UTC)


def id_order(ident: str) -> int:
    """Sort key of an Id from :meth:`FabricState.allocate_id`: in order of allocation, not as text."""
    return int(ident) if ident.isdigit() else 0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OperationKind(StrEnum):
    BIND = "bind"
    UNBIND = "unbind"
    #: the DELETE of a memory chunk carved from a pool: its memory is sanitized, then free again
    RELEASE = "release"


class HostAddress(_Model):
    """Where a bound target shows up inside its host (its emulated sysfs names)."""

    bdf: str | None = None
    iommu_group: int | None = None
    nvme: int | None = None
    memdev: int | None = None
    region: int | None = None
    #: a CXL region's host physical address range (bytes, block-aligned): its memory blocks are
    #: ``memory<hpa / block size>`` on
    hpa: int | None = None
    hpa_bytes: int | None = None
    #: the CPU-less NUMA node a CXL region's memory comes up on
    node: int | None = None


class BindingRecord(_Model):
    target: str
    host: str
    style: BindingStyle
    zone: str | None = None
    connection: str | None = None
    since: datetime
    address: HostAddress = Field(default_factory=HostAddress)
    #: resets of the device while bound (a hot-add starts from a powered-off slot: a clean function)
    resets: int = 0
    last_reset: datetime | None = None


class ClientRecord(_Model):
    """A zone or connection a client created with POST, in its fabric, for its host."""

    id: str
    fabric: str
    host: str
    name: str | None = None
    description: str | None = None
    created: datetime


class ZoneRecord(ClientRecord):
    """A zone of endpoints; each host's own zone is implicit, this is one a client created."""


class ChunkRecord(_Model):
    """A memory chunk a client carved from a CXL device's pool (POST to its domain's MemoryChunks)."""

    #: target Id, ``<device>-chunk<index>``
    id: str
    device: str
    #: its Id in the domain's MemoryChunks collection
    index: int
    size_mib: int
    #: where its memory lies in the domain, ``(offset, size)`` in MiB, lowest first: a chunk may be
    #: made of several ranges, as a CXL dynamic-capacity device hands out extents
    extents: list[tuple[int, int]]
    name: str | None = None
    description: str | None = None
    created: datetime


class ConnectionRecord(ClientRecord):
    """A CXL connection: the memory chunks bound through it, and their access."""

    chunks: list[str]
    access: list[str]


class TaskResult(_Model):
    """The HTTP response the operation ended with, replayed by the task monitor."""

    status: int
    location: str | None = None
    body: dict[str, Any] | None = None


class TaskRecord(_Model):
    id: str
    kind: OperationKind
    style: BindingStyle
    #: the host a bind or unbind is for; None for a chunk's release
    host: str | None
    targets: list[str]
    zone: str | None = None
    connection: str | None = None
    state: Literal["New", "Running", "Completed", "Exception", "Cancelled", "Interrupted"]
    status: Literal["OK", "Warning", "Critical"] = "OK"
    percent: int = 0
    start: datetime
    end: datetime | None = None
    method: str
    uri: str
    body: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    result: TaskResult | None = None

    @property
    def finished(self) -> bool:
        return self.state not in ("New", "Running")


class FaultRecord(_Model):
    id: str
    spec: dict[str, Any]
    created: datetime


class FabricState(_Model):
    format: Literal[1] = 1
    #: increases with every committed change
    version: int = 0
    next_id: int = 1
    event_seq: int = 0
    bindings: dict[str, BindingRecord] = Field(default_factory=dict)
    zones: dict[str, ZoneRecord] = Field(default_factory=dict)
    connections: dict[str, ConnectionRecord] = Field(default_factory=dict)
    #: memory chunks carved from pools, by target Id
    chunks: dict[str, ChunkRecord] = Field(default_factory=dict)
    tasks: dict[str, TaskRecord] = Field(default_factory=dict)
    faults: dict[str, FaultRecord] = Field(default_factory=dict)

    def allocate_id(self) -> str:
        ident = str(self.next_id)
        self.next_id += 1
        return ident

    def prune_tasks(self) -> None:
        finished = [t for t in self.tasks.values() if t.finished]
        for task in sorted(finished, key=lambda t: t.end or t.start)[
            : max(0, len(finished) - MAX_FINISHED_TASKS)
        ]:
            del self.tasks[task.id]


SideEffect = Callable[[], None]


class StateStore:
    """Owns ``fabric-state.json``: load at start, durable group commits afterwards."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        self.state = FabricState()
        self._effects: list[SideEffect] = []
        self._batch: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        #: target → (its record, ``"target":{record JSON}``) as last serialised
        self._fragments: dict[str, tuple[BindingRecord, str]] = {}

    def load(self) -> FabricState:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.state = FabricState()
        else:
            self.state = FabricState.model_validate_json(text)
        return self.state

    def write_now(self) -> None:
        """Synchronous write, for start-up before the event loop serves requests."""
        atomic_write(self.path, self.document(), mode=0o600)

    def document(self) -> str:
        """:attr:`state` as JSON (what :meth:`load` reads back), with the bindings' JSON reused."""
        fragments = self._fragments
        parts = []
        for target, record in self.state.bindings.items():
            kept = fragments.get(target)
            if kept is None or kept[0] is not record:
                kept = fragments[target] = (record, f"{json.dumps(target)}:{record.model_dump_json()}")
            parts.append(kept[1])
        if len(fragments) > len(parts):
            for gone in [t for t in fragments if t not in self.state.bindings]:
                del fragments[gone]
        rest = self.state.model_dump_json(exclude={"bindings"})
        return f'{rest[:-1]},"bindings":{{{",".join(parts)}}}}}'

    async def commit(self, effects: list[SideEffect] | None = None) -> None:
        """Persist the current state and then run ``effects``; return once both are done.

        Callers mutate :attr:`state` synchronously (no ``await`` between check and change),
        then await this. Effects (host sysfs updates) run in a worker thread alongside the
        write, in commit order.
        """
        self.state.version += 1
        if effects:
            self._effects.extend(effects)
        loop = asyncio.get_running_loop()
        if self._batch is None:
            self._batch = loop.create_future()
        batch = self._batch
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_loop())
        await asyncio.shield(batch)

    async def _write_loop(self) -> None:
        while self._batch is not None:
            batch, self._batch = self._batch, None
            data = self.document()
            effects, self._effects = self._effects, []
            # The host views follow the state: both are rebuilt from the state file at start, so
            # the two writes may overlap; the response waits for both.
            outcomes = await asyncio.gather(
                asyncio.to_thread(self._write, data),
                asyncio.to_thread(self._run_effects, effects),
                return_exceptions=True,
            )
            failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failure is not None:
                # The waiters of this batch get the error; host-view updates that did not run stay
                # queued for the next commit, which writes the whole (newer) state again.
                log.error("cannot persist the fabric state", path=str(self.path), error=str(failure))
                self._effects[:0] = effects
                batch.set_exception(failure)
                batch.exception()  # mark retrieved: its waiters may have gone away
                continue
            batch.set_result(None)

    def _write(self, data: str) -> None:
        atomic_write(self.path, data, mode=0o600)

    @staticmethod
    def _run_effects(effects: list[SideEffect]) -> None:
        while effects:
            effect = effects.pop(0)
            try:
                effect()
            except OSError as err:
                log.error("cannot update an emulated host view", error=str(err))

    async def drain(self) -> None:
        """Wait until every commit so far is written (used at shutdown)."""
        if self._writer is not None and not self._writer.done():
            await self._writer
