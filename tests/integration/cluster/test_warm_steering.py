"""Pods steered to warm devices through the real controller and the stand-in scheduler (issue 20).

The controller (a real process, over a stand-in fabric manager) keeps
``warm.<driver>.node-restriction.kubernetes.io/<device type>=<count>`` on each node where the
manager's inventory shows devices of that type warm and no claim is allocated them yet, absent at 0,
touching no key it does not own. A pod carrying docs/manager.md's recipe — a preferred node affinity
(weight 100) with ``Gt 0`` on that key — is placed by the stand-in scheduler, which scores it as
kube-scheduler's ``NodeAffinity`` does, on the node where a GPU is warm, and the allocator gives it
the warm device there; a required node affinity still wins over the preference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_driver.controller.resourcenames import warm_label_key, warm_label_prefix
from dra_driver.controller.slices import warm_node_preference
from fabric_dra_testbed.standins import make_device, make_inventory
from manager_api.models import BindingState, Device, DeviceType
from plumbing.kube import KubeClient
from plumbing.kube.resources import NODES
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_controller_in_cluster import controller_over
from tests.integration.cluster.test_stand_in_cluster import World, running
from tests.integration.cluster.test_warm_publication import create_gpu_template, run_pod
from tests.support.waiting import eventually

GPU_KEY = warm_label_key(DRIVER, "gpu")
NVME_KEY = warm_label_key(DRIVER, "nvme")
#: another controller's key (``--publisher other``): never this controller's to touch
FOREIGN_KEY = warm_label_key(DRIVER, "gpu", "other")


async def warm_labels(world: World) -> dict[str, dict[str, str]]:
    """Node → its warm-count labels (``warm_label_prefix``), for this test's nodes."""
    items, _ = await world.kube.list_all(NODES)
    return {
        n["metadata"]["name"]: {
            k: v
            for k, v in (n["metadata"].get("labels") or {}).items()
            if k.startswith(warm_label_prefix(DRIVER) + "/")
        }
        for n in items
        if n["metadata"]["name"] in world.nodes
    }


def steered(*required_nodes: str) -> dict[str, Any]:
    """The recipe, kept to ``required_nodes`` (this test's nodes: the API server is shared)."""
    hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": list(required_nodes)}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [hostname]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [warm_node_preference(DRIVER, "gpu")],
        }
    }


async def test_warm_counts_label_the_nodes_and_steer_pods_to_the_warm_device(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    async with running(kube, fake_plugin, nodes=3) as world:
        pool = f"fp-{world.tag}"
        first, second, third = world.nodes
        # A stale count of ours and another publisher's key, set before the controller starts.
        await kube.patch(NODES, first, {"metadata": {"labels": {GPU_KEY: "9", FOREIGN_KEY: "5"}}})
        devices = [make_device(f"gpu-{i}", pool=pool, switch="sw1") for i in range(4)]
        devices.append(make_device("nvme-0", pool=pool, switch="sw1", type=DeviceType.NVME))
        # gpu-3 (last in name order) warm on the third node (last by name), nvme-0 on the second
        devices[3].state, devices[3].node = BindingState.WARM, third
        devices[4].state, devices[4].node = BindingState.WARM, second
        inventory = make_inventory(devices, pools={pool: world.nodes})
        async with controller_over(world, apiserver_url, tmp_path, inventory) as publishing:

            async def labelled(want: dict[str, dict[str, str]]) -> bool:
                return await warm_labels(world) == want

            first_counts = {first: {FOREIGN_KEY: "5"}, second: {NVME_KEY: "1"}, third: {GPU_KEY: "1"}}
            await eventually(lambda: labelled(first_counts), what="the warm counts", within=30)

            await create_gpu_template(world)
            # Without the preference the stand-in would take the first node (no pods anywhere,
            # then by name); NodeAffinity's 200 points send the pod where gpu-3 is warm.
            assert await run_pod(world, "steered", affinity=steered(*world.nodes)) == (third, "gpu-3")
            # gpu-3 is allocated: no longer counted, although the inventory still shows it warm
            # (the fake plugin prepares nothing with the manager)
            taken = {first: {FOREIGN_KEY: "5"}, second: {NVME_KEY: "1"}, third: {}}
            await eventually(lambda: labelled(taken), what="the allocated warm GPU uncounted", within=30)
            # A required node affinity is a Filter: the preference cannot override it.
            assert await run_pod(world, "required", affinity=steered(first)) == (first, "gpu-0")

            # The manager reports gpu-3 claimed (a warm hit) and two GPUs warm on the second node:
            # the third node's key goes, the second's counts 2.
            def moved(current: list[Device]) -> list[Device]:
                out = []
                for device in current:
                    if device.name == "gpu-3":
                        device = device.model_copy(update={"state": BindingState.BOUND, "claim_uid": "u3"})
                    elif device.name in ("gpu-1", "gpu-2"):
                        device = device.model_copy(update={"state": BindingState.WARM, "node": second})
                    out.append(device)
                return out

            publishing.manager.update_devices(moved)
            second_counts = {first: {FOREIGN_KEY: "5"}, second: {NVME_KEY: "1", GPU_KEY: "2"}, third: {}}
            await eventually(lambda: labelled(second_counts), what="the new warm counts", within=30)
            node, device = await run_pod(world, "steered-again", affinity=steered(*world.nodes))
            assert (node, device in ("gpu-1", "gpu-2")) == (second, True)
