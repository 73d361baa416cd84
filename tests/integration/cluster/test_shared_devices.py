"""Shared devices through the stand-in control plane and the API test server (a real process):
consumable capacity (two claims on one ``allowMultipleAllocations`` device, a third refused until
one lets go) and shared counters (a device of one node's slice holds counters that a device of
another node's slice needs)."""

from __future__ import annotations

import re
from typing import Any

from plumbing.kube import KubeClient
from plumbing.kube.dra import is_allocated
from plumbing.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_stand_in_cluster import World, claims, pods, publish, reasons, running
from tests.support.waiting import eventually

SHARE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


async def claims_and_pods(world: World, requests: list[dict[str, Any]], start: int = 0) -> None:
    """Claim ``claim-i`` with the i-th request and pod ``pod-i`` using it, numbered from ``start``."""
    for i, request in enumerate(requests, start=start):
        body = {
            "metadata": {"name": f"claim-{i}", "namespace": world.ns},
            "spec": {"devices": {"requests": [request]}},
        }
        await world.kube.create(RESOURCE_CLAIMS, body, world.ns)
        pod = {
            "metadata": {"name": f"pod-{i}", "namespace": world.ns},
            "spec": {
                "resourceClaims": [{"name": "accel", "resourceClaimName": f"claim-{i}"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "accel"}]}}
                ],
            },
        }
        await world.kube.create(PODS, pod, world.ns)


async def allocations(world: World) -> dict[str, list[dict[str, Any]]]:
    return {
        c["metadata"]["name"]: c["status"]["allocation"]["devices"]["results"]
        for c in await claims(world)
        if is_allocated(c)
    }


async def phases(world: World) -> dict[str, str]:
    return {p["metadata"]["name"]: (p.get("status") or {}).get("phase", "Pending") for p in await pods(world)}


async def test_two_claims_share_one_device_and_a_third_waits_for_capacity(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    pool = {
        "name": "cxl-pool-1",
        "attributes": {"type": {"string": "gpu"}},
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "256Gi",
                "requestPolicy": {"default": "64Gi", "validRange": {"min": "64Gi", "step": "64Gi"}},
            }
        },
    }
    async with running(kube, fake_plugin) as world:
        await publish(world, [pool])
        share = {
            "name": "mem",
            "exactly": {"deviceClassName": world.device_class, "capacity": {"requests": {"memory": "96Gi"}}},
        }
        await claims_and_pods(world, [share, share, share])

        async def two_running_one_refused() -> dict[str, list[dict[str, Any]]] | None:
            refused = any(
                r == "FailedScheduling" and "cannot allocate all claims" in n for r, n in await reasons(world)
            )
            now = await phases(world)
            if refused and sorted(now.values()) == ["Pending", "Running", "Running"]:
                return await allocations(world)
            return None

        held = await eventually(
            two_running_one_refused, what="two pods sharing the device, the third refused"
        )
        assert sorted(held) == ["claim-0", "claim-1"]
        results = [r for claim in held.values() for r in claim]
        assert [r["device"] for r in results] == ["cxl-pool-1", "cxl-pool-1"]
        # 96Gi rounded up by the requestPolicy (min 64Gi, step 64Gi): two shares fill 256Gi
        assert [r["consumedCapacity"] for r in results] == [{"memory": "128Gi"}, {"memory": "128Gi"}]
        share_ids = [r["shareID"] for r in results]
        assert all(SHARE_ID.fullmatch(s) for s in share_ids) and share_ids[0] != share_ids[1]

        await kube.delete(PODS, "pod-0", world.ns)

        async def third_gets_the_freed_share() -> dict[str, list[dict[str, Any]]] | None:
            now = await allocations(world)
            return (
                now
                if sorted(now) == ["claim-1", "claim-2"] and (await phases(world)).get("pod-2") == "Running"
                else None
            )

        held = await eventually(
            third_gets_the_freed_share, within=30, what="pod-2 running on pod-0's released share"
        )
        assert held["claim-2"][0]["consumedCapacity"] == {"memory": "128Gi"}
        assert held["claim-2"][0]["shareID"] not in share_ids


async def test_counters_are_counted_across_the_nodes_of_a_pool(
    kube: KubeClient, fake_plugin: FakePlugin, second_fake_plugin: FakePlugin
) -> None:
    """gpu-0 (80Gi of memory counters) can serve half-a on node A or half-b on node B, 60Gi each:
    once half-a is allocated, half-b would over-commit the GPU, though it is node B's only device
    and nothing on node B holds it."""
    async with running(kube, [fake_plugin, second_fake_plugin], nodes=2) as world:
        node_a, node_b = world.nodes
        pool_name = f"gpu-pool-{world.tag}"
        pool = {"name": pool_name, "generation": 1, "resourceSliceCount": 3}
        selector = {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "fabric-dra.io/test", "operator": "In", "values": [world.tag]}]}
            ]
        }

        def half(name: str) -> dict[str, Any]:
            return {
                "name": name,
                "attributes": {"type": {"string": "gpu"}},
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "60Gi"}}}],
            }

        slices: list[dict[str, Any]] = [
            {
                "metadata": {"name": f"{pool_name}-counters"},
                "spec": {
                    "driver": DRIVER,
                    "pool": pool,
                    "nodeSelector": selector,
                    "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}],
                },
            },
            {
                "metadata": {"name": f"{pool_name}-a"},
                "spec": {
                    "driver": DRIVER,
                    "pool": pool,
                    "nodeName": node_a,
                    "devices": [half("gpu-0-half-a")],
                },
            },
            {
                "metadata": {"name": f"{pool_name}-b"},
                "spec": {
                    "driver": DRIVER,
                    "pool": pool,
                    "nodeName": node_b,
                    "devices": [half("gpu-0-half-b")],
                },
            },
        ]
        try:
            for body in slices:
                await kube.create(RESOURCE_SLICES, body)
            one = {"name": "gpu", "exactly": {"deviceClassName": world.device_class}}
            await claims_and_pods(world, [one])

            async def first_placed() -> dict[str, Any] | None:
                results = (await allocations(world)).get("claim-0")
                return results[0] if results else None

            first = await eventually(first_placed, what="the first claim allocated")
            await claims_and_pods(world, [one], start=1)

            async def second_refused() -> bool:
                notes = [n for r, n in await reasons(world) if r == "FailedScheduling"]
                refused = any("cannot allocate all claims" in n for n in notes)
                return refused and "claim-1" not in await allocations(world)

            await eventually(second_refused, what="the second claim refused: the GPU's counters are taken")
            assert (await phases(world))["pod-1"] == "Pending"

            await kube.delete(PODS, "pod-0", world.ns)

            async def second_running() -> bool:
                return "claim-1" in await allocations(world) and (await phases(world))["pod-1"] == "Running"

            await eventually(second_running, within=30, what="pod-1 running once pod-0 let the GPU go")
            assert first["device"] in {"gpu-0-half-a", "gpu-0-half-b"}
        finally:
            for body in slices:
                await kube.delete_ignore_missing(RESOURCE_SLICES, body["metadata"]["name"])
