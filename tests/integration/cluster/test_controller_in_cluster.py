"""The controller (a real process, over a stand-in fabric manager) publishing for the stand-in
control plane on a default 1.36 API server — the issue 16 acceptance checks:

- a device whose attach fails every time: the stand-in scheduler, like the real one, allocates
  it again after every AttachFailed; the controller takes it out of allocation after three
  failures (an attach-failed taint) and the pod runs on another device within 30 s (defect 2);
- the same in the plain flow, where the plugin attaches at prepare time and the kubelet retries:
  the controller counts the failures from the manager's inventory, the taint is NoExecute, the
  device-taint eviction controller evicts the pod, its claim goes with it, and the replacement
  pod runs on another device within 30 s (defect 2);
- pods sharing one claim: the controller publishes ``bindsToNode`` in the plain flow too, so the
  scheduler pins the claim's allocation to one node and all three replicas run there within
  30 s, although the pool's two nodes are equally good; where the server drops ``bindsToNode``
  (gate off) the replicas spread and every one on the other node gets the explicit message as
  its ``FailedPrepareDynamicResources`` event within 30 s (defect 1)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dra_driver.plugin.prepare_errors import attach_failure
from dra_driver.proto.dra_v1 import api_pb2 as dra_v1
from fabric_dra_testbed.stack import Stack
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from manager_api.client import ManagerClient
from manager_api.errors import FabricError
from manager_api.models import Inventory, ReachGroup
from plumbing.kube import KubeClient, KubeConfig
from plumbing.kube.resources import EVENTS, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_stand_in_cluster import (
    World,
    bound_nodes,
    claims,
    deploy,
    deploy_sharing,
    pods,
    running,
)
from tests.support.waiting import eventually


@dataclass
class Publishing:
    manager: InventoryServer
    #: the controller's /metrics and /status
    controller_url: str


@contextlib.asynccontextmanager
async def controller_for(
    world: World, apiserver_url: str, tmp_path: Path, devices: int, *args: str
) -> AsyncIterator[Publishing]:
    """A stand-in manager with ``devices`` GPUs in one pool every node of ``world`` reaches, and
    the controller publishing it; yields once the pool is in a ResourceSlice."""
    pool = f"fp-{world.tag}"
    inventory = make_inventory(
        [make_device(f"gpu-{i}", pool=pool, switch="sw1") for i in range(devices)], pools={pool: world.nodes}
    )
    async with controller_over(world, apiserver_url, tmp_path, inventory, *args) as publishing:
        yield publishing


@contextlib.asynccontextmanager
async def controller_over(
    world: World, apiserver_url: str, tmp_path: Path, inventory: Inventory, *args: str
) -> AsyncIterator[Publishing]:
    """A stand-in manager serving ``inventory`` (one pool, ``fp-<tag>``) and the controller
    publishing it; yields once the pool is in a ResourceSlice."""
    pool = f"fp-{world.tag}"
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, apiserver_url)
    with InventoryServer(inventory) as manager, Stack(tmp_path / "s", logs_dir=tmp_path) as stack:
        args = ("--manager-url", manager.url, "--driver-name", DRIVER, *args)
        controller = stack.controller(None, kubeconfig, args=list(args))

        async def published() -> bool:
            items, _ = await world.kube.list_all(RESOURCE_SLICES)
            return any(s["spec"]["pool"]["name"] == pool for s in items)

        await eventually(published, what="the controller's pool", within=30)
        yield Publishing(manager, controller.role.address)


async def running_on(world: World) -> list[Any] | None:
    """The devices of the one pod's claim once that pod runs, else None."""
    current = await pods(world)
    if [(p.get("status") or {}).get("phase") for p in current] != ["Running"]:
        return None
    allocations = [c["status"]["allocation"] for c in await claims(world)]
    return [r["device"] for a in allocations for r in a["devices"]["results"]]


async def taints_of(world: World, device: str) -> list[dict[str, Any]]:
    items, _ = await world.kube.list_all(RESOURCE_SLICES)
    return [
        t
        for s in items
        if s["spec"]["pool"]["name"] == f"fp-{world.tag}"
        for d in s["spec"]["devices"]
        if d["name"] == device
        for t in d.get("taints") or []
    ]


async def test_a_device_failing_every_attach_is_tainted_and_the_pod_runs_on_another(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    async with (
        running(kube, fake_plugin) as world,
        controller_for(world, apiserver_url, tmp_path, 3, "--binding-conditions") as publishing,
    ):
        manager = publishing.manager
        # gpu-0 is first in the allocator's order and fails every attach.
        manager.fail_every_attach["gpu-0"] = "BindFailed"
        started = time.monotonic()
        await deploy(world, replicas=1, count=1)

        got = await eventually(lambda: running_on(world), what="the pod Running elsewhere", within=30)
        elapsed = time.monotonic() - started
        assert got == ["gpu-1"], got
        attempts = [c for c in manager.attach_calls if c[0] == "gpu-0"]
        assert len(attempts) >= 3  # the scheduler allocated gpu-0 again after each failure
        taints = await taints_of(world, "gpu-0")
        assert [(t["key"], t["effect"]) for t in taints] == [(f"{DRIVER}/attach-failed", "NoSchedule")]
        events, _ = await kube.list_all(EVENTS, world.ns)
        assert any(e.get("reason") == "DeviceQuarantined" for e in events)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{publishing.controller_url}/metrics")).text
        assert 'fabric_dra_controller_device_quarantines_total{reason="BindFailed"} 1.0' in metrics
        assert f'fabric_dra_controller_quarantined_devices{{pool="fp-{world.tag}"}} 1.0' in metrics
        print(f"failing device: pod Running on another device {elapsed:.1f}s after the Deployment")


async def test_plain_flow_a_device_failing_every_attach_is_evicted_from_and_the_pod_runs_on_another(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    async with (
        running(kube, fake_plugin) as world,
        controller_for(world, apiserver_url, tmp_path, 3) as publishing,  # no binding conditions
    ):
        manager = publishing.manager
        # gpu-0 is first in the allocator's order and fails every attach.
        manager.fail_every_attach["gpu-0"] = "BindFailed"
        async with ManagerClient(manager.url) as client:

            async def attach(claim: dra_v1.Claim, node: str) -> str:
                """The real plugin's prepare: attach every device the claim's allocation names."""
                obj = await kube.get(RESOURCE_CLAIMS, claim.name, claim.namespace)
                for result in obj["status"]["allocation"]["devices"]["results"]:
                    try:
                        await client.attach(result["device"], node, claim.uid, pool=result["pool"])
                    except FabricError as err:
                        return attach_failure(err, result["device"], node, claim.uid)
                return ""

            fake_plugin.attach = attach
            started = time.monotonic()
            await deploy(world, replicas=1, count=1)

            got = await eventually(lambda: running_on(world), what="the pod Running elsewhere", within=30)
            elapsed = time.monotonic() - started
        assert got == ["gpu-1"], got
        attempts = [c for c in manager.attach_calls if c[0] == "gpu-0"]
        assert len(attempts) >= 3  # the kubelet retried the prepare, each time attaching gpu-0
        assert len({claim for _, _, claim in attempts}) == 1  # all for the first pod's claim
        taints = await taints_of(world, "gpu-0")
        assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
            (f"{DRIVER}/attach-failed", "BindFailed", "NoExecute")
        ]
        events, _ = await kube.list_all(EVENTS, world.ns)
        reasons = {e.get("reason") for e in events}
        assert "DeviceQuarantined" in reasons, reasons
        assert "DeviceTaintManagerEviction" in reasons, reasons
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{publishing.controller_url}/metrics")).text
        assert 'fabric_dra_controller_device_quarantines_total{reason="BindFailed"} 1.0' in metrics
        assert f'fabric_dra_controller_quarantined_devices{{pool="fp-{world.tag}"}} 1.0' in metrics
        print(
            f"failing device, plain flow: pod Running on another device {elapsed:.1f}s after the Deployment"
        )


async def test_replicas_sharing_a_claim_all_run_on_the_node_its_allocation_binds_to(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    async with (
        running(kube, fake_plugin, nodes=2) as world,
        controller_for(world, apiserver_url, tmp_path, 1),  # the plain flow: no binding conditions
    ):
        started = time.monotonic()
        await deploy_sharing(world, replicas=3)

        async def all_running() -> list[str] | None:
            nodes = await bound_nodes(world, 3)
            phases = [(p.get("status") or {}).get("phase") for p in await pods(world)]
            return nodes if nodes and phases == ["Running"] * 3 else None

        nodes = await eventually(all_running, what="three replicas Running", within=30)
        elapsed = time.monotonic() - started
        assert isinstance(nodes, list) and len(set(nodes)) == 1, nodes
        (claim,) = await claims(world)
        pinned = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
        assert pinned == {"key": "metadata.name", "operator": "In", "values": [nodes[0]]}
        print(f"shared claim: 3 replicas Running on {nodes[0]} {elapsed:.1f}s after the Deployment")


async def test_without_bindsToNode_the_replicas_on_the_other_node_say_why_they_cannot_start(
    fake_plugin: FakePlugin, second_fake_plugin: FakePlugin, tmp_path: Path
) -> None:
    """A 1.36 server with DRADeviceBindingConditions off drops bindsToNode: the scheduler spreads
    the replicas over both nodes; the fabric binds the claim's device to the first node that
    prepares it, and every replica on the other node shows the explicit message — no silent
    retries."""
    fabric: dict[str, str] = {}
    fake_plugin.fabric = second_fake_plugin.fabric = fabric
    with Stack(tmp_path / "api", logs_dir=tmp_path) as stack:
        server = stack.apiserver(
            root=tmp_path / "api",
            validate_versions="1.34",
            extra_args=[
                "--allow-anonymous",
                "--server-version",
                "1.36.2",
                "--feature-gates",
                "DRADeviceBindingConditions=false",
            ],
        )
        async with (
            KubeClient(KubeConfig(server=server.url)) as kube,
            running(kube, [fake_plugin, second_fake_plugin], nodes=2) as world,
            controller_for(world, server.url, tmp_path, 1),
        ):
            items, _ = await kube.list_all(RESOURCE_SLICES)
            assert all("bindsToNode" not in d for s in items for d in s["spec"]["devices"])
            started = time.monotonic()
            await deploy_sharing(world, replicas=3)

            async def explained() -> tuple[str, dict[str, str]] | None:
                current = await pods(world)
                nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in current}
                if len(current) != 3 or not all(nodes.values()) or len(set(nodes.values())) != 2:
                    return None
                (claim_uid,) = {c["metadata"]["uid"] for c in await claims(world)}
                holder = fabric.get(claim_uid)
                others = {name for name, node in nodes.items() if node != holder}
                events, _ = await kube.list_all(EVENTS, world.ns)
                told = {
                    e["regarding"]["name"]: e.get("note", "")
                    for e in events
                    if e.get("reason") == "FailedPrepareDynamicResources"
                }
                if holder is None or not others or not others <= set(told):
                    return None
                return holder, {name: told[name] for name in others}

            got = await eventually(explained, what="the explicit message on every other replica", within=30)
            elapsed = time.monotonic() - started
            assert isinstance(got, tuple)
            holder, messages = got
            for message in messages.values():
                assert f"of this claim is attached to node {holder}" in message, message
                assert "pods sharing a fabric-device claim must run on one node — use pod affinity" in message
            running_on_holder = [
                p for p in await pods(world) if (p.get("status") or {}).get("phase") == "Running"
            ]
            assert {p["spec"]["nodeName"] for p in running_on_holder} <= {holder}
            print(f"shared claim, no bindsToNode: message on {len(messages)} replica(s) after {elapsed:.1f}s")


async def test_devices_behind_a_partially_cabled_switch_go_to_the_nodes_that_reach_them(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    """Issue 15, item 2, end to end: the real controller publishes a pool of four nodes whose GPUs
    only two of them reach (a reach group); it labels exactly those two; the stand-in scheduler,
    which spreads pods over the emptiest nodes, puts every pod on them."""
    async with running(kube, fake_plugin, nodes=4) as world:
        pool = f"fp-{world.tag}"
        cabled = world.nodes[2:]  # not the first in the scheduler's order
        inventory = make_inventory(
            [make_device(f"gpu-{i}", pool=pool, switch="sw9", reach="g1") for i in range(4)],
            pools={pool: world.nodes},
        )
        inventory.pools[0].reach_groups = [ReachGroup(id="g1", nodes=cabled)]
        async with controller_over(world, apiserver_url, tmp_path, inventory):
            items, _ = await kube.list_all(RESOURCE_SLICES)
            (slice_,) = [s for s in items if s["spec"]["pool"]["name"] == pool]
            (term,) = slice_["spec"]["nodeSelector"]["nodeSelectorTerms"]
            (requirement,) = term["matchExpressions"]
            key = requirement["key"]

            async def labelled() -> list[str] | None:
                nodes, _ = await kube.list_all(NODES)
                found = sorted(
                    n["metadata"]["name"]
                    for n in nodes
                    if n["metadata"]["name"] in world.nodes and (n["metadata"].get("labels") or {}).get(key)
                )
                return found if found == sorted(cabled) else None

            await eventually(labelled, what="the reach-group label on exactly the cabled nodes", within=30)
            await deploy(world, replicas=4, count=1)

            async def all_running() -> list[str] | None:
                current = await pods(world)
                phases = [(p.get("status") or {}).get("phase") for p in current]
                if len(current) != 4 or set(phases) != {"Running"}:
                    return None
                return [p["spec"]["nodeName"] for p in current]

            placed = await eventually(all_running, what="four pods Running", within=60)
            assert set(placed) == set(cabled), placed
