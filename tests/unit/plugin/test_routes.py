"""A plugin given several managers: each pool's attach goes to the manager that reports it (the one
listed first when two do), and a manager that is down blinds only its own pools. The managers are
stand-ins serving the manager's inventory API over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.plugin.backend import FabricBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.hostdev import HostScanner
from dra_driver.plugin.report import prepared_claims
from dra_driver.plugin.routes import RoutedBackend
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from manager_api.client import ManagerClient
from manager_api.errors import FabricUnavailable
from manager_api.fleet import ManagerEndpoint
from manager_api.models import Device, DeviceType, Health


def _cxl(name: str, pool: str) -> Device:
    return make_device(name, pool=pool, fabric="CXL", type=DeviceType.CXL_MEMORY, switch=None)


@pytest.fixture
def servers() -> Iterator[tuple[InventoryServer, InventoryServer]]:
    first = InventoryServer(make_inventory([make_device("gpu0"), _cxl("chunk9", "fabric-cxl")])).start()
    second = InventoryServer(
        make_inventory([_cxl("chunk0", "fabric-cxl"), _cxl("mem0", "appliance-cxl")])
    ).start()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


def _routed(tmp_path: Path, *servers: InventoryServer) -> RoutedBackend:
    scanner = HostScanner(tmp_path, real_host=False)
    return RoutedBackend(
        [
            (
                ManagerEndpoint(name, server.url),
                FabricBackend(
                    ManagerClient(server.url), scanner, node="node-a", visible_timeout=1, host_removal=False
                ),
            )
            for name, server in zip(("pcie", "cxl"), servers, strict=True)
        ],
        node="node-a",
    )


async def test_each_pool_goes_to_the_manager_that_reports_it(
    servers: tuple[InventoryServer, InventoryServer], tmp_path: Path
) -> None:
    routed = _routed(tmp_path, *servers)
    try:
        # nothing read yet: the first lookup asks every manager
        assert await routed.route("appliance-cxl", "mem0") is routed.backend_of("cxl")
        assert await routed.route("fabric-pcie", "gpu0") is routed.backend_of("pcie")
        # both report fabric-cxl: the manager listed first serves it, as the controller publishes it
        assert await routed.route("fabric-cxl", "chunk9") is routed.backend_of("pcie")
        with pytest.raises(FabricUnavailable, match="no fabric manager reports pool nowhere"):
            await routed.route("nowhere", "x")
        _, devices = await routed.watch_devices(None, 1.0) or (0, {})
        # chunk0: in a pool its manager does not keep; each also by pool, as names may repeat
        assert set(devices) == {
            "gpu0",
            "chunk9",
            "mem0",
            "fabric-pcie/gpu0",
            "fabric-cxl/chunk9",
            "appliance-cxl/mem0",
        }
        assert routed.blind_pools() == frozenset()
    finally:
        await routed.aclose()


async def test_a_manager_down_blinds_only_its_own_pools(
    servers: tuple[InventoryServer, InventoryServer], tmp_path: Path
) -> None:
    first, second = servers
    routed = _routed(tmp_path, first, second)
    try:
        await routed.watch_devices(None, 1.0)
        second.stop()
        _, devices = await routed.watch_devices(None, 1.0) or (0, {})
        assert set(devices) == {"gpu0", "chunk9", "fabric-pcie/gpu0", "fabric-cxl/chunk9"}
        assert routed.blind_pools() == {"appliance-cxl"}
        # still routed: the attach itself answers that the manager cannot be reached
        assert await routed.route("appliance-cxl", "mem0") is routed.backend_of("cxl")
        assert await routed.route("fabric-pcie", "gpu0") is routed.backend_of("pcie")
        with pytest.raises(FabricUnavailable):
            await routed.bindings()  # a partial answer would read as "not bound" for the missing pools
    finally:
        await routed.aclose()


def test_each_manager_is_told_of_its_own_pools_devices(tmp_path: Path) -> None:
    """The prepared-claims report with several managers: each gets only its own pools' devices, and
    a claim with none of them is not in its report at all."""
    store = CheckpointStore(tmp_path / "checkpoint.json", driver="fabric-dra.io", node="node-a")
    store.load()

    def prepared(device: str, pool: str) -> PreparedDevice:
        return PreparedDevice(device=device, pool=pool, type="gpu", request_names=["r"], attached=True)

    for uid, devices in (
        ("both", [prepared("gpu0", "fabric-pcie"), prepared("mem0", "appliance-cxl")]),
        ("gpus", [prepared("gpu1", "fabric-pcie")]),
    ):
        store.put(
            ClaimEntry(uid=uid, namespace="ns", name=uid, state=ClaimState.PREPARE_COMPLETED, devices=devices)
        )
    memory_pools = {"appliance-cxl"}
    assert prepared_claims(store, lambda pool: pool in memory_pools) == {"both": ["mem0"]}
    assert prepared_claims(store, lambda pool: pool not in memory_pools) == {
        "both": ["gpu0"],
        "gpus": ["gpu1"],
    }
    assert prepared_claims(store) == {"both": ["gpu0", "mem0"], "gpus": ["gpu1"]}


async def test_two_services_may_both_have_a_gpu0(tmp_path: Path) -> None:
    """Device names repeat across services; the merged view keeps each by its pool too, so a
    prepared device's health is judged by its own manager's word."""
    with (
        InventoryServer(make_inventory([make_device("gpu0", pool="fabric-pcie", health=Health.OK)])) as first,
        InventoryServer(
            make_inventory([make_device("gpu0", pool="other-pcie", health=Health.CRITICAL)])
        ) as second,
    ):
        routed = _routed(tmp_path, first, second)
        try:
            _, devices = await routed.watch_devices(None, 1.0) or (0, {})
            assert devices["fabric-pcie/gpu0"].health is Health.OK
            assert devices["other-pcie/gpu0"].health is Health.CRITICAL
            assert devices["gpu0"].pool == "fabric-pcie"  # by name alone: the first manager's
        finally:
            await routed.aclose()
