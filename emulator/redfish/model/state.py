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
import os
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from emulator.errors import ConfigError
from manager_api.devices import BindingStyle
from plumbing.fsutil import atomic_write, fsync_dir
from plumbing.logs import get_logger

__all__ = [
    "JOURNAL_FILE",
    "STATE_FILE",
    "BindingRecord",
    "ChunkRecord",
    "ClientRecord",
    "ConnectionRecord",
    "FabricState",
    "HostAddress",
    "JournalError",
    "OperationKind",
    "StateStore",
    "TaskRecord",
    "TaskResult",
    "TrackedBindings",
    "ZoneRecord",
    "id_order",
    "utcnow",
]

log = get_logger(__name__)

STATE_FILE = "fabric-state.json"
#: Finished tasks kept for their monitors and the TaskService; older ones are dropped, as the
#: TaskService's ``CompletedTaskOverWritePolicy`` ``Oldest`` says (TaskService v1_0_0 CSDL, the
#: ``OverWritePolicy`` enum: "Oldest completed tasks are overwritten"; the schema sets no count, so
#: a client must expect a finished task's monitor to go, and reads its result when it ends).
MAX_FINISHED_TASKS = 256
#: Task ends between two prunes (:meth:`FabricState.prune_tasks`): up to this many more finished
#: tasks are kept for a while, and a prune's scan of every task is paid once per this many ends.
PRUNE_EVERY = 32


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
    """The HTTP response the operation ended with, replayed by the task monitor. Never changed
    in place (a task's result is set once it ends): the task notes its change (below)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int
    location: str | None = None
    body: dict[str, Any] | None = None


class TaskRecord(_Model):
    """A Redfish task. It notes when it changes, so the store serialises again only the tasks that
    did (:class:`_Written`): every field is set, never changed in place — ``messages`` is a tuple,
    ``result`` frozen —, and setting one marks the record changed. A burst keeps hundreds of tasks
    running; serialising each of them again on every journal line was 2.4 ms a line at 800."""

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
    messages: tuple[dict[str, Any], ...] = ()
    result: TaskResult | None = None

    # Whether the store's JSON of the record is current: cleared by any change of a field. A slot,
    # not a pydantic private attribute: those are read through ``__getattr__`` (1.7 µs, 40 ns here).
    __slots__ = ("_serialised",)

    def model_post_init(self, context: Any, /) -> None:
        object.__setattr__(self, "_serialised", False)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        object.__setattr__(self, "_serialised", False)

    @property
    def serialised(self) -> bool:
        """Whether the JSON the store last made of this record is still what it holds."""
        return getattr(self, "_serialised", False)

    def mark_serialised(self) -> None:
        object.__setattr__(self, "_serialised", True)

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

    #: task ends since the last prune (:meth:`prune_tasks`); not part of the document
    _ends: int = PrivateAttr(default=0)  # (once a task's end: a private attribute's slower read is fine)

    def prune_tasks(self, *, now: bool = False) -> None:
        """Called at every task's end: drop the oldest finished tasks beyond
        :data:`MAX_FINISHED_TASKS`, once every :data:`PRUNE_EVERY` ends (or ``now``). The scan
        looks at every task, running ones too: done at each end it cost 0.39 s of the emulator's
        7.8 s of CPU in a correlated burst (up to 800 tasks), 0.07 s now."""
        self._ends += 1
        if not now and self._ends < PRUNE_EVERY:
            return
        self._ends = 0
        finished = [t for t in self.tasks.values() if t.finished]
        for task in sorted(finished, key=lambda t: t.end or t.start)[
            : max(0, len(finished) - MAX_FINISHED_TASKS)
        ]:
            del self.tasks[task.id]


SideEffect = Callable[[], None]


#: the journal of changes since the snapshot, beside it
JOURNAL_FILE = "fabric-state.journal"
#: the journal is folded into a new snapshot once it is larger than this and than the snapshot
JOURNAL_COMPACT_BYTES = 1 << 20
#: the collections of :class:`FabricState`, each a dict of records by Id
_COLLECTIONS = ("bindings", "zones", "connections", "chunks", "tasks", "faults")
#: the collections whose records change only by being replaced (bindings) or by saying so (tasks,
#: :class:`TaskRecord`): the JSON of the same unchanged object is reused, not made and compared
_SETTLED = frozenset({"bindings", "tasks"})
#: the scalars of :class:`FabricState` a journal record carries
_SCALARS = ("format", "version", "next_id", "event_seq")


class JournalError(ConfigError):
    """The journal cannot be applied to the snapshot it follows (a state the emulator cannot start with)."""


class _Written:
    """What was last handed to the disk, record by record, as JSON: the base a journal record
    is the difference from. A binding record is replaced, never changed in place, so an identical
    object has the JSON it had; a task notes its own changes (:class:`TaskRecord`). Every other
    record (client zones, connections, chunks, faults: a few) is serialised again and compared."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        #: collection → Id → (the record object, its JSON)
        self.records: dict[str, dict[str, tuple[BaseModel, str]]] = {c: {} for c in _COLLECTIONS}

    def fragment(self, collection: str, ident: str, record: BaseModel) -> tuple[str, bool]:
        """``record``'s JSON and whether it differs from what was written."""
        kept = self.records[collection].get(ident)
        reusable = collection in _SETTLED and (not isinstance(record, TaskRecord) or record.serialised)
        if reusable and kept is not None and kept[0] is record:
            return kept[1], False
        text = record.model_dump_json()
        if isinstance(record, TaskRecord):
            record.mark_serialised()  # (on the event loop, as every change of a task)
        self.records[collection][ident] = (record, text)
        return text, kept is None or kept[1] != text


class TrackedBindings(dict[str, "BindingRecord"]):
    """The state's bindings, noting the targets set or removed since the last write (a journal
    line looks at those, not at 10,000 bindings: a scan of them was 1.7 ms a commit) and each
    host's bindings (a bind places its device among the host's others: a scan of every binding
    for them was a fifth of the emulator's CPU per bind at 10,000)."""

    __slots__ = ("_by_host", "_next", "_place", "touched")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.touched: set[str] = set()
        #: host → target → binding
        self._by_host: dict[str, dict[str, BindingRecord]] = {}
        #: target → its place in the dict's order (a replaced binding keeps its place)
        self._place: dict[str, int] = {}
        for place, (target, binding) in enumerate(self.items()):
            self._by_host.setdefault(binding.host, {})[target] = binding
            self._place[target] = place
        self._next = len(self)

    def on_host(self, host: str) -> list[BindingRecord]:
        """The bindings to ``host``, in the dict's order (as a scan of every binding finds them)."""
        on_host = self._by_host.get(host)
        if not on_host:
            return []
        place = self._place
        return [b for _, b in sorted(on_host.items(), key=lambda item: place[item[0]])]

    def _unindex(self, key: str) -> None:
        old = super().get(key)
        if old is not None:
            on_host = self._by_host.get(old.host)
            if on_host is not None:
                on_host.pop(key, None)
                if not on_host:
                    del self._by_host[old.host]
            self._place.pop(key, None)

    def __setitem__(self, key: str, value: BindingRecord) -> None:
        self.touched.add(key)
        old = super().get(key)
        if old is None:
            self._place[key] = self._next
            self._next += 1
        elif old.host != value.host:
            self._by_host[old.host].pop(key, None)
            if not self._by_host[old.host]:
                del self._by_host[old.host]
        super().__setitem__(key, value)
        self._by_host.setdefault(value.host, {})[key] = value

    def __delitem__(self, key: str) -> None:
        self.touched.add(key)
        self._unindex(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.touched.add(key)
        self._unindex(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, BindingRecord]:
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        self.touched.update(self)
        self._by_host.clear()
        self._place.clear()
        super().clear()

    def __ior__(self, other: Any) -> TrackedBindings:  # type: ignore[override,misc]
        self.update(other)
        return self


class StateStore:
    """Owns the durable state: a snapshot, ``fabric-state.json``, and the journal of the changes
    since, ``fabric-state.journal``; load at start, durable group commits afterwards.

    A commit appends one line to the journal — the records it changed and the Ids it removed,
    the scalars, as JSON — and fsyncs it (``fdatasync``): its cost follows the change, not the
    state (at 10,000 bindings the whole document was 2.2 MB written and fsynced per commit).
    Once the journal is larger than :data:`JOURNAL_COMPACT_BYTES` and than the snapshot, the next
    commit writes a new snapshot instead (temp file, fsync, rename, fsync of the directory) and
    empties the journal. Each line carries the version it brings the state to; a load applies the
    lines newer than the snapshot, so a crash between a snapshot and the journal's truncation
    replays nothing twice. A line cut short by a crash was never acknowledged (the response waits
    for its fsync): the load stops there and the next write is a snapshot. The same after a failed
    write: what the journal holds after it is not trusted, the next commit writes a snapshot.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        self.journal_path = state_dir / JOURNAL_FILE
        self.state = FabricState()
        self._effects: list[SideEffect] = []
        self._batch: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._written = _Written()
        #: the bindings dict of :attr:`state` this store tracks (:meth:`_track`)
        self._bindings = TrackedBindings()
        #: the next write is a snapshot (at start, after a failed write, once the journal is long)
        self._snapshot_due = True
        self._snapshot_bytes = 0
        self._journal_bytes = 0
        #: the journal's file descriptor, open for appending while the store writes to it
        self._journal_fd: int | None = None
        #: snapshots and journal lines written (benchmarks, tests)
        self.snapshots = 0
        self.appends = 0

    def load(self) -> FabricState:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.state = FabricState()
            self._track(self.state)
            return self.state
        lines = self._journal_lines()
        if not lines:
            self.state = FabricState.model_validate_json(text)
            self._track(self.state)
            return self.state
        document = json.loads(text)
        if not isinstance(document, dict):
            raise JournalError("the snapshot is not a JSON object")
        base = document.get("version", 0)
        for line in lines:
            if not isinstance(line.get("version"), int) or line["version"] <= base:
                continue  # already in the snapshot (a crash came before the journal's truncation)
            for name in _SCALARS:
                if name in line:
                    document[name] = line[name]
            for collection, records in (line.get("set") or {}).items():
                if collection not in _COLLECTIONS or not isinstance(records, dict):
                    raise JournalError(f"the journal names no collection {collection!r}")
                document.setdefault(collection, {}).update(records)
            for collection, gone in (line.get("del") or {}).items():
                if collection not in _COLLECTIONS or not isinstance(gone, list):
                    raise JournalError(f"the journal names no collection {collection!r}")
                for ident in gone:
                    document.setdefault(collection, {}).pop(ident, None)
        self.state = FabricState.model_validate(document)
        self._track(self.state)
        return self.state

    def _journal_lines(self) -> list[dict[str, Any]]:
        """The journal's whole lines, up to the first that is not (a crash cut it short)."""
        try:
            raw = self.journal_path.read_bytes()
        except FileNotFoundError:
            return []
        lines: list[dict[str, Any]] = []
        offset = 0
        while offset < len(raw):
            end = raw.find(b"\n", offset)
            try:
                if end < 0:
                    raise ValueError("no line end")
                line = json.loads(raw[offset:end])
                if not isinstance(line, dict):
                    raise ValueError("not an object")
            except ValueError:
                log.warning(
                    "the state journal ends in a record cut short; it is left out (never acknowledged)",
                    path=str(self.journal_path),
                    dropped_bytes=len(raw) - offset,
                )
                break
            lines.append(line)
            offset = end + 1
        return lines

    def write_now(self) -> None:
        """Synchronous snapshot, for start-up before the event loop serves requests."""
        self._write(self._snapshot())

    def document(self) -> str:
        """:attr:`state` as JSON (what :meth:`load` reads back), each record's JSON reused
        where it is known not to have changed."""
        written = self._written
        self._track(self.state)
        self._bindings.touched.clear()  # every binding is in this document
        collections = []
        for collection in _COLLECTIONS:
            parts = []
            records: dict[str, BaseModel] = getattr(self.state, collection)
            for ident, record in records.items():
                text, _ = written.fragment(collection, ident, record)
                parts.append(f"{json.dumps(ident)}:{text}")
            kept = written.records[collection]
            if len(kept) > len(parts):
                for gone in [i for i in kept if i not in records]:
                    del kept[gone]
            collections.append(f"{json.dumps(collection)}:{{{','.join(parts)}}}")
        return f"{{{self._scalars()},{','.join(collections)}}}"

    def _journal_line(self) -> str:
        """One line of the records that changed since the last write, the Ids removed, the scalars."""
        written = self._written
        changed: list[str] = []
        removed: list[str] = []
        for collection in _COLLECTIONS:
            records: dict[str, BaseModel] = getattr(self.state, collection)
            kept = written.records[collection]
            parts = []
            gone: list[str] = []
            if records is self._bindings:  # only the targets set or removed since the last write
                for ident in sorted(self._bindings.touched):
                    binding = records.get(ident)
                    if binding is not None:
                        text, differs = written.fragment(collection, ident, binding)
                        if differs:
                            parts.append(f"{json.dumps(ident)}:{text}")
                    elif kept.pop(ident, None) is not None:
                        gone.append(ident)
                self._bindings.touched.clear()
            else:
                for ident, record in records.items():
                    text, differs = written.fragment(collection, ident, record)
                    if differs:
                        parts.append(f"{json.dumps(ident)}:{text}")
                if len(kept) > len(records):
                    gone = [i for i in kept if i not in records]
                    for ident in gone:
                        del kept[ident]
                if collection == "bindings":
                    self._track(self.state)
            if parts:
                changed.append(f"{json.dumps(collection)}:{{{','.join(parts)}}}")
            if gone:
                removed.append(f"{json.dumps(collection)}:{json.dumps(gone)}")
        return f'{{{self._scalars()},"set":{{{",".join(changed)}}},"del":{{{",".join(removed)}}}}}\n'

    def _scalars(self) -> str:
        """The state's counters as JSON members (every snapshot and journal line carries them)."""
        return ",".join(f"{json.dumps(name)}:{json.dumps(getattr(self.state, name))}" for name in _SCALARS)

    def _track(self, state: FabricState) -> None:
        """Have ``state``'s bindings note their changes (a state loaded or set anew has a plain dict)."""
        if state.bindings is not self._bindings:
            self._bindings = state.bindings = TrackedBindings(state.bindings)

    def _snapshot(self) -> tuple[str, str]:
        return ("snapshot", self.document())

    def _next_write(self) -> tuple[str, str]:
        """What the next write puts on disk: a journal line, or a snapshot when one is due."""
        if self._snapshot_due or (
            self._journal_bytes > JOURNAL_COMPACT_BYTES and self._journal_bytes > self._snapshot_bytes
        ):
            return self._snapshot()
        return ("journal", self._journal_line())

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
            data = self._next_write()
            effects, self._effects = self._effects, []
            # The host views follow the state: both are rebuilt from the state at start, so the
            # two writes may overlap; the response waits for both.
            outcomes = await asyncio.gather(
                asyncio.to_thread(self._write, data),
                asyncio.to_thread(self._run_effects, effects),
                return_exceptions=True,
            )
            failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failure is not None:
                # The waiters of this batch get the error; host-view updates that did not run stay
                # queued for the next commit, which writes the whole (newer) state as a snapshot.
                log.error("cannot persist the fabric state", path=str(self.path), error=str(failure))
                self._snapshot_due = True
                self._effects[:0] = effects
                batch.set_exception(failure)
                batch.exception()  # mark retrieved: its waiters may have gone away
                continue
            batch.set_result(None)

    def _write(self, data: tuple[str, str]) -> None:
        kind, text = data
        try:
            if kind == "snapshot":
                self._write_snapshot(text)
            else:
                self._append(text)
        except BaseException:
            self._snapshot_due = True  # the journal may end in a part of this line now
            raise

    def _write_snapshot(self, text: str) -> None:
        atomic_write(self.path, text, mode=0o600)
        # The snapshot holds every line of the journal: empty it (a crash before this point
        # leaves lines the load skips by their version).
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        fd = os.open(
            self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        try:
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        fsync_dir(self.path.parent)
        self._journal_fd = fd
        self._snapshot_bytes = len(text)
        self._journal_bytes = 0
        self._snapshot_due = False
        self.snapshots += 1

    def _append(self, line: str) -> None:
        fd = self._journal_fd
        if fd is None:
            raise OSError(f"the state journal {self.journal_path} is not open")
        payload = memoryview(line.encode())
        while payload:
            payload = payload[os.write(fd, payload) :]
        os.fdatasync(fd)
        self._journal_bytes += len(line)
        self.appends += 1

    def close(self) -> None:
        """Close the journal (the state stays on disk)."""
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

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
