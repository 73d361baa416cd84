"""The whole attach path with real processes: emulator (instant) → fabric manager → plugin → API test
server, driven over the DRA socket as the kubelet drives it.

prepare → the device is bound to this node in the fabric, visible in the node's emulated sysfs
tree, the CDI spec is valid and names it → unprepare → unbound, tree entry and spec gone.
Also: racing claims for one device, SIGKILL around a prepare and the retry, restart in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.hostdev import HostScanner
from fabric_dra_testbed.stack import Role
from kube_standin.kubelet_client import ClaimRef as KubeletClaim
from manager_api.client import ManagerClient
from manager_api.models import AttachmentState, BindingState, Device, DeviceType, FabricNode
from tests.support.kubelet import running_kubelet
from tests.support.plugin import DRIVER, ClaimRef, PluginStack, short_dir, start_fabric


@dataclass
class Fabric:
    root: Path
    emulator: Role
    manager: Role
    node: FabricNode
    stack: PluginStack

    @property
    def sysfs_root(self) -> Path:
        return self.root / "emu" / "hosts" / self.node.host / "sys"

    async def device(self, name: str) -> Device:
        async with ManagerClient(self.manager.address) as client:
            return await client.device(name)

    async def free_devices(self, device_type: DeviceType) -> list[Device]:
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


def _nodes(manager_url: str) -> list[FabricNode]:
    async def fetch() -> list[FabricNode]:
        async with ManagerClient(manager_url) as client:
            return await client.nodes()

    return asyncio.run(fetch())


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    root = short_dir("fdf-")
    processes = start_fabric(root)
    try:
        nodes = [n for n in _nodes(processes.manager.address) if n.pools]
        if not nodes:
            pytest.fail(f"the manager maps no node to a fabric pool:\n{processes.manager.tail()}")
        node = nodes[0]
        (root / "k").mkdir()
        stack = PluginStack(
            root / "k",
            node=node.name,
            backend="fabric",
            manager_url=processes.manager.address,
            sysfs_root=processes.sysfs_root(node.host),
        )
        with stack:
            yield Fabric(root, processes.emulator, processes.manager, node, stack)
    finally:
        processes.stop()
        shutil.rmtree(root, ignore_errors=True)


def _spec_names(path: Path) -> list[str]:
    spec = cdi.CdiSpec.model_validate_json(path.read_text())
    cdi.validate_spec(spec)
    return [f"{spec.kind}={d.name}" for d in spec.devices]


def test_prepare_binds_and_unprepare_releases(fabric: Fabric) -> None:
    """Driven by the kubelet-protocol client: registration, prepare, health stream, unprepare."""

    async def scenario() -> None:
        (gpu, *_) = await fabric.free_devices(DeviceType.GPU)
        ref = await fabric.stack.create_claim("flow-gpu", [("gpu", gpu.name)], pool=gpu.pool)
        async with running_kubelet(fabric.stack.registry_dir) as kubelet:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            attempt = next(a for a in kubelet.attempts if a.driver == DRIVER and a.registered)
            assert "v1.DRAPlugin" in attempt.supported_versions
            claim = KubeletClaim(ref.namespace, ref.name, ref.uid)
            results = await plugin.prepare([claim])
            (answered,) = results[ref.uid].devices
            assert (answered.device, answered.pool) == (gpu.name, gpu.pool)

            bound = await fabric.device(gpu.name)
            assert bound.state is BindingState.BOUND and bound.node == fabric.node.name
            assert bound.claim_uid == ref.uid
            host = HostScanner(fabric.sysfs_root, real_host=False).find(identity_of(bound))
            assert host is not None, "the bound GPU is not in the node's sysfs tree"
            (spec_path,) = cdi.spec_files_of_claim(fabric.stack.cdi_root, DRIVER, ref.uid)
            assert _spec_names(spec_path) == list(answered.cdi_device_ids)
            env = json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["env"]
            assert f"{cdi.env_prefix(gpu.name)}PCI_ADDRESS={host.pci_address}" in env

            for _ in range(100):  # the health stream follows the fabric's Status.Health
                if any(h.device == gpu.name and h.health == "Healthy" for h in kubelet.health.values()):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"no Healthy report for {gpu.name}: {kubelet.health}")

            await plugin.unprepare([claim])
        assert (await fabric.device(gpu.name)).state is BindingState.FREE
        assert HostScanner(fabric.sysfs_root, real_host=False).find(identity_of(bound)) is None
        assert cdi.spec_files_of_claim(fabric.stack.cdi_root, DRIVER, ref.uid) == []

    asyncio.run(scenario())


def test_two_claims_racing_for_one_device(fabric: Fabric) -> None:
    async def scenario() -> None:
        (gpu, *_) = await fabric.free_devices(DeviceType.GPU)
        a = await fabric.stack.create_claim("race-a", [("gpu", gpu.name)], pool=gpu.pool)
        b = await fabric.stack.create_claim("race-b", [("gpu", gpu.name)], pool=gpu.pool)
        async with fabric.stack.caller() as kubelet:
            ra, rb = await asyncio.gather(kubelet.prepare([a]), kubelet.prepare([b]))
        errors = {a.uid: ra.claims[a.uid].error, b.uid: rb.claims[b.uid].error}
        winners = [uid for uid, error in errors.items() if not error]
        assert len(winners) == 1, errors
        winner, loser = (a, b) if winners == [a.uid] else (b, a)
        assert "in use" in errors[loser.uid]
        assert (await fabric.device(gpu.name)).claim_uid == winner.uid
        assert (await fabric.stack.unprepare([winner])).claims[winner.uid].error == ""
        assert (await fabric.stack.prepare([loser])).claims[loser.uid].error == ""  # the retry wins now
        assert (await fabric.device(gpu.name)).claim_uid == loser.uid
        assert (await fabric.stack.unprepare([loser])).claims[loser.uid].error == ""

    asyncio.run(scenario())


def test_a_shared_claims_device_on_another_node_is_refused_with_the_recipe(fabric: Fabric) -> None:
    """Pods sharing one claim that the scheduler put on two nodes (no bindsToNode): the other
    node holds the claim's device, and this node's prepare says so — naming that node and the
    pod-affinity recipe — instead of "in use" and endless retries (issue 16, defect 1)."""

    shared = [n for n in _nodes(fabric.manager.address) if set(n.pools) & set(fabric.node.pools)]
    other = next((n for n in shared if n.name != fabric.node.name), None)
    if other is None:
        pytest.fail(f"the topology has no second node on the pools {fabric.node.pools}")

    async def scenario() -> None:
        assert other is not None
        (gpu, *_) = [d for d in await fabric.free_devices(DeviceType.GPU) if d.pool in other.pools]
        ref = await fabric.stack.create_claim("shared", [("gpu", gpu.name)], pool=gpu.pool)
        async with ManagerClient(fabric.manager.address) as client:
            attached = await client.attach(gpu.name, other.name, ref.uid, wait_seconds=10.0)
            assert attached.state is AttachmentState.ATTACHED, attached
            try:
                error = (await fabric.stack.prepare([ref])).claims[ref.uid].error
                assert f"device {gpu.name} of this claim is attached to node {other.name}" in error, error
                assert "pods sharing a fabric-device claim must run on one node" in error
                assert "use pod affinity" in error and "Pods sharing a claim" in error
                assert (await fabric.device(gpu.name)).node == other.name  # nothing moved
                assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""
                assert (await fabric.device(gpu.name)).node == other.name  # and unprepare left it there
            finally:
                await client.detach(gpu.name, other.name, ref.uid, wait_seconds=10.0)

    asyncio.run(scenario())


def test_plugin_killed_around_prepare_and_the_call_retried(fabric: Fabric) -> None:
    async def start() -> tuple[ClaimRef, Device]:
        (nvme, *_) = await fabric.free_devices(DeviceType.NVME)
        ref = await fabric.stack.create_claim("kill-nvme", [("disk", nvme.name)], pool=nvme.pool)
        caller = fabric.stack.caller()
        async with caller:
            call = asyncio.ensure_future(caller.prepare([ref]))
            await asyncio.sleep(0.02)
            fabric.stack.kill_plugin()  # SIGKILL wherever the prepare is
            with contextlib.suppress(grpc.aio.AioRpcError):  # the kubelet sees the call fail and retries
                await call
        return ref, nvme

    ref, nvme = asyncio.run(start())
    fabric.stack.start_plugin()

    async def retry() -> None:
        result = (await fabric.stack.prepare([ref])).claims[ref.uid]
        assert result.error == "", result.error
        bound = await fabric.device(nvme.name)
        assert bound.node == fabric.node.name and bound.claim_uid == ref.uid

    asyncio.run(retry())
    # restarted between prepare and unprepare, and the claim deleted meanwhile
    assert fabric.stack.stop_plugin() == 0
    fabric.stack.start_plugin()

    async def release() -> None:
        await fabric.stack.delete_claim(ref)
        assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""
        assert (await fabric.device(nvme.name)).state is BindingState.FREE

    asyncio.run(release())
