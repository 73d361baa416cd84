"""The stand-in scheduler honours DeviceTaintRules as the real one does through its device taint
tracker (``k8s.io/dynamic-resource-allocation/resourceslice/tracker``): a device a NoSchedule rule
selects is not allocated, unless the claim tolerates the taint. On an API test server of 1.36 with
``DRADeviceTaintRules`` and ``resource.k8s.io/v1beta2`` on; with the gate off the server serves no
rules at all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fabric_dra_testbed.stack import Stack
from plumbing.kube import KubeClient
from plumbing.kube.resources import DEVICE_TAINT_RULES
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_stand_in_cluster import _gpu, claims, deploy, pods, publish, running
from tests.support.waiting import eventually

RULES = DEVICE_TAINT_RULES.with_version("v1beta2")


@pytest.fixture(scope="module")
def apiserver_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 1.36 API test server with DeviceTaintRules served (gate and beta API on)."""
    root = tmp_path_factory.mktemp("apiserver-rules")
    with Stack(root, logs_dir=root) as stack:
        server = stack.apiserver(
            root=root,
            validate_versions="1.36",
            extra_args=[
                *("--allow-anonymous", "--server-version", "1.36.2"),
                *(
                    "--feature-gates",
                    "DRADeviceTaintRules=true",
                    "--runtime-config",
                    "resource.k8s.io/v1beta2=true",
                ),
            ],
        )
        yield server.url


def _rule(name: str, pool: str, device: str, effect: str = "NoSchedule") -> dict[str, Any]:
    return {
        "apiVersion": RULES.api_version,
        "kind": RULES.kind,
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": pool, "device": device},
            "taint": {"key": f"{DRIVER}/drain", "value": "maintenance", "effect": effect},
        },
    }


async def _allocated(world: Any) -> list[str] | None:
    found = [c for c in await claims(world) if (c.get("status") or {}).get("allocation")]
    if not found:
        return None
    return sorted(r["device"] for c in found for r in c["status"]["allocation"]["devices"]["results"])


async def test_the_scheduler_keeps_off_a_device_a_rule_taints(
    kube: KubeClient, fake_plugin: FakePlugin
) -> None:
    async with running(kube, fake_plugin) as world:
        pool = f"fabric-pcie-{world.tag}"
        # Two pairs behind two switches; a rule taints one device of the first pair, so the one
        # pod's two GPUs (matchAttribute switch) must come from the second pair.
        await kube.create(RULES, _rule(f"drain-{world.tag}", pool, "gpu-0"))
        await publish(
            world, [_gpu("gpu-0", "sw1"), _gpu("gpu-1", "sw1"), _gpu("gpu-2", "sw2"), _gpu("gpu-3", "sw2")]
        )
        await deploy(world, replicas=1)
        assert await eventually(lambda: _allocated(world), what="the pod's claim allocated", within=30) == [
            "gpu-2",
            "gpu-3",
        ]

        async def bound() -> bool:
            current = await pods(world)
            return len(current) == 1 and current[0]["spec"].get("nodeName") == world.node

        await eventually(bound, what="the pod bound", within=30)
        await kube.delete(RULES, f"drain-{world.tag}")


async def test_rules_are_not_served_with_the_gate_off(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("apiserver-off")
    with Stack(root, logs_dir=root) as stack:
        server = stack.apiserver(
            root=root,
            extra_args=["--server-version", "1.36.2", "--runtime-config", "resource.k8s.io/v1beta2=true"],
        )
        with server.http() as http:
            listing = http.get("/apis/resource.k8s.io/v1beta2").json()
            assert "devicetaintrules" not in {r["name"] for r in listing["resources"]}
            assert http.get("/apis/resource.k8s.io/v1beta2/devicetaintrules").status_code == 404
        assert isinstance(server.url, str) and httpx.URL(server.url).host
