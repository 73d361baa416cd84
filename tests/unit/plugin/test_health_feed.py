"""Device health follows the manager's change feed: the inventory is read whole once, then only
what changed is asked for, and a ``410 ResyncRequired`` (a restarted manager) costs one full read.
The manager is the stand-in serving the manager's inventory API and change feed over HTTP, and it
counts the requests of each kind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import pytest

from dra_driver.plugin.backend import FabricBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.health import DeviceHealthReport, HealthMonitor
from dra_driver.plugin.hostdev import HostScanner
from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, Health
from tests.unit.plugin.conftest import DRIVER, NODE

#: one device this node's claim holds among many it does not
DEVICES = 40


def _devices(health_of: dict[str, Health]) -> list[Device]:
    mine = make_device("gpu0", state=BindingState.BOUND, node=NODE, claim_uid="u1")
    others = [make_device(f"gpu{i}", health=health_of.get(f"gpu{i}", Health.OK)) for i in range(1, DEVICES)]
    return [mine.model_copy(update={"health": health_of.get("gpu0", Health.OK)}), *others]


def _publish(server: InventoryServer, health_of: dict[str, Health]) -> None:
    """A new version of the stand-in's inventory with the devices' health as ``health_of`` says."""
    server.update_devices(lambda _: _devices(health_of))


@pytest.fixture
def server() -> Iterator[InventoryServer]:
    manager = InventoryServer(make_inventory(_devices({}))).start()
    try:
        yield manager
    finally:
        manager.stop()


def _store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()
    store.put(
        ClaimEntry(
            uid="u1",
            state=ClaimState.PREPARE_COMPLETED,
            devices=[PreparedDevice(device="gpu0", pool="fabric-pcie", type="gpu", attached=True)],
        )
    )
    return store


async def _until(reports: AsyncGenerator[DeviceHealthReport, None], status: int) -> None:
    """Reports until gpu0 is ``status`` (each report comes on a change, or within the resend);
    bounded, so that a monitor that never gets there fails the test."""

    async def reached() -> None:
        while {d: s for _, d, s in await anext(reports)}.get("gpu0") != status:
            pass

    await asyncio.wait_for(reached(), 20)


async def test_health_reads_the_inventory_whole_once_then_follows_its_changes(
    server: InventoryServer, tmp_path: Path
) -> None:
    backend = FabricBackend(
        ManagerClient(server.url),
        HostScanner(tmp_path, real_host=False),
        node=NODE,
        visible_timeout=1,
        host_removal=False,
    )
    monitor = HealthMonitor(
        backend, _store(tmp_path), node=NODE, resend_seconds=1, poll_timeout=2, min_poll_interval=0
    )
    monitor.start()
    reports = monitor.reports()
    try:
        await _until(reports, health_pb2.HEALTHY)
        assert server.inventory_calls == 1
        # devices this node does not hold change, then its own: each change is asked for alone
        for health in (Health.WARNING, Health.CRITICAL, Health.OK):
            _publish(server, {"gpu7": health})
        _publish(server, {"gpu0": Health.CRITICAL})
        await _until(reports, health_pb2.UNHEALTHY)
        assert server.inventory_calls == 1
        assert server.changes_calls >= 1
        # a device that did not change is the very object it was: only the changed are news
        _, first = await backend.watch_devices(None, 0) or (0, {})
        _publish(server, {"gpu0": Health.CRITICAL, "gpu3": Health.WARNING})
        _, second = await backend.watch_devices(None, 0) or (0, {})
        assert second["gpu1"] is first["gpu1"] and second["gpu3"] is not first["gpu3"]
        assert server.inventory_calls == 1

        # the manager restarts (another epoch): its change feed answers 410, read whole once
        server.restart()
        _publish(server, {})
        await _until(reports, health_pb2.HEALTHY)
        assert backend.feed.resyncs == 1
        assert server.inventory_calls == 2
        _publish(server, {"gpu0": Health.CRITICAL})
        await _until(reports, health_pb2.UNHEALTHY)
        assert server.inventory_calls == 2
    finally:
        await reports.aclose()
        await monitor.stop()
        await backend.aclose()
