"""A device's PCIe link trains down in the fabric, with real processes: emulator (instant, told
through its fault API to degrade a GPU's link) → fabric manager (reads ``PCIeInterface`` on the
event) → plugin → the kubelet's health stream and the claim's ``status.devices``.

Degraded past the hold → UNHEALTHY and ``LinkHealthy: False`` naming both links; back to what it
negotiated for the recovery time → HEALTHY and ``LinkHealthy: True``; a degradation shorter than
the hold moves nothing. The same for the link's PCIe error counters (the emulator's
``PCIeErrors`` fault, read by the manager from the switch port's ``PortMetrics``): a fatal error
is UNHEALTHY at once with ``LinkHealthy: False`` (reason ``PCIeErrors``) and HEALTHY again after
the recovery time once the counters stop; one correctable error moves nothing, a burst above the
rate does. (The hold and recovery are shortened to 2 and 3 s here, and 60 correctable errors a
minute allowed, i.e. 2 in a hold; the defaults are 30 s, 120 s and 10 a minute.)
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from fabric_dra_testbed.stack import Emulator
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType, FabricNode
from plumbing.kube.resources import RESOURCE_CLAIMS
from tests.support.plugin import ClaimRef, FabricProcesses, PluginStack, short_dir, start_fabric

HOLD, RECOVER, CORRECTABLE_PER_MINUTE = 2, 3, 60


@dataclass
class Fabric:
    processes: FabricProcesses
    node: FabricNode
    stack: PluginStack


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    root = short_dir("fdl-")
    processes = start_fabric(root)
    try:

        async def nodes() -> list[FabricNode]:
            async with ManagerClient(processes.manager.address) as client:
                return await client.nodes()

        node = next(n for n in asyncio.run(nodes()) if n.pools)
        (root / "k").mkdir()
        stack = PluginStack(
            root / "k",
            node=node.name,
            backend="fabric",
            manager_url=processes.manager.address,
            sysfs_root=processes.sysfs_root(node.host),
            extra_args=[
                *("--link-hold-seconds", str(HOLD), "--link-recover-seconds", str(RECOVER)),
                *("--link-correctable-per-minute", str(CORRECTABLE_PER_MINUTE)),
            ],
        )
        with stack:
            yield Fabric(processes, node, stack)
    finally:
        processes.stop()
        shutil.rmtree(root, ignore_errors=True)


class Health:
    """The kubelet's side of the health stream: the latest status of each device."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}
        self.opened = asyncio.Event()

    async def follow(self, socket: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_pb2.NodeWatchResourcesRequest()
            )
            async for message in stream:
                self.opened.set()
                for d in message.devices:
                    self.latest[d.device.device_name] = health_pb2.HealthStatus.Name(d.health)


async def _until(check: Any, what: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"never: {what}")
        await asyncio.sleep(0.1)


async def _link_condition(stack: PluginStack, ref: ClaimRef) -> dict[str, Any] | None:
    async with stack.kube() as kube:
        claim = await kube.get(RESOURCE_CLAIMS, ref.name, ref.namespace)
    for entry in claim.get("status", {}).get("devices") or []:
        for condition in entry.get("conditions") or []:
            if condition["type"] == "LinkHealthy":
                return dict(condition)
    return None


async def _link_recovered(stack: PluginStack, ref: ClaimRef) -> dict[str, Any] | None:
    """The claim's LinkHealthy condition once it is True again."""
    found = await _link_condition(stack, ref)
    return found if found is not None and found["status"] == "True" else None


async def _gpu(fabric: Fabric) -> Device:
    async with ManagerClient(fabric.processes.manager.address) as client:
        return next(
            d
            for d in await client.devices()
            if d.type is DeviceType.GPU and d.state is BindingState.FREE and d.pool in fabric.node.pools
        )


@contextlib.asynccontextmanager
async def _watched_claim(
    fabric: Fabric, name: str, gpu: Device | None = None
) -> AsyncIterator[tuple[Device, ClaimRef, Health, Emulator]]:
    """A claim of a GPU prepared while the kubelet's side follows the health stream; afterwards
    the emulator's faults are reset and the stream is left."""
    gpu = gpu or await _gpu(fabric)
    ref = await fabric.stack.create_claim(name, [("gpu", gpu.name)], pool=gpu.pool)
    health = Health()
    watcher = asyncio.create_task(health.follow(fabric.stack.dra_socket))
    emulator = fabric.processes.emulator_handle
    try:
        await asyncio.wait_for(health.opened.wait(), 30)
        assert (await fabric.stack.prepare([ref])).claims[ref.uid].error == ""
        yield gpu, ref, health, emulator
    finally:
        await asyncio.to_thread(emulator.reset_faults)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def test_a_link_that_stays_down_makes_the_device_unhealthy_until_it_recovers(fabric: Fabric) -> None:
    async def scenario() -> None:
        gpu = await _gpu(fabric)
        assert gpu.pcie_width and gpu.pcie_width > 4
        async with _watched_claim(fabric, "link-gpu", gpu) as (_, ref, health, emulator):

            async def healthy() -> bool:
                return health.latest.get(gpu.name) == "HEALTHY"

            await _until(healthy, "the prepared GPU reported HEALTHY")
            fault = await asyncio.to_thread(
                emulator.inject,
                {"Kind": "LinkDegraded", "Device": gpu.name, "LanesInUse": gpu.pcie_width // 2},
            )
            degraded_at = time.monotonic()

            async def unhealthy() -> bool:
                return health.latest.get(gpu.name) == "UNHEALTHY"

            await _until(unhealthy, "the GPU with a degraded link reported UNHEALTHY")
            assert time.monotonic() - degraded_at >= HOLD, "not before the hold ran out"
            condition = await _until(lambda: _link_condition(fabric.stack, ref), "LinkHealthy in the claim")
            assert (condition["status"], condition["reason"]) == ("False", "LinkDegraded")
            half = f"Gen{gpu.pcie_generation} x{gpu.pcie_width // 2}"
            assert (
                f"runs at {half}, below the Gen{gpu.pcie_generation} x{gpu.pcie_width}"
                in condition["message"]
            )

            await asyncio.to_thread(emulator.reset_faults)
            assert fault is not None
            await _until(healthy, "HEALTHY again once the link is back", within=RECOVER + 30)

            await _until(lambda: _link_recovered(fabric.stack, ref), "LinkHealthy True again")
            assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""

    asyncio.run(scenario())


def test_a_link_down_for_less_than_the_hold_moves_nothing(fabric: Fabric) -> None:
    async def scenario() -> None:
        seen: set[str] = set()
        async with _watched_claim(fabric, "link-blip") as (gpu, ref, health, emulator):
            await asyncio.to_thread(
                emulator.inject, {"Kind": "LinkDegraded", "Device": gpu.name, "LanesInUse": 1}
            )
            started = time.monotonic()
            widths: set[int | None] = set()
            async with ManagerClient(fabric.processes.manager.address) as client:
                while time.monotonic() - started < HOLD / 2:
                    seen.add(health.latest.get(gpu.name, ""))
                    widths.add((await client.device(gpu.name)).pcie_width)
                    await asyncio.sleep(0.05)
            await asyncio.to_thread(emulator.reset_faults)
            assert 1 in widths, "the manager saw the link go down: the plugin had a reading to judge"
            while time.monotonic() - started < HOLD + 6:  # past the hold, and the judge's next pass
                seen.add(health.latest.get(gpu.name, ""))
                await asyncio.sleep(0.05)
            assert "UNHEALTHY" not in seen
            assert await _link_condition(fabric.stack, ref) is None
            assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""

    asyncio.run(scenario())


async def _manager_counts(fabric: Fabric, device: str, **counts: int) -> None:
    """Until the manager's inventory shows the device's port with these error counts."""

    async def read() -> bool:
        async with ManagerClient(fabric.processes.manager.address) as client:
            errors = (await client.device(device)).pcie_errors
        return errors is not None and all(getattr(errors, k) == v for k, v in counts.items())

    await _until(read, f"the manager reads {device}'s port error counters {counts}")


def test_a_fatal_error_makes_the_device_unhealthy_at_once_until_the_errors_stop(fabric: Fabric) -> None:
    async def scenario() -> None:
        async with _watched_claim(fabric, "errors-fatal") as (gpu, ref, health, emulator):

            async def healthy() -> bool:
                return health.latest.get(gpu.name) == "HEALTHY"

            async def unhealthy() -> bool:
                return health.latest.get(gpu.name) == "UNHEALTHY"

            await _until(healthy, "the prepared GPU reported HEALTHY")
            await asyncio.to_thread(
                emulator.inject,
                {"Kind": "PCIeErrors", "Device": gpu.name, "FatalErrorCount": 1, "CorrectableErrorCount": 1},
            )
            await _manager_counts(fabric, gpu.name, fatal=1, correctable=1)
            await _until(unhealthy, "the GPU with a fatal link error reported UNHEALTHY")
            condition = await _until(lambda: _link_condition(fabric.stack, ref), "LinkHealthy in the claim")
            assert (condition["status"], condition["reason"]) == ("False", "PCIeErrors")
            assert "1 new uncorrectable" in condition["message"] and "fatal 1" in condition["message"]

            await asyncio.to_thread(emulator.reset_faults)  # the counters are cleared: no more errors
            stopped = time.monotonic()
            await _until(healthy, "HEALTHY again once the errors stop", within=RECOVER + 30)
            assert time.monotonic() - stopped >= RECOVER - 1, "not before the recovery time"

            recovered = await _until(lambda: _link_recovered(fabric.stack, ref), "LinkHealthy True again")
            assert recovered["reason"] == "LinkRecovered", recovered
            assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""

    asyncio.run(scenario())


def test_one_correctable_error_moves_nothing_a_burst_above_the_rate_does(fabric: Fabric) -> None:
    async def scenario() -> None:
        seen: set[str] = set()
        async with _watched_claim(fabric, "errors-correctable") as (gpu, ref, health, emulator):
            await asyncio.to_thread(
                emulator.inject, {"Kind": "PCIeErrors", "Device": gpu.name, "CorrectableErrorCount": 1}
            )
            started = time.monotonic()
            await _manager_counts(fabric, gpu.name, correctable=1)
            while time.monotonic() - started < HOLD + 6:  # past the hold, and the judge's next pass
                seen.add(health.latest.get(gpu.name, ""))
                await asyncio.sleep(0.05)
            assert "UNHEALTHY" not in seen and "HEALTHY" in seen
            assert await _link_condition(fabric.stack, ref) is None

            await asyncio.to_thread(
                emulator.inject, {"Kind": "PCIeErrors", "Device": gpu.name, "CorrectableErrorCount": 4}
            )

            async def unhealthy() -> bool:
                return health.latest.get(gpu.name) == "UNHEALTHY"

            await _until(unhealthy, "4 correctable errors at once (2 allowed in a hold): UNHEALTHY")
            condition = await _until(lambda: _link_condition(fabric.stack, ref), "LinkHealthy in the claim")
            assert (condition["status"], condition["reason"]) == ("False", "PCIeErrors")
            assert "4 correctable errors in the last 2 s" in condition["message"]
            assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""

    asyncio.run(scenario())
