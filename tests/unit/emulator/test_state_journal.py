"""The emulator's state on disk: a snapshot and the journal of changes after it
(emulator/redfish/model/state.py). What a load reads back is the state every acknowledged
commit left, whatever was cut short: a journal line torn by a crash, a crash between a new
snapshot and the journal's truncation, a failed write."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest

from emulator.redfish.model import state as state_module
from emulator.redfish.model.state import (
    MAX_FINISHED_TASKS,
    PRUNE_EVERY,
    BindingRecord,
    FabricState,
    FaultRecord,
    OperationKind,
    StateStore,
    TaskRecord,
    TaskResult,
    TrackedBindings,
    ZoneRecord,
    utcnow,
)
from manager_api.devices import BindingStyle


def _bind(store: StateStore, target: str, host: str) -> None:
    store.state.bindings[target] = BindingRecord(
        target=target, host=host, style=BindingStyle.ZONE, zone=host, since=utcnow()
    )


def _task(store: StateStore, ident: str, target: str) -> TaskRecord:
    task = _running_task(ident, target)
    store.state.tasks[ident] = task
    return task


def _running_task(ident: str, target: str) -> TaskRecord:
    return TaskRecord(
        id=ident,
        kind=OperationKind.BIND,
        style=BindingStyle.ZONE,
        host="h1",
        targets=[target],
        state="Running",
        start=utcnow(),
        method="POST",
        uri="/redfish/v1/Fabrics/PCIe/Zones/h1/Actions/Zone.AddEndpoint",
    )


def _reloaded(path: Path) -> FabricState:
    return StateStore(path).load()


def _same(a: FabricState, b: FabricState) -> None:
    assert a.model_dump() == b.model_dump()


def test_every_kind_of_change_reads_back_through_the_journal(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    for i in range(20):
        _bind(store, f"gpu{i}", f"h{i % 3}")
    store.write_now()
    snapshot = (tmp_path / "fabric-state.json").read_bytes()

    async def changes() -> None:
        _bind(store, "gpu1", "h9")  # replaced
        del store.state.bindings["gpu2"]  # removed
        store.state.bindings.pop("gpu3")
        task = _task(store, "7", "gpu1")
        store.state.zones["z1"] = ZoneRecord(id="z1", fabric="PCIe", host="h1", created=utcnow())
        store.state.faults["f1"] = FaultRecord(id="f1", spec={"Kind": "Drop"}, created=utcnow())
        store.state.next_id = 42
        await store.commit()
        # records changed in place: a running task, a fault's spec
        task.state, task.percent = "Completed", 100
        task.messages = (*task.messages, {"MessageId": "TaskEvent.1.0.TaskCompletedOK"})
        store.state.faults["f1"].spec = {"Kind": "Drop", "Count": 2}
        del store.state.zones["z1"]
        await asyncio.gather(*(store.commit() for _ in range(5)))  # shared writes
        store.state.event_seq = 17
        await store.commit()

    asyncio.run(changes())
    assert (tmp_path / "fabric-state.json").read_bytes() == snapshot, "no snapshot written again"
    assert store.appends >= 3 and store.snapshots == 1
    reloaded = _reloaded(tmp_path)
    _same(reloaded, store.state)
    assert reloaded.tasks["7"].state == "Completed" and reloaded.faults["f1"].spec["Count"] == 2
    assert set(reloaded.bindings) == {f"gpu{i}" for i in range(20)} - {"gpu2", "gpu3"}
    assert reloaded.zones == {}


def test_a_long_journal_is_folded_into_a_new_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "JOURNAL_COMPACT_BYTES", 2_000)
    store = StateStore(tmp_path)
    store.load()
    store.write_now()

    async def churn() -> None:
        for i in range(200):
            _bind(store, f"gpu{i % 7}", f"h{i}")
            if i % 3 == 0:
                store.state.bindings.pop(f"gpu{(i + 1) % 7}", None)
            await store.commit()

    asyncio.run(churn())
    assert store.snapshots > 2
    assert (tmp_path / "fabric-state.journal").stat().st_size <= 2_000 + 1_000
    _same(_reloaded(tmp_path), store.state)


def test_a_torn_last_line_is_left_out_and_the_rest_kept(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.write_now()

    async def two() -> None:
        _bind(store, "gpu0", "h1")
        await store.commit()
        _bind(store, "gpu1", "h2")
        await store.commit()

    asyncio.run(two())
    acknowledged = store.state.model_dump()
    journal = tmp_path / "fabric-state.journal"
    # a third commit the crash cut half-way through its line (never acknowledged)
    whole = journal.read_bytes()
    third = b'{"format":1,"version":99,"set":{"bindings":{"gpu2":{"target":"gp'
    journal.write_bytes(whole + third)
    again = StateStore(tmp_path)
    assert again.load().model_dump() == acknowledged

    async def after() -> None:  # the next write after such a load is a snapshot
        _bind(again, "gpu3", "h3")
        await again.commit()

    asyncio.run(after())
    assert again.snapshots == 1 and journal.stat().st_size == 0
    assert set(_reloaded(tmp_path).bindings) == {"gpu0", "gpu1", "gpu3"}


def test_a_crash_between_snapshot_and_truncation_replays_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.write_now()
    journal = tmp_path / "fabric-state.journal"

    async def run() -> bytes:
        _bind(store, "gpu0", "h1")
        await store.commit()
        del store.state.bindings["gpu0"]
        await store.commit()
        before = journal.read_bytes()  # gpu0 bound, then unbound
        monkeypatch.setattr(state_module, "JOURNAL_COMPACT_BYTES", 0)
        _bind(store, "gpu1", "h2")
        await store.commit()  # a snapshot: the journal is emptied
        return before

    stale = asyncio.run(run())
    assert store.snapshots == 2 and journal.stat().st_size == 0
    journal.write_bytes(stale)  # as if the crash came before the truncation
    reloaded = _reloaded(tmp_path)
    _same(reloaded, store.state)
    assert set(reloaded.bindings) == {"gpu1"}


def test_a_failed_append_leaves_the_next_write_a_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.write_now()
    real_write = os.write
    fail = {"once": True}

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        if fd == store._journal_fd and fail.pop("once", False):
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_fail)

    async def run() -> None:
        _bind(store, "gpu0", "h1")
        with pytest.raises(OSError, match="No space"):
            await store.commit()
        _bind(store, "gpu1", "h2")
        await store.commit()  # a snapshot, whatever the journal holds now

    asyncio.run(run())
    assert store.snapshots == 2
    reloaded = _reloaded(tmp_path)
    _same(reloaded, store.state)
    assert set(reloaded.bindings) == {"gpu0", "gpu1"}


def test_a_journal_naming_an_unknown_collection_is_a_clear_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.write_now()
    (tmp_path / "fabric-state.journal").write_text('{"version":5,"set":{"widgets":{}},"del":{}}\n')
    with pytest.raises(ValueError, match="names no collection 'widgets'"):
        StateStore(tmp_path).load()


def test_the_bindings_index_by_host_follows_every_change() -> None:
    """``TrackedBindings.on_host`` is what a scan of every binding would find, in the same order,
    through whatever a caller does to the dict."""
    rng = random.Random(7)
    bindings = TrackedBindings(
        {
            f"d{i}": BindingRecord(target=f"d{i}", host=f"h{i % 3}", style=BindingStyle.ZONE, since=utcnow())
            for i in range(10)
        }
    )

    def record(target: str) -> BindingRecord:
        return BindingRecord(
            target=target, host=f"h{rng.randrange(4)}", style=BindingStyle.ZONE, since=utcnow()
        )

    for _ in range(2_000):
        target = f"d{rng.randrange(30)}"
        step = rng.randrange(7)
        if step == 0:
            bindings[target] = record(target)
        elif step == 1 and target in bindings:
            del bindings[target]
        elif step == 2:
            bindings.pop(target, None)
        elif step == 3:
            bindings.setdefault(target, record(target))
        elif step == 4:
            bindings.update({target: record(target)})
        elif step == 5 and bindings and rng.random() < 0.1:
            bindings.popitem()
        elif step == 6 and rng.random() < 0.01:
            bindings.clear()
        for host in ("h0", "h1", "h2", "h3"):
            assert bindings.on_host(host) == [b for b in bindings.values() if b.host == host]


def test_a_journal_line_carries_the_tasks_that_changed_and_only_those(tmp_path: Path) -> None:
    """A task notes its own changes: a line carries a running task whose percent moved, not the
    hundreds that did not (each was serialised again on every line), and what it carries reads
    back. A task cannot be changed in place unnoticed: its messages are a tuple, its result frozen."""
    store = StateStore(tmp_path)
    store.load()
    tasks = [_task(store, str(i), f"gpu{i}") for i in range(300)]
    store.write_now()

    async def changes() -> None:
        tasks[7].percent = 50
        tasks[9].messages = (*tasks[9].messages, {"MessageId": "TaskEvent.1.0.TaskProgressChanged"})
        await store.commit()
        tasks[9].state, tasks[9].end = "Completed", utcnow()
        tasks[9].result = TaskResult(status=200)
        await store.commit()
        await store.commit()  # nothing changed

    asyncio.run(changes())
    lines = [json.loads(line) for line in (tmp_path / "fabric-state.journal").read_text().splitlines()]
    assert [sorted(line["set"].get("tasks", {})) for line in lines] == [["7", "9"], ["9"], []]
    _same(_reloaded(tmp_path), store.state)
    with pytest.raises(AttributeError):
        tasks[1].messages.append({"MessageId": "x"})  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="frozen"):
        tasks[9].result.status = 500  # type: ignore[union-attr,misc]
    copied = tasks[3].model_copy(update={"percent": 10})
    store.state.tasks["3"] = copied
    asyncio.run(store.commit())
    assert _reloaded(tmp_path).tasks["3"].percent == 10, (
        "a copy of a task is serialised, not taken for the old"
    )


def test_finished_tasks_are_pruned_to_the_newest_every_few_ends() -> None:
    """The newest ``MAX_FINISHED_TASKS`` finished tasks stay; a prune scans every task once every
    ``PRUNE_EVERY`` ends, so between two prunes up to that many more are kept; running tasks stay."""
    state = FabricState()
    running = {str(i) for i in range(0, 2_000, 5)}
    for i in range(2_000):
        task = _running_task(str(i), f"gpu{i}")
        state.tasks[task.id] = task
        if task.id not in running:
            task.state, task.end = "Completed", utcnow()
            state.prune_tasks()
            finished = [t.id for t in state.tasks.values() if t.finished]
            assert len(finished) <= MAX_FINISHED_TASKS + PRUNE_EVERY
    assert running <= set(state.tasks)
    state.prune_tasks(now=True)
    finished = [t.id for t in state.tasks.values() if t.finished]
    newest = [str(i) for i in range(2_000) if str(i) not in running][-MAX_FINISHED_TASKS:]
    assert finished == newest
