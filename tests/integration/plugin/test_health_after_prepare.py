"""The health stream around a prepare, with real processes (emulator → fabric manager → plugin).

A freshly attached, healthy device must never be reported UNHEALTHY: the plugin reports a device
unhealthy only on evidence from the fabric, and an inventory it read before the attach is no
evidence that the device is not bound to this node (issue 15, item 12: it was reported UNHEALTHY,
then HEALTHY 40 to 400 ms later, in 3 of 8 prepares). The stream is watched through eight prepares
of a GPU, each followed until the device is reported HEALTHY.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from manager_api.client import ManagerClient
from manager_api.models import BindingState, DeviceType, FabricNode
from tests.support.plugin import FabricProcesses, PluginStack, short_dir, start_fabric

pytestmark = pytest.mark.slow

PREPARES = 8


@dataclass
class Fabric:
    processes: FabricProcesses
    node: FabricNode
    stack: PluginStack


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    root = short_dir("fdh-")
    processes = start_fabric(root)
    try:

        async def nodes() -> list[FabricNode]:
            async with ManagerClient(processes.manager.address) as client:
                return [n for n in await client.nodes() if n.pools]

        node = asyncio.run(nodes())[0]
        (root / "k").mkdir()
        with PluginStack(
            root / "k",
            node=node.name,
            backend="fabric",
            manager_url=processes.manager.address,
            sysfs_root=processes.sysfs_root(node.host),
        ) as stack:
            yield Fabric(processes, node, stack)
    finally:
        processes.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Seen:
    at: float
    device: str
    health: str  # HEALTHY, UNHEALTHY, UNKNOWN


async def _watch(socket: Path, seen: list[Seen], opened: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        async for message in stream:
            opened.set()
            now = time.monotonic()
            seen.extend(
                Seen(now, d.device.device_name, health_pb2.HealthStatus.Name(d.health))
                for d in message.devices
            )


def test_a_freshly_attached_device_is_never_reported_unhealthy(fabric: Fabric) -> None:
    async def scenario() -> list[str]:
        async with ManagerClient(fabric.processes.manager.address) as client:
            gpu = next(
                d
                for d in await client.devices()
                if d.type is DeviceType.GPU
                and d.state is BindingState.FREE
                and d.pool in fabric.node.pools
                and d.managed
            )
        seen: list[Seen] = []
        opened = asyncio.Event()
        watcher = asyncio.create_task(_watch(fabric.stack.dra_socket, seen, opened))
        problems: list[str] = []
        try:
            await asyncio.wait_for(opened.wait(), 30)
            for n in range(PREPARES):
                ref = await fabric.stack.create_claim(f"health-{n}", [("gpu", gpu.name)], pool=gpu.pool)
                started = len(seen)
                response = await fabric.stack.prepare([ref])
                assert response.claims[ref.uid].error == "", response.claims[ref.uid].error
                prepared_at = time.monotonic()
                deadline = prepared_at + 10
                while not any(s.device == gpu.name and s.health == "HEALTHY" for s in seen[started:]):
                    assert time.monotonic() < deadline, f"prepare {n}: no HEALTHY report for {gpu.name}"
                    await asyncio.sleep(0.01)
                # and a little longer, where a late correction would show
                await asyncio.sleep(0.3)
                reports = [s for s in seen[started:] if s.device == gpu.name]
                if any(s.health == "UNHEALTHY" for s in reports):
                    problems.append(
                        f"prepare {n}: "
                        + ", ".join(f"{s.health}@{(s.at - prepared_at) * 1000:+.0f}ms" for s in reports)
                    )
                unprepared = await fabric.stack.unprepare([ref])
                assert unprepared.claims[ref.uid].error == ""
                await fabric.stack.delete_claim(ref)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        return problems

    problems = asyncio.run(scenario())
    assert not problems, f"a healthy, freshly attached device was reported UNHEALTHY: {problems}"
