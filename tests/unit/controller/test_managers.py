"""Several managers in one controller: a pool two managers report is published by the one listed
first only, and a manager unreadable past its grace turns its publisher's devices tainted."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from dra_driver.controller.binding_conditions import ClaimBinder
from dra_driver.controller.devices import PublishPolicy, WithheldReason, to_dra_device
from dra_driver.controller.managers import Fleet, ManagerGate
from dra_driver.controller.metrics import MANAGER_UP, POOL_COLLISIONS
from fabric_dra_testbed.standins import make_device, make_inventory
from manager_api.client import ManagerClient
from manager_api.feed import InventoryFeed
from manager_api.fleet import ManagerEndpoint
from manager_api.models import DeviceType, Inventory

DRIVER = "fabric-dra.io"
PLAIN = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)


def test_a_down_fabric_taints_every_device_or_withholds_it_without_taints() -> None:
    down = dataclasses.replace(PLAIN, fabric_unavailable=True)
    device = to_dra_device(make_device("g"), down).device
    assert device is not None
    assert device["taints"] == [
        {"key": f"{DRIVER}/fabric-unavailable", "value": "true", "effect": "NoSchedule"}
    ]
    withheld = to_dra_device(make_device("g"), dataclasses.replace(down, device_taints=False))
    assert withheld.device is None and withheld.withheld is WithheldReason.FABRIC_UNAVAILABLE
    assert "taints" not in (to_dra_device(make_device("g"), PLAIN).device or {})


def _feed() -> InventoryFeed:
    # never run: the test puts the inventories a manager would answer
    return InventoryFeed(cast(ManagerClient, None))


def _gpus(pool: str, *names: str, version: int = 1) -> Inventory:
    return make_inventory([make_device(n, pool=pool) for n in names], version=version)


def _cxl(version: int = 1) -> Inventory:
    devices = [
        make_device("chunk0", pool="fabric-cxl", fabric="CXL", type=DeviceType.CXL_MEMORY, switch=None),
        make_device("mem0", pool="appliance-cxl", fabric="CXL", type=DeviceType.CXL_MEMORY, switch=None),
    ]
    return make_inventory(devices, version=version)


@contextlib.asynccontextmanager
async def _gates(grace: float = 60.0) -> AsyncIterator[tuple[Fleet, ManagerGate, ManagerGate]]:
    endpoints = [ManagerEndpoint("pcie", "http://pcie"), ManagerEndpoint("cxl", "http://cxl")]
    fleet = Fleet(endpoints)
    first, second = (ManagerGate(e, _feed(), fleet, down_grace=grace, check_every=0.01) for e in endpoints)
    tasks = [asyncio.create_task(first.run()), asyncio.create_task(second.run())]
    try:
        yield fleet, first, second
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _pools(gate: ManagerGate) -> set[str]:
    assert gate.latest is not None
    return {p.pool for p in gate.latest.pools} | {d.pool for d in gate.latest.devices}


async def test_a_pool_two_managers_report_is_published_by_the_one_listed_first() -> None:
    async with _gates() as (fleet, pcie, cxl):
        refreshed: list[str] = []
        cxl.on_refiltered = lambda: refreshed.append("cxl")
        await cxl.feed.put(_cxl())
        await _settle()
        assert _pools(cxl) == {"fabric-cxl", "appliance-cxl"}
        # the first-listed manager reports fabric-cxl too: the later one's is refused, at once
        # (the same inventory version filtered anew), and counted
        colliding = [
            make_device("gpu0"),
            make_device("chunk9", pool="fabric-cxl", type=DeviceType.CXL_MEMORY),
        ]
        await pcie.feed.put(make_inventory(colliding))
        await _settle()
        assert "fabric-cxl" in _pools(pcie)
        assert _pools(cxl) == {"appliance-cxl"} and refreshed == ["cxl"]
        assert POOL_COLLISIONS.labels(pool="fabric-cxl", refused="cxl")._value.get() == 1
        assert fleet.owners.owner("fabric-cxl") == "pcie"
        # the first one stops reporting it: the later one's pool is published again
        await pcie.feed.put(_gpus("fabric-pcie", "gpu0", version=2))
        await _settle()
        assert _pools(cxl) == {"fabric-cxl", "appliance-cxl"}
        assert POOL_COLLISIONS.labels(pool="fabric-cxl", refused="cxl")._value.get() == 0


async def test_a_manager_unreadable_past_its_grace_is_down_and_the_other_is_not() -> None:
    async with _gates(grace=0.2) as (_, pcie, cxl):
        turns: list[tuple[str, bool]] = []
        turned = asyncio.Event()

        def note(name: str, up: bool) -> None:
            turns.append((name, up))
            turned.set()

        pcie.on_availability = lambda up: note("pcie", up)
        cxl.on_availability = lambda up: note("cxl", up)
        for gate, inventory in ((pcie, _gpus("fabric-pcie", "gpu0")), (cxl, _cxl())):
            gate.feed.last_success = time.monotonic()
            await gate.feed.put(inventory)
        cxl.feed.last_error = "connection refused"
        await asyncio.wait_for(turned.wait(), 30)  # the gate's own check turns it, after its grace
        assert turns == [("cxl", False)] and pcie.up and not cxl.up
        assert MANAGER_UP.labels(manager="cxl")._value.get() == 0
        assert MANAGER_UP.labels(manager="pcie")._value.get() == 1
        turned.clear()
        cxl.feed.last_error, cxl.feed.last_success = None, time.monotonic()
        await asyncio.wait_for(turned.wait(), 30)
        assert turns == [("cxl", False), ("cxl", True)]
        assert MANAGER_UP.labels(manager="cxl")._value.get() == 1


async def test_each_managers_binder_attaches_only_its_own_pools_devices() -> None:
    """With binding conditions, a claim holding a device of each fabric: each manager's binder (fed
    by its gate) takes only its own pool's device, so each attach reaches its own manager."""
    conditions = {
        "bindingConditions": [f"{DRIVER}/Attached"],
        "bindingFailureConditions": [f"{DRIVER}/AttachFailed"],
    }
    claim = {
        "metadata": {"name": "c", "namespace": "default", "uid": "u-1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "fabric-pcie",
                            "device": "gpu0",
                            **conditions,
                        },
                        {
                            "request": "mem",
                            "driver": DRIVER,
                            "pool": "appliance-cxl",
                            "device": "mem0",
                            **conditions,
                        },
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                    ]
                },
            }
        },
    }
    async with _gates() as (_, pcie, cxl):
        await pcie.feed.put(_gpus("fabric-pcie", "gpu0"))
        await cxl.feed.put(_cxl())
        await _settle()
        binders = {
            gate.name: ClaimBinder(cast(Any, None), cast(Any, None), gate, driver=DRIVER)
            for gate in (pcie, cxl)
        }
        assert [t.device for t in binders["pcie"].targets(claim)] == ["gpu0"]
        assert [t.device for t in binders["cxl"].targets(claim)] == ["mem0"]
