"""The engine and its durable state, in process: recovery after a crash, group commits, profiles,
fault specs, event filters and history."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from emulator.redfish.engine.events import EventBus, EventFilter
from emulator.redfish.model.faults import fault_adapter
from emulator.redfish.model.latency import INSTANT, REALISTIC, LatencyProfile, load_latency_profile
from emulator.redfish.model.state import (
    BindingRecord,
    FabricState,
    HostAddress,
    OperationKind,
    StateStore,
    TaskRecord,
    utcnow,
)
from emulator.redfish.service.server import ServeConfig, build_service
from emulator.redfish.tree.auth import Credentials
from emulator.topology import default_topology_path, load_topology
from manager_api.devices import BindingStyle
from manager_api.models import DeviceType


def _config(state_dir: Path, latency: LatencyProfile = INSTANT) -> ServeConfig:
    return ServeConfig(
        index=load_topology(default_topology_path()),
        state_dir=state_dir,
        latency=latency,
        credentials=Credentials(username="admin", password="secret-password"),
    )


def _write_state(state_dir: Path, state: FabricState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "fabric-state.json").write_text(state.model_dump_json())


def test_recovery_interrupts_running_tasks_and_rebuilds_host_views(tmp_path: Path) -> None:
    now = utcnow()
    state = FabricState(next_id=10)
    state.bindings["gpu0"] = BindingRecord(
        target="gpu0",
        host="kind-worker",
        style=BindingStyle.ZONE,
        zone="kind-worker",
        since=now,
        address=HostAddress(bdf="0000:41:00.0", iommu_group=32),
    )
    state.bindings["gpu-gone"] = BindingRecord(
        target="gpu-gone", host="kind-worker", style=BindingStyle.ZONE, since=now
    )
    for task_id, kind, target in (("7", OperationKind.BIND, "gpu1"), ("8", OperationKind.UNBIND, "gpu0")):
        state.tasks[task_id] = TaskRecord(
            id=task_id,
            kind=kind,
            style=BindingStyle.ZONE,
            host="kind-worker",
            targets=[target],
            state="Running",
            start=now,
            method="POST",
            uri="/x",
        )
    _write_state(tmp_path, state)
    # a stale entry a crash left in a host view: recovery replaces the views wholesale
    stale = tmp_path / "hosts" / "kind-worker2" / "sys" / "bus" / "pci" / "devices" / "0000:99:00.0"
    stale.mkdir(parents=True)

    async def run() -> None:
        service = build_service(_config(tmp_path))
        engine = service.engine
        assert set(engine.state.bindings) == {"gpu0"}, "bindings the topology lacks are dropped"
        bind_task, unbind_task = engine.state.tasks["7"], engine.state.tasks["8"]
        assert bind_task.state == unbind_task.state == "Interrupted"
        assert bind_task.result is not None and bind_task.result.status == 503
        assert "gpu1 was not bound to kind-worker" in json.dumps(bind_task.messages)
        assert "gpu0 is still bound to kind-worker" in json.dumps(unbind_task.messages)
        assert engine.bindings.inflight == {}
        assert not stale.exists()
        assert (
            tmp_path / "hosts" / "kind-worker" / "sys" / "bus" / "pci" / "devices" / "0000:41:00.0"
        ).exists()
        on_disk = FabricState.model_validate_json((tmp_path / "fabric-state.json").read_text())
        assert on_disk.tasks["7"].state == "Interrupted", "the recovered state is written before serving"

    asyncio.run(run())


def test_a_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "fabric-state.json").write_text('{"format": 1, "bindings": 3}')
    with pytest.raises(ValueError, match=r"is not valid .* move both away"):
        build_service(_config(tmp_path))


def test_group_commit_shares_writes(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    writes = 0
    original = store._write

    def counting(data: tuple[str, str]) -> None:
        nonlocal writes
        writes += 1
        original(data)

    store._write = counting  # type: ignore[method-assign]
    effects: list[int] = []

    async def run() -> None:
        async def change(i: int) -> None:
            store.state.next_id += 1
            await store.commit([lambda i=i: effects.append(i)])  # type: ignore[misc]

        await asyncio.gather(*(change(i) for i in range(50)))

    asyncio.run(run())
    assert 1 <= writes < 50
    assert sorted(effects) == list(range(50)), "every effect ran once, after its write"
    assert StateStore(tmp_path).load().next_id == 51


def test_a_failed_write_reaches_its_waiters(tmp_path: Path) -> None:
    store = StateStore(tmp_path)

    def broken(data: tuple[str, str]) -> None:
        raise OSError(28, "No space left on device")

    store._write = broken  # type: ignore[method-assign]

    async def run() -> None:
        with pytest.raises(OSError, match="No space"):
            await store.commit()

    asyncio.run(run())


def test_latency_profiles(tmp_path: Path) -> None:
    assert load_latency_profile("instant") is INSTANT
    assert load_latency_profile("realistic").tasks
    rng = random.Random(1)
    gpu = [REALISTIC.operation_seconds(True, [DeviceType.GPU], rng) for _ in range(200)]
    assert 2.0 <= min(gpu) < max(gpu) <= 4.0
    assert REALISTIC.operation_seconds(True, [DeviceType.NVME, DeviceType.GPU], rng) >= 2.0
    custom = tmp_path / "lab.yaml"
    custom.write_text("tasks: true\nbind: {gpu: {seconds: 0.25}}\n")
    profile = load_latency_profile(str(custom))
    assert profile.name == "lab" and profile.operation_seconds(True, [DeviceType.GPU], rng) == 0.25
    custom.write_text("tasks: true\nbind: {gpu: {seconds: -1}}\n")
    with pytest.raises(
        ValueError, match=r"lab.yaml: bind.gpu.seconds: Input should be greater than or equal to 0"
    ):
        load_latency_profile(str(custom))
    with pytest.raises(ValueError, match="neither instant, realistic nor a readable file"):
        load_latency_profile(str(tmp_path / "nope.yaml"))


def test_fault_specs() -> None:
    fault = fault_adapter.validate_python(
        {"Kind": "FailOperations", "Target": "gpu0", "MessageId": "Base.1.22.ResourceInUse"}
    )
    assert fault.MessageId == "ResourceInUse"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="not a Base"):
        fault_adapter.validate_python({"Kind": "FailOperations", "MessageId": "Bogus"})
    with pytest.raises(ValidationError, match="takes arguments"):
        fault_adapter.validate_python({"Kind": "FailOperations", "MessageId": "ResourceNotFound"})
    with pytest.raises(ValidationError):
        fault_adapter.validate_python({"Kind": "SlowResponses", "Seconds": 0})
    with pytest.raises(ValidationError):
        fault_adapter.validate_python({"Kind": "PortDown"})


def test_event_filters() -> None:
    bus = EventBus()
    zone = bus.make(
        "ZoneModified",
        "kind-worker",
        "PCIe",
        prefix="Fabric",
        origin="/redfish/v1/Fabrics/PCIe/Zones/kind-worker",
    )
    task = bus.make("TaskStarted", "3", prefix="TaskEvent", origin="/redfish/v1/TaskService/Tasks/3")
    assert EventFilter.parse("").matches(zone)
    by_prefix = EventFilter.parse("RegistryPrefix eq 'TaskEvent'")
    assert by_prefix.matches(task) and not by_prefix.matches(zone)
    either = EventFilter.parse("ResourceType eq 'Zone' or MessageId eq 'TaskEvent.1.0.TaskStarted'")
    assert either.matches(zone) and either.matches(task)
    assert EventFilter.parse("OriginResource eq '/redfish/v1/TaskService/Tasks/3'").matches(task)
    for bad in ("Color eq 'red'", "RegistryPrefix ne 'Base'", "MessageId eq Base"):
        with pytest.raises(ValueError):
            EventFilter.parse(bad)


def test_event_history_and_replay() -> None:
    async def run() -> None:
        bus = EventBus(last_seq=100)
        events = [
            bus.make("ResourceChanged", prefix="ResourceEvent", origin=f"/redfish/v1/Systems/h{i}")
            for i in range(3)
        ]
        assert [e.seq for e in events] == [101, 102, 103]
        bus.publish(events)
        sub, complete = bus.subscribe(EventFilter(), last_event_id=101)
        assert complete
        assert [sub.queue.get_nowait().seq for _ in range(2)] == [102, 103]  # type: ignore[union-attr]
        _, complete = bus.subscribe(EventFilter(), last_event_id=50)
        assert not complete, "events after 50 were never in this history"
        bus.close()
        assert await sub.queue.get() is None

    asyncio.run(run())
