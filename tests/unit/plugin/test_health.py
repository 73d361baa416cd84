"""Device health as the kubelet gets it: from the fabric's Status.Health, bindings and the host."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.health import HealthMonitor
from dra_driver.plugin.hostdev import HostDevice, HostScanner
from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from manager_api.models import (
    BindingState,
    Device,
    DeviceType,
    Health,
    MemoryPool,
    MemoryShare,
    PartitionHolder,
)
from tests.unit.plugin.conftest import DRIVER, NODE, ScriptedBackend, fabric_device


class InventoryBackend(ScriptedBackend):
    """Answers the inventory long poll from a queue of snapshots."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots: asyncio.Queue[dict[str, Device] | Exception] = asyncio.Queue()
        self.version = 0

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        item = await self.snapshots.get()
        if isinstance(item, Exception):
            raise item
        self.version += 1
        return self.version, item


def prepared(store: CheckpointStore, uid: str, device: str, sysfs: Path) -> None:
    store.put(
        ClaimEntry(
            uid=uid,
            state=ClaimState.PREPARE_COMPLETED,
            devices=[
                PreparedDevice(
                    device=device,
                    pool="fabric-pcie",
                    type="gpu",
                    attached=True,
                    host=HostDevice(sysfs_path=str(sysfs)),
                )
            ],
        )
    )


async def test_health_follows_the_fabric_and_the_host(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()
    for name in ("gpu-ok", "gpu-warn", "gpu-critical", "gpu-stolen", "gpu-missing", "gpu-unplugged"):
        (tmp_path / name).mkdir()
    prepared(store, "u1", "gpu-ok", tmp_path / "gpu-ok")
    prepared(store, "u2", "gpu-warn", tmp_path / "gpu-warn")
    prepared(store, "u3", "gpu-critical", tmp_path / "gpu-critical")
    prepared(store, "u4", "gpu-stolen", tmp_path / "gpu-stolen")
    prepared(store, "u5", "gpu-missing", tmp_path / "gpu-missing")
    prepared(store, "u6", "gpu-unplugged", tmp_path / "gpu-unplugged")
    (tmp_path / "gpu-unplugged").rmdir()  # gone from the host's sysfs

    backend = InventoryBackend()
    monitor = HealthMonitor(
        backend, store, node=NODE, scanner=HostScanner(tmp_path, real_host=False), resend_seconds=60
    )
    assert {d: s for _, d, s in monitor.report()}["gpu-ok"] == health_pb2.UNKNOWN  # no fabric view yet

    bound = {"state": BindingState.BOUND, "node": NODE}
    await backend.snapshots.put(
        {
            "gpu-ok": fabric_device("gpu-ok", claim_uid="u1", **bound),
            "gpu-warn": fabric_device("gpu-warn", claim_uid="u2", health=Health.WARNING, **bound),
            "gpu-critical": fabric_device("gpu-critical", claim_uid="u3", health=Health.CRITICAL, **bound),
            "gpu-stolen": fabric_device(
                "gpu-stolen", claim_uid="u4", state=BindingState.BOUND, node="node-b"
            ),
            "gpu-unplugged": fabric_device("gpu-unplugged", claim_uid="u6", **bound),
        }
    )
    monitor.start()
    reports = monitor.reports()
    try:
        report = await asyncio.wait_for(anext(reports), 5)
        while {d: s for _, d, s in report}["gpu-ok"] == health_pb2.UNKNOWN:
            report = await asyncio.wait_for(anext(reports), 5)
        assert {d: s for _, d, s in report} == {
            "gpu-ok": health_pb2.HEALTHY,
            "gpu-warn": health_pb2.HEALTHY,
            "gpu-critical": health_pb2.UNHEALTHY,
            "gpu-stolen": health_pb2.UNHEALTHY,
            "gpu-missing": health_pb2.UNHEALTHY,
            "gpu-unplugged": health_pb2.UNHEALTHY,
        }
        # the manager goes away: nothing can be said any more
        await backend.snapshots.put(ConnectionError("manager down"))
        report = await asyncio.wait_for(anext(reports), 5)
        assert {d: s for _, d, s in report}["gpu-ok"] == health_pb2.UNKNOWN
    finally:
        await reports.aclose()
        await monitor.stop()


class CountingBackend(ScriptedBackend):
    """Answers every long poll at once, with a new version when ``moving``."""

    def __init__(self, moving: bool) -> None:
        super().__init__()
        self.moving = moving
        self.calls = 0
        self.second_call = asyncio.Event()

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        self.calls += 1
        if self.calls >= 2:
            self.second_call.set()
        await asyncio.sleep(0)
        return (self.calls if self.moving else 1), {}


async def test_inventory_is_read_at_most_once_per_interval_while_it_moves(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()
    moving = CountingBackend(moving=True)
    monitor = HealthMonitor(moving, store, node=NODE, min_poll_interval=3600)
    monitor.start()
    try:
        await asyncio.wait_for(moving.second_call.wait(), 5)  # the first read never waits
        for _ in range(20):
            await asyncio.sleep(0)
        assert moving.calls == 2  # the version moved: the next read waits for the interval
    finally:
        await monitor.stop()

    steady = CountingBackend(moving=False)
    monitor = HealthMonitor(steady, store, node=NODE, min_poll_interval=3600)
    monitor.start()
    try:
        # an unchanged version (the long poll timed out): the next long poll follows at once
        await asyncio.wait_for(steady.second_call.wait(), 5)
        for _ in range(20):
            await asyncio.sleep(0)
        assert steady.calls > 2
    finally:
        await monitor.stop()


class RecordingBackend(InventoryBackend):
    """Also records the ``after`` of every read as it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[int | None] = []
        self.asked = asyncio.Event()

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        self.sent.append(after)
        self.asked.set()
        return await super().watch_devices(after, wait_seconds)


async def _next_read(backend: RecordingBackend, count: int) -> None:
    while len(backend.sent) < count:
        backend.asked.clear()
        await asyncio.wait_for(backend.asked.wait(), 5)


async def test_an_inventory_read_before_the_prepare_is_no_evidence_of_its_binding(tmp_path: Path) -> None:
    """Issue 15, item 12: a claim prepared after the inventory read was sent is not reported
    UNHEALTHY because that read does not show its device bound here (it may predate the attach);
    the long poll then waiting is sent again at once, and what that read says counts in full.
    A Critical device is unhealthy on either read."""
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()
    (tmp_path / "gpu-new").mkdir()
    (tmp_path / "gpu-sick").mkdir()
    backend = RecordingBackend()
    monitor = HealthMonitor(
        backend, store, node=NODE, scanner=HostScanner(tmp_path, real_host=False), resend_seconds=60
    )
    free = {"state": BindingState.FREE}
    await backend.snapshots.put(
        {
            "gpu-new": fabric_device("gpu-new", **free),
            "gpu-sick": fabric_device("gpu-sick", health=Health.CRITICAL, **free),
        }
    )
    monitor.start()
    try:
        await _next_read(backend, 2)  # the first read answered; the long poll after it waits
        assert backend.sent == [None, 1]
        prepared(store, "u1", "gpu-new", tmp_path / "gpu-new")
        prepared(store, "u2", "gpu-sick", tmp_path / "gpu-sick")
        monitor.notify()  # as the driver does when a prepare completes
        assert {d: s for _, d, s in monitor.report()} == {
            "gpu-new": health_pb2.HEALTHY,  # not "free, so not ours": that read predates the attach
            "gpu-sick": health_pb2.UNHEALTHY,  # Critical is evidence, however old the read
        }
        # the waiting long poll is cut short and a read sent at once, not after the version moves
        await _next_read(backend, 3)
        assert backend.sent == [None, 1, None]
        assert {d: s for _, d, s in monitor.report()}["gpu-new"] == health_pb2.HEALTHY  # not UNKNOWN
        await backend.snapshots.put(
            {"gpu-new": fabric_device("gpu-new", state=BindingState.BOUND, node="node-b")}
        )
        await _next_read(backend, 4)  # that read was taken in
        assert {d: s for _, d, s in monitor.report()}["gpu-new"] == health_pb2.UNHEALTHY
    finally:
        await monitor.stop()


async def test_a_partition_is_as_healthy_as_its_gpu_held_here_and_a_share_as_its_pool(tmp_path: Path) -> None:
    """A partition's fabric device is its GPU (held for the claim's partition on this node); a
    share's is its pool (the share connected here for the claim)."""
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()
    (tmp_path / "gpu0").mkdir()
    (tmp_path / "region0").mkdir()
    share_a, share_b = "3f0e6b9c-6f21-4d3b-8a51-0c8d1e2f3a4b", "9a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d"
    for uid, name in (("u1", "gpu0-1g10gb-0"), ("u2", "gpu0-1g10gb-1")):
        device = PreparedDevice(
            device=name, pool="fabric-pcie", type="gpu-partition", parent="gpu0", attached=True,
            host=HostDevice(sysfs_path=str(tmp_path / "gpu0")),
        )  # fmt: skip
        store.put(ClaimEntry(uid=uid, state=ClaimState.PREPARE_COMPLETED, devices=[device]))
    for uid, share in (("u3", share_a), ("u4", share_b)):
        device = PreparedDevice(
            device="cxlpool0", pool="fabric-cxl", type="cxl-memory", share_id=share, attached=True,
            host=HostDevice(sysfs_path=str(tmp_path / "region0")),
        )  # fmt: skip
        store.put(ClaimEntry(uid=uid, state=ClaimState.PREPARE_COMPLETED, devices=[device]))
    gpu = fabric_device(
        "gpu0",
        state=BindingState.BOUND,
        node=NODE,
        partitions=[PartitionHolder(partition="gpu0-1g10gb-0", claim_uid="u1", node=NODE)],
    )
    pool = fabric_device(
        "cxlpool0",
        type=DeviceType.CXL_MEMORY,
        memory_pool=MemoryPool(
            size_bytes=64 << 30,
            min_chunk_bytes=1 << 30,
            increment_bytes=1 << 30,
            shares=[
                MemoryShare(share_id=share_a, claim_uid="u3", node=NODE, memory_bytes=1 << 30),
                MemoryShare(share_id=share_b, claim_uid="u4", node="node-b", memory_bytes=1 << 30),
            ],
        ),
    )
    backend = InventoryBackend()
    monitor = HealthMonitor(backend, store, node=NODE, scanner=HostScanner(tmp_path, real_host=False))
    await backend.snapshots.put({"gpu0": gpu, "cxlpool0": pool})
    monitor.start()
    reports = monitor.reports()
    try:
        report = await asyncio.wait_for(anext(reports), 5)
        while report[0][2] == health_pb2.UNKNOWN:
            report = await asyncio.wait_for(anext(reports), 5)
        assert report == [
            ("fabric-pcie", "gpu0-1g10gb-0", health_pb2.HEALTHY),
            ("fabric-pcie", "gpu0-1g10gb-1", health_pb2.UNHEALTHY),  # the GPU holds no such partition for it
            ("fabric-cxl", "cxlpool0", health_pb2.HEALTHY),
            ("fabric-cxl", "cxlpool0", health_pb2.UNHEALTHY),  # its share is connected elsewhere
        ]
    finally:
        await reports.aclose()
        await monitor.stop()
