"""The stand-in control plane against the API test server: Deployment → pods → claims from a
template → allocation → binding → prepare on the node's plugin → Running; scale to 0 releases."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kube_standin.cluster import NodeSpec, SchedulerConfig, StandInCluster
from kube_standin.cluster.kubelet import ClaimRef, DraNodeClient
from plumbing.kube import KubeClient, NotFound
from plumbing.kube.dra import is_allocated
from plumbing.kube.resources import (
    DEPLOYMENTS,
    DEVICE_CLASSES,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.support.waiting import eventually

#: how long the stand-in control plane may take to stop once cancelled
STOP_WITHIN = 20.0


@dataclass
class World:
    kube: KubeClient
    ns: str
    tag: str
    node: str
    device_class: str
    #: every node of the pool, ``node`` first
    nodes: list[str]


def _gpu(name: str, switch: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "switch": {"string": switch}}, **extra}


@contextlib.asynccontextmanager
async def running(
    kube: KubeClient,
    plugin: FakePlugin | Sequence[FakePlugin],
    *,
    nodes: int = 1,
    node_names: Sequence[str] = (),
    client_factory: Callable[[NodeSpec], DraNodeClient] | None = None,
    **scheduler: Any,
) -> AsyncIterator[World]:
    """A namespace, a DeviceClass and ``nodes`` nodes (or the nodes ``node_names``: those of a
    fabric's hosts), the stand-in control plane over them; node i registers the i-th of ``plugin``
    (one plugin: every node the same)."""
    tag = uuid.uuid4().hex[:6]
    names = list(node_names) or [f"node-{tag}"] + [f"node-{tag}-{i}" for i in range(1, nodes)]
    plugins = [plugin] if isinstance(plugin, FakePlugin) else list(plugin)
    for i, name in enumerate(names):
        plugins[i % len(plugins)].node = name
    world = World(kube, f"team-{tag}", tag, names[0], f"fabric-gpu-{tag}", names)
    await kube.create(NAMESPACES, {"metadata": {"name": world.ns}})
    await kube.create(
        DEVICE_CLASSES,
        {
            "metadata": {"name": world.device_class},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f'device.driver == "{DRIVER}" && '
                            'device.attributes["fabric-dra.io"].type == "gpu"'
                        }
                    }
                ]
            },
        },
    )
    cluster = StandInCluster(
        kube,
        [
            NodeSpec(name, {"fabric-dra.io/test": tag}, plugins[i % len(plugins)].registry_dir)
            for i, name in enumerate(names)
        ],
        scheduler=SchedulerConfig(**scheduler),
        client_factory=client_factory,
    )
    task = asyncio.create_task(cluster.run())
    try:
        await asyncio.wait_for(cluster.ready.wait(), 15)
        yield world
    finally:
        task.cancel()
        # bounded: a control plane that does not stop is this file's failure, said as such
        stopped, _ = await asyncio.wait({task}, timeout=STOP_WITHIN)
        assert stopped, f"the stand-in control plane did not stop within {STOP_WITHIN} s of its cancel"
        with contextlib.suppress(asyncio.CancelledError):
            task.result()
        # The API server outlives the test: leave no node or pool that another test could use.
        for name in names:
            await kube.delete_ignore_missing(NODES, name)
        await kube.delete_ignore_missing(RESOURCE_SLICES, f"fabric-pcie-{world.tag}")
        await kube.delete_ignore_missing(DEVICE_CLASSES, world.device_class)


async def publish(world: World, devices: list[dict[str, Any]]) -> None:
    await world.kube.create(
        RESOURCE_SLICES,
        {
            "metadata": {"name": f"fabric-pcie-{world.tag}"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": f"fabric-pcie-{world.tag}", "generation": 1, "resourceSliceCount": 1},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "fabric-dra.io/test", "operator": "In", "values": [world.tag]}
                            ]
                        }
                    ]
                },
                "devices": devices,
            },
        },
    )


async def deploy(world: World, replicas: int, count: int = 2) -> None:
    await world.kube.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "gpus", "namespace": world.ns},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpus",
                                "exactly": {"deviceClassName": world.device_class, "count": count},
                            }
                        ],
                        "constraints": [{"matchAttribute": "fabric-dra.io/switch"}],
                    }
                }
            },
        },
        world.ns,
    )
    await world.kube.create(
        DEPLOYMENTS,
        {
            "metadata": {"name": "trainer", "namespace": world.ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "trainer"}},
                "template": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {
                        "resourceClaims": [{"name": "accel", "resourceClaimTemplateName": "gpus"}],
                        "containers": [
                            {
                                "name": "train",
                                "image": "busybox",
                                "resources": {"claims": [{"name": "accel"}]},
                            }
                        ],
                    },
                },
            },
        },
        world.ns,
    )


async def pods(world: World) -> list[dict[str, Any]]:
    items, _ = await world.kube.list_all(PODS, world.ns)
    return items


async def claims(world: World) -> list[dict[str, Any]]:
    items, _ = await world.kube.list_all(RESOURCE_CLAIMS, world.ns)
    return items


async def reasons(world: World) -> list[tuple[str, str]]:
    items, _ = await world.kube.list_all(EVENTS, world.ns)
    return [(e.get("reason", ""), e.get("note", "")) for e in items]


async def test_deployment_claims_are_allocated_prepared_and_released(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    async with running(kube, fake_plugin) as world:
        await publish(
            world, [_gpu("gpu-0", "sw1"), _gpu("gpu-1", "sw1"), _gpu("gpu-2", "sw2"), _gpu("gpu-3", "sw2")]
        )
        await deploy(world, replicas=2)

        async def all_running() -> list[dict[str, Any]] | None:
            current = await pods(world)
            ok = len(current) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in current)
            return current if ok else None

        running_pods = await eventually(all_running, what="two Running pods")
        assert isinstance(running_pods, list)
        assert {p["spec"]["nodeName"] for p in running_pods} == {world.node}
        for pod in running_pods:
            owner = pod["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["controller"]) == ("Deployment", "trainer", True)
            assert [s["name"] for s in pod["status"]["resourceClaimStatuses"]] == ["accel"]
            assert {c["type"] for c in pod["status"]["conditions"]} >= {"PodScheduled", "Ready"}

        allocated = await claims(world)
        assert len(allocated) == 2
        switches: list[set[str]] = []
        devices: list[str] = []
        for claim in allocated:
            meta, status = claim["metadata"], claim["status"]
            assert meta["name"].startswith(f"{meta['ownerReferences'][0]['name']}-accel-")
            assert meta["annotations"]["resource.kubernetes.io/pod-claim-name"] == "accel"
            assert "resource.kubernetes.io/delete-protection" in meta["finalizers"]
            assert [r["name"] for r in status["reservedFor"]] == [meta["ownerReferences"][0]["name"]]
            results = status["allocation"]["devices"]["results"]
            devices += [r["device"] for r in results]
            switches.append({"sw1" if r["device"] in ("gpu-0", "gpu-1") else "sw2" for r in results})
        assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # no device twice
        assert all(len(s) == 1 for s in switches)  # matchAttribute held
        assert sorted(fake_plugin.prepared) == sorted(c["metadata"]["uid"] for c in allocated)
        assert {"Scheduled", "AllocatedDevices", "Started"} <= {r for r, _ in await reasons(world)}

        await kube.patch(DEPLOYMENTS, "trainer", {"spec": {"replicas": 0}}, world.ns)

        async def released() -> bool:
            return not await pods(world) and not await claims(world)

        await eventually(released, what="pods and claims gone after scaling to 0")
        assert sorted(fake_plugin.unprepared) == sorted(fake_plugin.prepared)


async def test_a_third_pod_that_cannot_fit_stays_pending_with_a_reason(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    async with running(kube, fake_plugin) as world:
        await publish(world, [_gpu("gpu-0", "sw1"), _gpu("gpu-1", "sw1"), _gpu("gpu-2", "sw2")])
        await deploy(world, replicas=2)

        async def one_running_one_refused() -> bool:
            phases = sorted((p.get("status") or {}).get("phase", "Pending") for p in await pods(world))
            refused = any(
                r == "FailedScheduling" and "cannot allocate all claims" in n for r, n in await reasons(world)
            )
            return phases == ["Pending", "Running"] and refused

        await eventually(one_running_one_refused, what="one pod Running and one refused by the scheduler")


async def test_plugin_errors_become_pod_events(kube: KubeClient, fake_plugin: FakePlugin) -> None:
    fake_plugin.prepare_error = "attach of fabric-pcie/gpu-0 failed: DeviceBusy"
    async with running(kube, fake_plugin) as world:
        await publish(world, [_gpu("gpu-0", "sw1"), _gpu("gpu-1", "sw1")])
        await deploy(world, replicas=1)

        async def failed_event() -> bool:
            return any(
                r == "FailedPrepareDynamicResources" and "DeviceBusy" in n for r, n in await reasons(world)
            )

        await eventually(failed_event, what="FailedPrepareDynamicResources event")
        (pod,) = await pods(world)
        assert (pod.get("status") or {}).get("phase") != "Running"
        fake_plugin.prepare_error = ""

        async def recovered() -> bool:
            return [(p.get("status") or {}).get("phase") for p in await pods(world)] == ["Running"]

        await eventually(recovered, what="pod Running after the plugin recovers")


async def test_binding_conditions_gate_the_bind_and_failures_reschedule(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    conditions = {
        "bindsToNode": True,
        "bindingConditions": ["FabricAttached"],
        "bindingFailureConditions": ["FabricAttachFailed"],
    }
    async with running(kube, fake_plugin) as world:
        await publish(
            world,
            [
                _gpu("gpu-0", "sw1", **conditions),
                _gpu("gpu-1", "sw1", **conditions),
                _gpu("gpu-2", "sw2", **conditions),
                _gpu("gpu-3", "sw2", **conditions),
            ],
        )
        await deploy(world, replicas=1)

        async def allocated_claim() -> dict[str, Any] | None:
            found = [c for c in await claims(world) if is_allocated(c)]
            return found[0] if found else None

        claim = await eventually(allocated_claim, what="claim allocated")
        assert isinstance(claim, dict)
        first = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
            "values"
        ] == [world.node]
        (pod,) = await pods(world)
        assert not pod["spec"].get("nodeName")  # not bound before the conditions hold

        # The fabric reports a failed attach: the scheduler deallocates and allocates again — the
        # same devices, as the real allocator's first fit does: it remembers no failure.
        await set_device_conditions(kube, claim, "FabricAttachFailed")

        async def reallocated(*, avoiding: set[str]) -> dict[str, Any] | None:
            current = await allocated_claim()
            if (
                current is None
                or current["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
            ):
                return None
            if (current.get("status") or {}).get("devices"):
                return None  # still the failed allocation
            devices = {r["device"] for r in current["status"]["allocation"]["devices"]["results"]}
            return current if not devices & avoiding else None

        again = await eventually(lambda: reallocated(avoiding=set()), what="claim allocated again")
        assert isinstance(again, dict)
        assert [r["device"] for r in again["status"]["allocation"]["devices"]["results"]] == first
        assert any(r == "FailedBinding" for r, _ in await reasons(world))

        # Only a taint on the failed devices (what the driver does) moves the allocation.
        fresh = await kube.get(RESOURCE_SLICES, f"fabric-pcie-{world.tag}")
        for device in fresh["spec"]["devices"]:
            if device["name"] in first:
                device["taints"] = [{"key": "fabric-dra.io/attach-failed", "effect": "NoSchedule"}]
        await kube.replace(RESOURCE_SLICES, fresh)
        claim = again
        await set_device_conditions(kube, again, "FabricAttachFailed")
        moved = await eventually(
            lambda: reallocated(avoiding=set(first)), what="claim allocated on untainted devices"
        )
        assert isinstance(moved, dict)
        claim = moved
        await set_device_conditions(kube, claim, "FabricAttached")

        async def bound_and_running() -> bool:
            return [
                (p["spec"].get("nodeName"), (p.get("status") or {}).get("phase")) for p in await pods(world)
            ] == [(world.node, "Running")]

        await eventually(bound_and_running, what="pod bound and Running after the conditions hold")


async def set_device_conditions(kube: KubeClient, claim: dict[str, Any], condition: str) -> None:
    for _ in range(5):
        fresh = await kube.get(RESOURCE_CLAIMS, claim["metadata"]["name"], claim["metadata"]["namespace"])
        results = fresh["status"]["allocation"]["devices"]["results"]
        fresh["status"]["devices"] = [
            {
                "driver": r["driver"],
                "pool": r["pool"],
                "device": r["device"],
                "conditions": [
                    {
                        "type": condition,
                        "status": "True",
                        "reason": "Test",
                        "message": "set by the test",
                        "lastTransitionTime": "2025-01-01T00:00:00Z",
                    }
                ],
            }
            for r in results
        ]
        try:
            await kube.replace(RESOURCE_CLAIMS, fresh, subresource="status")
            return
        except NotFound:
            raise
        except Exception:  # a conflict with the scheduler's own write: read again
            await asyncio.sleep(0.1)
    pytest.fail("could not set device conditions")


async def deploy_sharing(world: World, replicas: int) -> None:
    """One ResourceClaim (not a template) used by every replica of a Deployment."""
    await world.kube.create(
        RESOURCE_CLAIMS,
        {
            "metadata": {"name": "shared", "namespace": world.ns},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": world.device_class}}]}
            },
        },
        world.ns,
    )
    await world.kube.create(
        DEPLOYMENTS,
        {
            "metadata": {"name": "sharers", "namespace": world.ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "sharers"}},
                "template": {
                    "metadata": {"labels": {"app": "sharers"}},
                    "spec": {
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
                        "containers": [
                            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                        ],
                    },
                },
            },
        },
        world.ns,
    )


async def bound_nodes(world: World, replicas: int) -> list[str] | None:
    current = await pods(world)
    nodes = [p["spec"].get("nodeName") for p in current]
    return sorted(nodes) if len(current) == replicas and all(nodes) else None


async def test_pods_sharing_a_claim_spread_over_the_pools_nodes_without_bindsToNode(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    """The allocation's nodeSelector is the pool's label, which both nodes carry: the real
    scheduler spreads the Deployment's pods over them, so the stand-in must too."""
    async with running(kube, fake_plugin, nodes=2) as world:
        await publish(world, [_gpu("gpu-0", "sw1")])
        await deploy_sharing(world, replicas=3)
        nodes = await eventually(lambda: bound_nodes(world, 3), what="three pods bound")
        assert isinstance(nodes, list)
        assert set(nodes) == set(world.nodes), nodes
        (claim,) = await claims(world)
        assert len(claim["status"]["reservedFor"]) == 3


async def test_pods_sharing_a_bindsToNode_claim_all_land_on_the_allocated_node(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    async with running(kube, fake_plugin, nodes=2) as world:
        await publish(world, [_gpu("gpu-0", "sw1", bindsToNode=True)])
        await deploy_sharing(world, replicas=3)
        nodes = await eventually(lambda: bound_nodes(world, 3), what="three pods bound")
        assert isinstance(nodes, list)
        assert len(set(nodes)) == 1, nodes
        (claim,) = await claims(world)
        pinned = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
        assert pinned["values"] == [nodes[0]]


async def test_a_slice_changed_between_pods_is_what_the_next_pod_is_allocated_from(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    """The scheduler keeps its allocator while the slices stay the same; a new generation of the
    pool is what the next pod's claim is allocated from."""
    async with running(kube, fake_plugin) as world:
        await publish(world, [_gpu("gpu-0", "sw1")])
        await deploy(world, replicas=1, count=1)

        async def devices() -> list[str]:
            return sorted(
                r["device"]
                for c in await claims(world)
                if is_allocated(c)
                for r in c["status"]["allocation"]["devices"]["results"]
            )

        async def allocated(expected: list[str]) -> bool:
            return await devices() == expected

        await eventually(lambda: allocated(["gpu-0"]), what="the first pod's claim allocated gpu-0")
        stored = await kube.get(RESOURCE_SLICES, f"fabric-pcie-{world.tag}")
        stored["spec"]["pool"]["generation"] = 2
        stored["spec"]["devices"] = [_gpu("gpu-0", "sw1"), _gpu("gpu-7", "sw1")]
        await kube.replace(RESOURCE_SLICES, stored)
        await kube.patch(DEPLOYMENTS, "trainer", {"spec": {"replicas": 2}}, world.ns)
        await eventually(lambda: allocated(["gpu-0", "gpu-7"]), what="the second pod's claim allocated gpu-7")


async def test_one_slow_prepare_does_not_hold_up_the_other_pods_of_its_node(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    """The kubelet works on each pod in its own worker: while one pod's NodePrepareResources hangs
    (a hot-add taking long), another pod of the same node is prepared and runs."""
    gate = asyncio.Event()
    held: list[str] = []

    async def attach(claim: Any, node: str) -> str:
        if not held:
            held.append(claim.uid)
            await gate.wait()
        return ""

    fake_plugin.attach = attach
    async with running(kube, fake_plugin) as world:
        await publish(world, [_gpu("gpu-0", "sw1"), _gpu("gpu-1", "sw1")])
        await deploy(world, replicas=2, count=1)
        try:

            async def one_running_one_held() -> bool:
                phases = sorted((p.get("status") or {}).get("phase", "Pending") for p in await pods(world))
                return bool(held) and phases == ["Pending", "Running"]

            await eventually(
                one_running_one_held, within=20, what="the other pod Running while one prepare hangs"
            )
            assert held[0] not in fake_plugin.prepared
        finally:
            gate.set()

        async def both_running() -> bool:
            phases = [(p.get("status") or {}).get("phase") for p in await pods(world)]
            return phases == ["Running", "Running"]

        await eventually(both_running, what="both pods Running once the slow prepare answers")


async def test_a_pod_deleted_during_its_prepare_is_unprepared_only_after_the_prepare_answered(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    """A pod's steps never overlap: its unprepare waits for its own prepare in flight."""
    gate = asyncio.Event()
    order: list[str] = []

    async def attach(claim: Any, node: str) -> str:
        order.append(f"prepare-start {claim.uid}")
        await gate.wait()
        order.append(f"prepare-end {claim.uid}")
        return ""

    fake_plugin.attach = attach
    async with running(kube, fake_plugin) as world:
        await publish(world, [_gpu("gpu-0", "sw1")])
        await deploy(world, replicas=1, count=1)
        await eventually(lambda: bool(order), what="the prepare to start")
        await kube.patch(DEPLOYMENTS, "trainer", {"spec": {"replicas": 0}}, world.ns)
        await asyncio.sleep(1.0)  # time for a kubelet that would not wait to unprepare
        assert fake_plugin.unprepared == []
        gate.set()

        async def gone() -> bool:
            return not await pods(world)

        await eventually(gone, what="the pod gone after its unprepare")
        (uid,) = {entry.split()[1] for entry in order}
        assert order == [f"prepare-start {uid}", f"prepare-end {uid}"]
        assert fake_plugin.unprepared == [uid]


class _CancelSwallowingClient:
    """A node client whose NodePrepareResources behaves as grpc's aio unary call does when the
    caller is cancelled: the call runs in a task of its own which catches the cancel and returns
    (``UnaryUnaryCall._invoke``, ``grpc/aio/_call.py``). On Python 3.11 the awaiting task is then
    not cancelled at all; a kubelet that cancelled its pod workers once never stopped."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        async def call() -> dict[str, str]:
            self.entered.set()
            with contextlib.suppress(asyncio.CancelledError):  # swallowed, as the call's own task does
                await asyncio.Event().wait()  # the plugin never answers
            return {c.uid: "the call was cancelled" for c in claims}

        return await asyncio.create_task(call())

    async def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return {c.uid: "" for c in claims}

    async def close(self) -> None:
        return None


async def test_the_control_plane_stops_though_a_prepare_call_swallows_its_cancel(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    client = _CancelSwallowingClient()
    async with running(kube, fake_plugin, client_factory=lambda spec: client) as world:
        await publish(world, [_gpu("gpu-0", "sw1")])
        await deploy(world, replicas=1, count=1)
        await asyncio.wait_for(client.entered.wait(), 20)
    # running() asserts the control plane stopped within STOP_WITHIN of its cancel
