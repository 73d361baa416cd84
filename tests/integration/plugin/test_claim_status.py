"""What a claim's owner sees: the plugin's ``status.devices`` entries (KEP-4817), written through
the API test server's validation, with real processes — emulator (instant) → fabric manager →
plugin → API test server, the plugin driven over its DRA socket as the kubelet drives it.

Prepared → ``Ready`` True with where the device is (fabric, switch, port, PCI address, link) and
how long the attach took; a device that cannot be attached → ``Ready`` False with the reason and
the kubelet's message; unprepared → the entry is gone; another writer's condition in the same
entry is kept throughout.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fabric_dra_testbed.stack import Role
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType, FabricNode
from plumbing.kube import Invalid
from plumbing.kube.resources import RESOURCE_CLAIMS
from tests.support.plugin import DRIVER, ClaimRef, PluginStack, short_dir, start_fabric


@dataclass
class Fabric:
    manager: Role
    node: FabricNode
    stack: PluginStack

    async def free(self, device_type: DeviceType) -> list[Device]:
        async with ManagerClient(self.manager.address) as client:
            devices = await client.devices()
        return [
            d
            for d in devices
            if d.type is device_type
            and d.state is BindingState.FREE
            and d.pool in self.node.pools
            and d.managed
        ]


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    root = short_dir("fds-")
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
        )
        with stack:
            yield Fabric(processes.manager, node, stack)
    finally:
        processes.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _claim(stack: PluginStack, ref: ClaimRef) -> dict[str, Any]:
    async with stack.kube() as kube:
        return await kube.get(RESOURCE_CLAIMS, ref.name, ref.namespace)


async def _entries_when(
    stack: PluginStack, ref: ClaimRef, done: Any, within: float = 15.0
) -> list[dict[str, Any]]:
    """The claim's ``status.devices`` once ``done(entries)`` holds (the plugin writes in the background)."""
    deadline = time.monotonic() + within
    while True:
        entries = list((await _claim(stack, ref)).get("status", {}).get("devices") or [])
        if done(entries):
            return entries
        if time.monotonic() > deadline:
            pytest.fail(f"claim {ref.name}: status.devices never became as expected: {entries}")
        await asyncio.sleep(0.05)


def _ready(entry: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in entry.get("conditions") or [] if c["type"] == "Ready"), None)


def test_a_prepared_device_is_ready_and_says_where_it_is(fabric: Fabric) -> None:
    async def scenario() -> None:
        gpu = (await fabric.free(DeviceType.GPU))[0]
        ref = await fabric.stack.create_claim("status-gpu", [("gpu", gpu.name)], pool=gpu.pool)
        response = await fabric.stack.prepare([ref])
        assert response.claims[ref.uid].error == ""

        (entry,) = await _entries_when(fabric.stack, ref, lambda e: bool(e) and _ready(e[0]) is not None)
        assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, gpu.pool, gpu.name)
        ready = _ready(entry)
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("True", "Prepared")
        assert fabric.node.name in ready["message"] and gpu.name in ready["message"]
        assert ready["lastTransitionTime"]
        data = entry["data"]
        assert gpu.switch and gpu.port, "the emulator's GPUs hang off a switch port"
        assert data["node"] == fabric.node.name
        assert data["fabric"] == gpu.fabric
        assert (data.get("switch"), data.get("port")) == (gpu.switch, gpu.port)
        assert data["link"] == {"generation": gpu.pcie_generation, "width": gpu.pcie_width}
        assert data["pciAddress"], "the host's PCI address of the attached GPU"
        assert data["attachSeconds"] > 0

        # Unprepared: the plugin's entry goes with the device.
        assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""
        assert await _entries_when(fabric.stack, ref, lambda e: not e) == []

    asyncio.run(scenario())


def test_another_writers_condition_in_the_entry_is_kept(fabric: Fabric) -> None:
    """The controller's binding condition and the plugin's Ready live in one entry; neither
    writer takes the other's away, and unprepare leaves the other's behind."""

    async def scenario() -> None:
        gpu = (await fabric.free(DeviceType.GPU))[0]
        ref = await fabric.stack.create_claim("status-shared", [("gpu", gpu.name)], pool=gpu.pool)
        claim = await _claim(fabric.stack, ref)
        attached = {
            "type": f"{DRIVER}/Attached",
            "status": "True",
            "reason": "Attached",
            "message": "bound by the fabric",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        claim["status"]["devices"] = [
            {"driver": DRIVER, "pool": gpu.pool, "device": gpu.name, "conditions": [attached]}
        ]
        async with fabric.stack.kube() as kube:
            await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")

        assert (await fabric.stack.prepare([ref])).claims[ref.uid].error == ""
        (entry,) = await _entries_when(fabric.stack, ref, lambda e: bool(e) and _ready(e[0]) is not None)
        assert [c["type"] for c in entry["conditions"]] == [f"{DRIVER}/Attached", "Ready"]
        assert entry["conditions"][0] == attached

        assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""
        (left,) = await _entries_when(fabric.stack, ref, lambda e: bool(e) and _ready(e[0]) is None)
        assert left == {"driver": DRIVER, "pool": gpu.pool, "device": gpu.name, "conditions": [attached]}

    asyncio.run(scenario())


def test_a_device_that_cannot_be_attached_is_not_ready_and_says_why(fabric: Fabric) -> None:
    async def scenario() -> None:
        pool = fabric.node.pools[0]
        ref = await fabric.stack.create_claim("status-missing", [("gpu", "gpu-not-in-fabric")], pool=pool)
        response = await fabric.stack.prepare([ref])
        error = response.claims[ref.uid].error
        assert "gpu-not-in-fabric" in error

        (entry,) = await _entries_when(fabric.stack, ref, lambda e: bool(e) and _ready(e[0]) is not None)
        ready = _ready(entry)
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "AttachFailed")
        assert ready["message"] and ready["message"] in error
        assert entry["data"] == {"node": fabric.node.name}, "nothing is attached: only whose entry it is"

    asyncio.run(scenario())


def test_the_api_server_refuses_an_entry_of_a_device_the_claim_does_not_allocate(fabric: Fabric) -> None:
    """Over HTTP, as the plugin writes: a merge patch of ``/status`` naming another device is a 422."""

    async def scenario() -> None:
        pool = fabric.node.pools[0]
        ref = await fabric.stack.create_claim("status-foreign", [("gpu", "gpu0")], pool=pool)
        claim = await _claim(fabric.stack, ref)
        entry = {"driver": DRIVER, "pool": pool, "device": "gpu1"}
        patch = {
            "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
            "status": {"devices": [entry]},
        }
        async with fabric.stack.kube() as kube:
            with pytest.raises(Invalid) as refused:
                await kube.patch(RESOURCE_CLAIMS, ref.name, patch, ref.namespace, subresource="status")
        assert f"status.devices[0]: Invalid value: {DRIVER}/{pool}/gpu1: must be an allocated device" in str(
            refused.value
        )
        assert "devices" not in (await _claim(fabric.stack, ref)).get("status", {})

    asyncio.run(scenario())
