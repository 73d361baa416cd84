"""A device whose attach fails every time: the stand-in scheduler, like the real one, allocates it
again after every AttachFailed; the controller takes it out of allocation after three failures
(an attach-failed taint) and the pod runs on another device — within 30 s (issue 16, defect 2)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fabric_dra.stack import Stack
from fabric_dra.standins import InventoryServer, make_device, make_inventory
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from plumbing.kube import KubeClient
from plumbing.kube.resources import EVENTS, RESOURCE_SLICES
from tests.integration.cluster.conftest import DRIVER, FakePlugin, eventually
from tests.integration.cluster.test_stand_in_cluster import claims, deploy, pods, running


async def test_a_device_failing_every_attach_is_tainted_and_the_pod_runs_on_another(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str, tmp_path: Path
) -> None:
    async with running(kube, fake_plugin) as world:
        # gpu-0 is first in the allocator's order and fails every attach.
        devices = [make_device(f"gpu-{i}", pool=f"fp-{world.tag}", switch="sw1") for i in range(3)]
        inventory = make_inventory(devices, pools={f"fp-{world.tag}": [world.node]})
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, apiserver_url)
        with InventoryServer(inventory) as manager, Stack(tmp_path / "s", logs_dir=tmp_path) as stack:
            manager.fail_every_attach["gpu-0"] = "BindFailed"
            stack.controller(
                None,
                kubeconfig,
                args=["--manager-url", manager.url, "--driver-name", DRIVER, "--binding-conditions"],
            )

            async def published() -> bool:
                items, _ = await kube.list_all(RESOURCE_SLICES)
                return any(s["spec"]["pool"]["name"] == f"fp-{world.tag}" for s in items)

            await eventually(published, what="the controller's pool", within=30)
            started = time.monotonic()
            await deploy(world, replicas=1, count=1)

            async def running_on() -> list[Any] | None:
                current = await pods(world)
                if [(p.get("status") or {}).get("phase") for p in current] != ["Running"]:
                    return None
                return [
                    r["device"]
                    for c in await claims(world)
                    for r in c["status"]["allocation"]["devices"]["results"]
                ]

            got = await eventually(running_on, what="the pod Running on a working device", within=30)
            elapsed = time.monotonic() - started
            assert got == ["gpu-1"], got
            attempts = [c for c in manager.attach_calls if c[0] == "gpu-0"]
            assert len(attempts) >= 3  # the scheduler allocated gpu-0 again after each failure
            items, _ = await kube.list_all(RESOURCE_SLICES)
            taints = [
                t
                for s in items
                if s["spec"]["pool"]["name"] == f"fp-{world.tag}"
                for d in s["spec"]["devices"]
                if d["name"] == "gpu-0"
                for t in d.get("taints") or []
            ]
            assert [(t["key"], t["effect"]) for t in taints] == [(f"{DRIVER}/attach-failed", "NoSchedule")]
            events, _ = await kube.list_all(EVENTS, world.ns)
            assert any(e.get("reason") == "DeviceQuarantined" for e in events)
            print(f"failing device: pod Running on another device {elapsed:.1f}s after the Deployment")
