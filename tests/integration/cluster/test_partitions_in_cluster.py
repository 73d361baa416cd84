"""GPU partitions through the stand-in control plane: the controller (a real process, with binding
conditions, over the manager stand-in) publishes one partitionable GPU to two nodes; the stand-in
scheduler spreads two pods, each with its own partition claim, over both nodes from one view of
the pool. The manager binds the GPU to the node of the first attach and refuses the other node,
whose pod fails its binding condition and is scheduled again — onto the GPU's node, the only one
still offered its placements. Never one GPU on two nodes, never a placement twice, no pod stuck."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from manager_api.partitions import BUILTIN_TABLES
from plumbing.kube import KubeClient
from plumbing.kube.resources import DEVICE_CLASSES, EVENTS, PODS, RESOURCE_CLAIMS
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_controller_in_cluster import controller_over
from tests.integration.cluster.test_stand_in_cluster import World, claims, pods, running
from tests.support.controller import make_device, make_inventory
from tests.support.waiting import eventually


async def partition_claims_and_pods(world: World, device_class: str, count: int) -> None:
    """``count`` claims of one 1g.10gb partition each, then a pod per claim, created back to back
    so that one scheduling pass sees them all."""
    selector = f'device.attributes["{DRIVER}"].partition == "1g.10gb"'
    for i in range(count):
        await world.kube.create(
            RESOURCE_CLAIMS,
            {
                "metadata": {"name": f"slice-{i}", "namespace": world.ns},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "slice",
                                "exactly": {
                                    "deviceClassName": device_class,
                                    "selectors": [{"cel": {"expression": selector}}],
                                },
                            }
                        ]
                    }
                },
            },
            world.ns,
        )
    for i in range(count):
        await world.kube.create(
            PODS,
            {
                "metadata": {"name": f"agent-{i}", "namespace": world.ns},
                "spec": {
                    "resourceClaims": [{"name": "slice", "resourceClaimName": f"slice-{i}"}],
                    "containers": [
                        {"name": "agent", "image": "busybox", "resources": {"claims": [{"name": "slice"}]}}
                    ],
                },
            },
            world.ns,
        )


async def test_two_pods_racing_for_one_gpus_partitions_both_run_on_the_gpus_node(
    kube: KubeClient,
    fake_plugin: FakePlugin,
    second_fake_plugin: FakePlugin,
    apiserver_url: str,
    tmp_path: Path,
) -> None:
    async with running(kube, [fake_plugin, second_fake_plugin], nodes=2) as world:
        device_class = f"fabric-gpu-partition-{world.tag}"
        expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu-partition"'
        await kube.create(
            DEVICE_CLASSES,
            {
                "metadata": {"name": device_class},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            },
        )
        pool = f"fp-{world.tag}"
        inventory = make_inventory(
            [make_device("gpu0", pool=pool, partition_table=BUILTIN_TABLES["h100-80gb"])],
            pools={pool: world.nodes},
        )
        try:
            async with controller_over(
                world, apiserver_url, tmp_path, inventory, "--binding-conditions", "--busy-timeout", "60"
            ) as publishing:
                started = time.monotonic()
                await partition_claims_and_pods(world, device_class, 2)

                async def both_running() -> list[Any] | None:
                    current = await pods(world)
                    if [(p.get("status") or {}).get("phase") for p in current] != ["Running", "Running"]:
                        return None
                    return current

                current = await eventually(both_running, what="both pods Running", within=30)
                elapsed = time.monotonic() - started
                assert isinstance(current, list)
                (gpu,) = publishing.manager.inventory.devices
                pod_nodes = {p["spec"]["nodeName"] for p in current}
                assert pod_nodes == {gpu.node}, (pod_nodes, gpu.node)
                assert {h.node for h in gpu.partitions} == {gpu.node} and len(gpu.partitions) == 2
                devices = [
                    r["device"]
                    for c in await claims(world)
                    for r in c["status"]["allocation"]["devices"]["results"]
                ]
                assert len(set(devices)) == 2 and {h.partition for h in gpu.partitions} == set(devices)
                # every attach the manager answered for the other node was refused, never bound
                other = set(world.nodes) - {gpu.node}
                tried_elsewhere = [c for c in publishing.manager.attach_calls if c[1] in other]
                events, _ = await kube.list_all(EVENTS, world.ns)
                rescheduled = [e for e in events if e.get("reason") == "FailedBinding"]
                assert len(rescheduled) == len(tried_elsewhere)
                print(
                    f"two partition pods on one GPU: both Running on {gpu.node} {elapsed:.1f}s after "
                    f"creation; {len(tried_elsewhere)} attach(es) for the other node refused and rescheduled"
                )
        finally:
            await kube.delete_ignore_missing(DEVICE_CLASSES, device_class)
