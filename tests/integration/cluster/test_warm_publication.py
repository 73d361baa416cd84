"""Warm devices through the real controller and the stand-in scheduler (issue 20, step 5).

The controller (a real process, over a stand-in fabric manager) publishes a device that the
manager's inventory shows warm on node N in a node-local slice (``nodeName: N``) of its pool,
marked ``warm: true`` and listed before the pool's shared slice. The stand-in scheduler, which
follows the real allocator's first-fit rules and has no preference of ours, then:

- never allocates a warm device to a pod on another node (it is not in that node's view);
- allocates the warm device to a pod placed on its node, although in name order it comes last;

and when the manager reports the device claimed, the controller moves it back to the shared slice
in place (the nodes keep their now empty node-local slices, the pool its generation; no device
twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabric_dra_testbed.standins import make_device, make_inventory
from manager_api.models import BindingState, Device
from plumbing.kube import KubeClient
from plumbing.kube.resources import PODS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_controller_in_cluster import controller_over
from tests.integration.cluster.test_stand_in_cluster import World, claims, pods, running
from tests.support.waiting import eventually

WARM = f"{DRIVER}/warm"


async def pool_slices(world: World) -> list[dict[str, Any]]:
    items, _ = await world.kube.list_all(RESOURCE_SLICES)
    return sorted(
        (s for s in items if s["spec"]["pool"]["name"] == f"fp-{world.tag}"),
        key=lambda s: s["metadata"]["name"],
    )


def layout(slices: list[dict[str, Any]]) -> list[tuple[str | None, list[str]]]:
    """(nodeName or None for the shared slice, devices with * for warm ones) per slice."""
    return [
        (
            s["spec"].get("nodeName"),
            [
                d["name"] + ("*" if WARM in (d.get("attributes") or {}) else "")
                for d in s["spec"].get("devices") or []
            ],
        )
        for s in slices
    ]


async def create_gpu_template(world: World) -> None:
    """The ResourceClaimTemplate ``one-gpu``: one device of the world's GPU class."""
    request = {"name": "gpu", "exactly": {"deviceClassName": world.device_class}}
    await world.kube.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "one-gpu", "namespace": world.ns},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        },
        world.ns,
    )


async def run_pod(world: World, name: str, **spec: Any) -> tuple[str, str]:
    """A pod asking for one GPU through ``one-gpu``, with ``spec`` added; (its node, the device it
    got) once Running."""
    await world.kube.create(
        PODS,
        {
            "metadata": {"name": name, "namespace": world.ns},
            "spec": {
                **spec,
                "resourceClaims": [{"name": "accel", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "accel"}]}}
                ],
            },
        },
        world.ns,
    )

    async def allocated() -> tuple[str, str] | None:
        pod = next((p for p in await pods(world) if p["metadata"]["name"] == name), None)
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            return None
        for claim in await claims(world):
            owners = [o.get("name") for o in claim["metadata"].get("ownerReferences") or []]
            if name in owners:
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                return str(pod["spec"]["nodeName"]), str(result["device"])
        return None

    node, device = await eventually(allocated, what=f"pod {name} Running", within=60)
    return str(node), str(device)


async def run_pod_on(world: World, name: str, node: str) -> str:
    """A pod asking for one GPU, placed on ``node`` by its nodeSelector; the device it got, once Running."""
    placed, device = await run_pod(world, name, nodeSelector={"kubernetes.io/hostname": node})
    assert placed == node
    return device


async def test_a_warm_device_goes_to_the_pod_on_its_node_and_back_to_the_shared_slice_when_claimed(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    async with running(kube, fake_plugin, nodes=3) as world:
        pool = f"fp-{world.tag}"
        first, second, third = world.nodes
        # gpu-0 warm on the third node, gpu-2 warm on the second: in name order (the order of a
        # shared slice, which the allocator takes first-fit) each would be chosen last or first
        # for the wrong node.
        devices = [make_device(f"gpu-{i}", pool=pool, switch="sw1") for i in range(3)]
        devices[0].state, devices[0].node = BindingState.WARM, third
        devices[2].state, devices[2].node = BindingState.WARM, second
        inventory = make_inventory(devices, pools={pool: world.nodes})
        async with controller_over(world, apiserver_url, tmp_path, inventory) as publishing:

            async def published() -> list[tuple[str | None, list[str]]] | None:
                found = layout(await pool_slices(world))
                return found if len(found) == 3 else None

            # node-local slices first (by node), then the shared one; every device exactly once
            assert await eventually(published, what="the warm slices", within=30) == [
                (second, ["gpu-2*"]),
                (third, ["gpu-0*"]),
                (None, ["gpu-1"]),
            ]
            stored = await pool_slices(world)
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {3}
            assert len({s["spec"]["pool"]["generation"] for s in stored}) == 1

            await create_gpu_template(world)
            # The second node sees its warm gpu-2 and the shared gpu-1: it meets gpu-2 first.
            assert await run_pod_on(world, "on-second", second) == "gpu-2"
            # The first node does not see gpu-0 (warm on the third), the first name of the pool.
            assert await run_pod_on(world, "on-first", first) == "gpu-1"

            # The manager reports gpu-2 claimed (a warm hit) and gpu-0 cooled: both go back to
            # the shared slice, in place: the node-local slices stay, empty, and so does the
            # pool's generation.
            def claimed(current: list[Device]) -> list[Device]:
                out = []
                for device in current:
                    if device.name == "gpu-2":
                        device = device.model_copy(update={"state": BindingState.BOUND, "claim_uid": "u2"})
                    elif device.name == "gpu-0":
                        device = device.model_copy(update={"state": BindingState.FREE, "node": None})
                    out.append(device)
                return out

            publishing.manager.update_devices(claimed)

            async def moved_back() -> list[dict[str, Any]] | None:
                current = await pool_slices(world)
                back = [(second, []), (third, []), (None, ["gpu-0", "gpu-1", "gpu-2"])]
                return current if layout(current) == back else None

            *emptied, shared = await eventually(moved_back, what="all in the shared slice again", within=30)
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in [*emptied, shared]} == {3}
            generations = {s["spec"]["pool"]["generation"] for s in [*emptied, shared]}
            assert generations == {stored[0]["spec"]["pool"]["generation"]}
            assert "nodeSelector" in shared["spec"]
