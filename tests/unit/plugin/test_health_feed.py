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
from tests.support.waiting import eventually
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
    backend = _backend(server, tmp_path)
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


class _CountingBackend(FabricBackend):
    """Counts the reads sent at once (``after`` None): the confirming reads of prepared claims."""

    confirming = 0

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        if after is None:
            self.confirming += 1
        return await super().watch_devices(after, wait_seconds)


def _read_up_to(backend: FabricBackend, version: int) -> bool:
    latest = backend.feed.latest
    return latest is not None and latest.version == version


def _backend(server: InventoryServer, tmp_path: Path) -> _CountingBackend:
    return _CountingBackend(
        ManagerClient(server.url),
        HostScanner(tmp_path, real_host=False),
        node=NODE,
        visible_timeout=1,
        host_removal=False,
    )


async def test_changes_of_other_nodes_devices_are_read_but_not_judged(
    server: InventoryServer, tmp_path: Path
) -> None:
    """Issue 37: every attach or detach anywhere in the fabric answers every node's long poll; a
    node whose devices did not change takes the read in without judging its devices again (no link
    observation, no report), and judges at once when one of its own changes."""
    backend = _backend(server, tmp_path)
    monitor = HealthMonitor(
        backend, _store(tmp_path), node=NODE, resend_seconds=60, poll_timeout=2, min_poll_interval=0
    )
    monitor.start()
    reports = monitor.reports()
    try:
        await _until(reports, health_pb2.HEALTHY)
        judged = monitor.judgements
        for i, health in enumerate((Health.WARNING, Health.CRITICAL, Health.OK) * 2):
            _publish(server, {f"gpu{1 + i}": health})
            await eventually(
                lambda: _read_up_to(backend, server.inventory.version),
                what="the monitor's read of the change",
            )
        assert server.changes_calls >= 2  # the changes were read (one read may carry several) ...
        assert monitor.judgements == judged  # ... and none of them judged
        _publish(server, {"gpu0": Health.CRITICAL})
        await _until(reports, health_pb2.UNHEALTHY)
        assert monitor.judgements == judged + 1
    finally:
        await reports.aclose()
        await monitor.stop()
        await backend.aclose()


def _prepare_gpus(server: InventoryServer, store: CheckpointStore, names: list[str]) -> None:
    """The fabric binds ``names`` here for one claim each, and the claims complete their prepare."""
    server.update_devices(
        lambda devices: [
            d.model_copy(update={"state": BindingState.BOUND, "node": NODE, "claim_uid": f"u-{d.name}"})
            if d.name in names
            else d
            for d in devices
        ]
    )
    for name in names:
        store.put(
            ClaimEntry(
                uid=f"u-{name}",
                state=ClaimState.PREPARE_COMPLETED,
                devices=[PreparedDevice(device=name, pool="fabric-pcie", type="gpu", attached=True)],
            )
        )


async def test_claims_prepared_within_the_confirm_interval_send_no_read_each(
    server: InventoryServer, tmp_path: Path
) -> None:
    """Issue 37: a node preparing claims one after another does not send a read per claim; until
    the interval's read each is HEALTHY on its attach."""
    backend = _backend(server, tmp_path)
    store = _store(tmp_path)
    monitor = HealthMonitor(
        backend, store, node=NODE, resend_seconds=60, poll_timeout=30, min_poll_interval=0,
        confirm_interval=3600,
    )  # fmt: skip
    monitor.start()
    reports = monitor.reports()
    try:
        await _until(reports, health_pb2.HEALTHY)
        await eventually(lambda: server.changes_calls >= 1, what="the long poll after the first read")
        confirming = backend.confirming
        mine = [f"gpu{i}" for i in range(1, 6)]
        for name in mine:
            _prepare_gpus(server, store, [name])
            monitor.notify()  # as the driver does when a prepare completes
            for _ in range(50):  # the monitor's turns: a read per claim would be sent in these
                await asyncio.sleep(0)
        assert backend.confirming == confirming
        assert {d: s for _, d, s in monitor.report()} == dict.fromkeys(["gpu0", *mine], health_pb2.HEALTHY)
    finally:
        await reports.aclose()
        await monitor.stop()
        await backend.aclose()


async def test_claims_prepared_together_share_one_confirming_read(
    server: InventoryServer, tmp_path: Path
) -> None:
    """A busy node prepares claims faster than the confirm interval: they share one read."""
    backend = _backend(server, tmp_path)
    store = _store(tmp_path)
    monitor = HealthMonitor(
        backend, store, node=NODE, resend_seconds=60, poll_timeout=30, confirm_interval=0.2
    )
    monitor.start()
    reports = monitor.reports()
    try:
        await _until(reports, health_pb2.HEALTHY)
        await eventually(lambda: server.changes_calls >= 1, what="the long poll after the first read")
        confirming = backend.confirming
        judged = monitor.judgements
        mine = [f"gpu{i}" for i in range(1, 6)]
        _prepare_gpus(server, store, mine)
        for _ in mine:  # five prepares completing within one interval, as the driver says them
            monitor.notify()
        # the long poll may answer first (the prepares changed the devices) and be judged; the
        # confirming read follows within the interval, and is the only one for the five claims
        await eventually(lambda: backend.confirming > confirming, what="the confirming read")
        await eventually(lambda: monitor.judgements > judged, what="the confirming read judged")
        await asyncio.sleep(3 * monitor.confirm_interval)
        assert backend.confirming == confirming + 1
        assert {d: s for _, d, s in monitor.report()} == dict.fromkeys(["gpu0", *mine], health_pb2.HEALTHY)
    finally:
        await reports.aclose()
        await monitor.stop()
        await backend.aclose()
