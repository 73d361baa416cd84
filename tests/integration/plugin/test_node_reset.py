"""The node's function-level reset of a warm device between tenants, with real processes: emulator
(instant) → fabric manager (with the API test server, for claims and Events) → plugin, driven over
the DRA socket as the kubelet drives it.

The default topology's one NIC (nic0, a ConnectX-7) has no Redfish ``Reset`` action, so the manager
keeps it warm ``reset: pending`` and the next claim's plugin resets it through the node's sysfs
``reset`` file, here the emulator's tree of the node (``NodeResets`` in its binding table), before
its prepare returns (docs/manager.md and docs/plugin.md "Hygiene between tenants").
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from dra_driver.plugin import cdi
from fabric_dra_testbed.stack import Emulator, Manager
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device
from plumbing.kube.resources import EVENTS, NAMESPACES, NODES
from tests.integration.fabric.test_warm import sample
from tests.support.plugin import DRIVER, ClaimRef, PluginStack, short_dir
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

NODE = "kind-worker"
NIC = "nic0"
NIC_MODEL = "ConnectX-7 200GbE"
NAMESPACES_USED = ("team-a", "team-b", "team-c", "team-d")


@dataclass
class Fabric:
    emulator: Emulator
    manager: Manager
    manager_dir: Path
    stack: PluginStack

    def binding(self) -> dict[str, Any] | None:
        found: list[dict[str, Any]] = self.emulator.bindings()["Bindings"]
        return next((b for b in found if b["Target"].startswith(NIC) or b["Device"] == NIC), None)

    def node_resets(self) -> int:
        binding = self.binding()
        assert binding is not None, f"{NIC} is not bound"
        return int(binding["NodeResets"])

    def ledger(self) -> dict[str, Any]:
        entries = json.loads((self.manager_dir / "ledger.json").read_text())["entries"]
        entry: dict[str, Any] = entries[NIC]
        return entry

    def reset_file(self) -> Path:
        binding = self.binding()
        assert binding is not None
        bdf: str = binding["HostAddress"]["bdf"]
        return self.stack.sysfs_root / "bus" / "pci" / "devices" / bdf / "reset"

    async def device(self) -> Device:
        async with ManagerClient(self.manager.url) as client:
            return await client.device(NIC)

    def metric(self, outcome: str) -> float:
        text = httpx.get(self.manager.url.rstrip("/") + "/metrics", timeout=10).text
        return sample(text, "fabric_dra_device_resets_total", outcome=outcome)


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    root = short_dir("fnr-")
    stack = PluginStack(root, node=NODE, backend="fabric")
    try:
        emulator = stack.stack.emulator(
            name="emulator", state_dir=root / "emu", latency="instant", auth=False
        )
        stack.apiserver = stack.stack.apiserver(root=root / "api")
        asyncio.run(_nodes(stack, emulator.hosts()))
        manager = stack.stack.manager(
            emulator,
            kube=stack.apiserver,
            namespace="default",
            insecure_no_auth=True,
            state_dir=root / "manager",
            args=[
                *("--warm-mode", "fixed"),
                *("--warm-size", "1"),
                *("--warm-model", NIC_MODEL),
                *("--warm-node", NODE),
                *("--warm-interval-seconds", "0.2"),
                *("--poll-seconds", "1"),
                *("--orphan-grace-seconds", "0"),
            ],
        )
        stack.manager_url = manager.url
        stack.sysfs_root = emulator.sysfs(NODE)
        stack.start_plugin()
        fabric = Fabric(emulator, manager, root / "manager", stack)
        asyncio.run(_warm(fabric))
        yield fabric
    finally:
        stack.stack.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _nodes(stack: PluginStack, hosts: list[str]) -> None:
    """Nodes named as the emulated hosts (the manager maps each host to the node of its name), and
    the tenants' namespaces."""
    async with stack.kube() as kube:
        for host in hosts:
            await kube.create(NODES, {"metadata": {"name": host}})
        for namespace in NAMESPACES_USED:
            await kube.create(NAMESPACES, {"metadata": {"name": namespace}})


async def _warm(fabric: Fabric) -> None:
    for _ in range(300):
        shown = await fabric.device()
        if shown.state is BindingState.WARM and shown.node == NODE:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{NIC} never became warm on {NODE}: {await fabric.device()}")


async def _claim(fabric: Fabric, name: str, namespace: str) -> ClaimRef:
    pool = (await fabric.device()).pool
    return await fabric.stack.create_claim(name, [("nic", NIC)], pool=pool, namespace=namespace)


async def _prepare(fabric: Fabric, ref: ClaimRef) -> None:
    result = (await fabric.stack.prepare([ref])).claims[ref.uid]
    assert result.error == "", result.error
    assert cdi.spec_files_of_claim(fabric.stack.cdi_root, DRIVER, ref.uid), "no CDI spec written"


async def _release(fabric: Fabric, ref: ClaimRef) -> None:
    """Unprepare: the NIC goes back to warm on the node, its reset due (the node's, not the fabric's)."""
    assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""
    entry = fabric.ledger()
    assert (entry["state"], entry["claim_uid"], entry["reset"]) == ("warm", "", "pending")


@pytest.fixture
def nic(fabric: Fabric) -> Fabric:
    """The module's stack with its plugin running (a test may leave it killed) and the NIC warm."""
    if fabric.stack.plugin is None:
        fabric.stack.start_plugin()
    asyncio.run(_warm(fabric))
    return fabric


async def _given_back(fabric: Fabric, name: str) -> None:
    """A claim of its own namespace uses the NIC and releases it: warm again, its reset due."""
    ref = await _claim(fabric, name, "team-a")
    await _prepare(fabric, ref)
    await _release(fabric, ref)


async def _events(fabric: Fabric, reason: str) -> list[dict[str, Any]]:
    async with fabric.stack.kube() as kube:
        found = await kube.list(EVENTS, "default")
    items: list[dict[str, Any]] = found.get("items") or []
    return [e for e in items if e.get("reason") == reason]


def test_the_node_resets_the_nic_before_another_namespaces_claim_gets_it(nic: Fabric) -> None:
    fabric = nic

    async def scenario() -> None:
        first = await _claim(fabric, "node-reset-a", "team-a")
        await _prepare(fabric, first)
        assert fabric.ledger()["namespace"] == "team-a"
        await _release(fabric, first)
        since = fabric.binding()
        assert since is not None
        before = fabric.node_resets()

        second = await _claim(fabric, "node-reset-b", "team-b")
        await _prepare(fabric, second)
        # The prepare returned only after the node's reset, in the same binding (a hit: no power cycle).
        assert fabric.node_resets() == before + 1, "the NIC was handed to another namespace unreset"
        binding = fabric.binding()
        assert binding is not None and binding["Since"] == since["Since"] and binding["Host"] == NODE
        entry = fabric.ledger()
        assert (entry["claim_uid"], entry["namespace"], entry["reset"]) == (second.uid, "team-b", "done")
        assert fabric.metric("success") >= 1.0
        plugin_log = fabric.stack.plugin.log_since_start() if fabric.stack.plugin else ""
        assert "device reset before its claim uses it" in plugin_log
        await _release(fabric, second)

    asyncio.run(scenario())


def test_a_plugin_killed_between_the_hit_and_the_reset_resets_on_the_retry(nic: Fabric) -> None:
    fabric = nic
    asyncio.run(_given_back(fabric, "node-reset-before-kill"))

    async def hit_then_die() -> ClaimRef:
        ref = await _claim(fabric, "node-reset-killed", "team-c")
        caller = fabric.stack.caller()
        async with caller:
            with pytest.raises(grpc.aio.AioRpcError):  # the call dies with the plugin
                await caller.prepare([ref])
        return ref

    before = fabric.node_resets()
    plugin = fabric.stack.plugin
    assert plugin is not None
    plugin.start(["plugin.prepare.after-attach"])  # dies once the manager answered the hit
    ref = asyncio.run(hit_then_die())
    plugin.wait_crashed("plugin.prepare.after-attach")
    entry = fabric.ledger()
    assert (entry["claim_uid"], entry["reset"]) == (ref.uid, "pending"), entry  # the claim's, not reset
    assert fabric.node_resets() == before

    fabric.stack.start_plugin()

    async def retry() -> None:
        await _prepare(fabric, ref)  # the attach answers resetRequired again: the retry resets
        assert fabric.node_resets() == before + 1
        assert fabric.ledger()["reset"] == "done"
        await _release(fabric, ref)

    asyncio.run(retry())


def test_a_failed_node_reset_power_cycles_the_nic_for_the_claim(nic: Fabric) -> None:
    fabric = nic

    async def scenario() -> None:
        await _given_back(fabric, "node-reset-before-failure")
        failures = fabric.metric("failure")
        since = fabric.binding()
        assert since is not None
        # The device offers no reset method any more: its sysfs "reset" file is gone.
        fabric.reset_file().unlink()
        ref = await _claim(fabric, "node-reset-failed", "team-d")
        await _prepare(fabric, ref)  # still served: by a new binding (a slot power cycle)
        binding = fabric.binding()
        assert binding is not None and binding["Since"] != since["Since"] and binding["NodeResets"] == 0
        shown = await fabric.device()
        assert (shown.state, shown.claim_uid, shown.node) == (BindingState.BOUND, ref.uid, NODE)
        entry = fabric.ledger()
        assert (entry["state"], entry["claim_uid"], entry.get("reset")) == ("bound", ref.uid, None)
        assert fabric.metric("failure") == failures + 1
        assert (
            "reset of a warm device failed; it is power-cycled for its claim"
            in fabric.manager.role.log_since_start()
        )
        events = await _events(fabric, "DeviceResetFailed")
        assert events, "no DeviceResetFailed Event"
        (event,) = events
        assert event["type"] == "Warning" and event["regarding"]["name"] == NODE
        assert NIC in event["note"] and "supports no reset method" in event["note"]
        assert "slot power cycle" in event["note"]
        await _release_cold(fabric, ref)

    asyncio.run(scenario())


async def _release_cold(fabric: Fabric, ref: ClaimRef) -> None:
    assert (await fabric.stack.unprepare([ref])).claims[ref.uid].error == ""
    wait_until(lambda: fabric.ledger()["state"] == "warm", timeout=10, what="the NIC warm again")
