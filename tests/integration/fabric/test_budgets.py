"""DeviceBudgets with real processes (docs/budgets.md): the API test server serving the DeviceBudget
CRD of deploy/base, the emulator, and the manager reading both. A budget of 2 ``fabric-gpu``
devices for a label tree: the tree's third claim is refused (409 ``BudgetExceeded``) with a Warning
Event on the claim, admitted once one of the first two is detached; the budget's status shows 2 of
2 and ``LimitReached``; ``fabric-dra budget`` and ``/metrics`` show the same. And attaches of one
tree sent at once never pass its cap."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from manager_api.client import ManagerClient
from manager_api.errors import BudgetExceeded
from manager_api.models import AttachmentState, DeviceType
from plumbing.kube import KubeClient, NotFound
from plumbing.kube.resources import DEVICE_BUDGETS, EVENTS, NAMESPACES, NODES, Resource
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    OPERATOR_TOKEN,
    FabricAdmin,
    allocated_claim,
    manager_args,
)
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.fabric_manager import start_manager
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "deploy" / "base" / "devicebudget-crd.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
NODE = "kind-worker"
TREE_KEY = "agents.example.com/tree"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ApiServerProcess]:
    """An API test server with the DeviceBudget CRD created; skipped where it serves no CRDs."""
    with start_apiserver(tmp_path / "apiserver") as server, server.http() as http:
        crd = yaml.safe_load(CRD_FILE.read_text())
        created = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        if created.status_code == 404:
            pytest.skip("this API test server serves no apiextensions.k8s.io/v1 CustomResourceDefinitions")
        assert created.status_code == 201, created.text
        yield server


def _in_cluster(cluster: ApiServerProcess) -> tuple[str, ...]:
    return ("--kubeconfig", str(cluster.kubeconfig), "--namespace", "fabric-dra")


def budget(name: str, tree: str, max_devices: int) -> dict[str, Any]:
    return {
        "apiVersion": "fabric-dra.io/v1alpha1",
        "kind": "DeviceBudget",
        "metadata": {"name": name},
        "spec": {
            "tree": {"label": {"key": TREE_KEY, "value": tree}},
            "limits": {"devices": [{"deviceClassName": "fabric-gpu", "max": max_devices}]},
        },
    }


async def _targets(address: str) -> dict[str, str]:
    """Device name → the Id the emulator's binding table names it by."""
    async with ManagerClient(address, token=OPERATOR_TOKEN, timeout=30) as client:
        inventory = await client.inventory()
    return {d.name: d.redfish_uri.rstrip("/").rsplit("/", 1)[-1] for d in inventory.devices}


def _on_fabric(fabric: FabricAdmin, targets: dict[str, str], devices: list[str]) -> list[str]:
    """Which of ``devices`` the emulator itself binds (its table, not the manager's word)."""
    bound = fabric.get("/redfish/v1/Oem/FabricDRA/Bindings")["Bindings"]
    names = {b.get("Target") for b in bound} | {b.get("Device") for b in bound}
    return [d for d in devices if targets[d] in names]


async def _gpus(address: str, count: int) -> list[str]:
    """``count`` free GPUs NODE reaches."""
    async with ManagerClient(address, token=OPERATOR_TOKEN, timeout=30) as client:
        inventory = await client.inventory()
    pools = {p.pool: p for p in inventory.pools}
    reach = {g.id: g.nodes for p in inventory.pools for g in p.reach_groups}
    found = [
        d.name
        for d in inventory.devices
        if d.type is DeviceType.GPU
        and d.managed
        and d.node is None
        and NODE in (reach[d.reach] if d.reach else pools[d.pool].nodes)
    ]
    assert len(found) >= count, found
    return found[:count]


async def _setup(cluster: ApiServerProcess, *budgets: dict[str, Any]) -> None:
    async with cluster.client() as kube:
        await kube.create(NAMESPACES, {"metadata": {"name": "fabric-dra"}})
        await kube.create(NODES, {"metadata": {"name": NODE}})
        for body in budgets:
            await kube.create(DEVICE_BUDGETS, body, "default")


async def _claims(cluster: ApiServerProcess, tree: str, devices: list[str]) -> list[str]:
    return [
        await allocated_claim(
            cluster, f"{tree}-{i}", device, NODE, labels={TREE_KEY: tree}, device_class="fabric-gpu"
        )
        for i, device in enumerate(devices)
    ]


async def _status(kube: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return dict((await kube.get(DEVICE_BUDGETS, name, "default")).get("status") or {}) or None
    except NotFound:
        return None


def _cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FABRIC_DRA_TOKEN": OPERATOR_TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "fabric_dra", "budget", "--manager-url", address, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def test_the_third_claim_of_a_tree_waits_for_one_of_the_first_two(
    fabric: FabricAdmin, cluster: ApiServerProcess, tmp_path: Path
) -> None:
    await _setup(cluster, budget("research", "task-847", 2))
    args = manager_args(
        fabric, tmp_path, "--kubeconfig", str(cluster.kubeconfig), "--namespace", "fabric-dra"
    )
    manager = start_manager(tmp_path, fabric.url, args=args, name="m")
    try:
        gpus = await _gpus(manager.address, 3)
        claims = await _claims(cluster, "task-847", gpus)
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:

            async def budget_known() -> bool:
                async with ManagerClient(manager.address, token=OPERATOR_TOKEN) as operator:
                    return bool((await operator.budgets("default")).budgets)

            await eventually(budget_known, what="the manager's view of the budget", within=30)
            for device, claim in zip(gpus[:2], claims[:2], strict=True):
                attached = await client.attach(device, NODE, claim, wait_seconds=20)
                assert attached.state is AttachmentState.ATTACHED
            with pytest.raises(BudgetExceeded) as refused:
                await client.attach(gpus[2], NODE, claims[2], wait_seconds=20)
            assert "DeviceBudget default/research: tree task-847 holds 2 of 2 fabric-gpu devices" in (
                refused.value.message
            )
            targets = await _targets(manager.address)
            assert _on_fabric(fabric, targets, gpus) == gpus[:2]  # the fabric was never asked

            async with cluster.client() as kube:

                async def event() -> dict[str, Any] | None:
                    items, _ = await kube.list_all(EVENTS, "default")
                    return next(
                        (
                            e
                            for e in items
                            if e.get("reason") == "BudgetExceeded"
                            and e.get("regarding", {}).get("name") == "task-847-2"
                        ),
                        None,
                    )

                seen = await eventually(event, what="the BudgetExceeded Event on the third claim", within=20)
                assert seen["type"] == "Warning" and "holds 2 of 2 fabric-gpu devices" in seen["note"]

                async def full() -> dict[str, Any] | None:
                    status = await _status(kube, "research")
                    trees = (status or {}).get("trees") or []
                    return status if trees and trees[0]["used"]["devices"][0]["used"] == 2 else None

                status = await eventually(full, what="the budget's status at 2 of 2", within=20)
            assert status["trees"] == [
                {
                    "tree": "task-847",
                    "used": {"devices": [{"deviceClassName": "fabric-gpu", "used": 2, "max": 2}]},
                    "lastRefused": {
                        "time": status["trees"][0]["lastRefused"]["time"],
                        "claim": "default/task-847-2",
                        "limit": "devices:fabric-gpu",
                    },
                }
            ]
            (condition,) = status["conditions"]
            assert (condition["type"], condition["status"]) == ("LimitReached", "True")
            assert status["observedGeneration"] == 1

            shown = _cli(manager.address, "--namespace", "default")
            assert shown.returncode == 0, shown.stderr
            lines = shown.stdout.splitlines()
            assert lines[0].split() == [
                "NAMESPACE", "BUDGET", "TREE", "LIMIT", "USED", "MAX", "PERCENT", "ENFORCEMENT"
            ]  # fmt: skip
            assert lines[1].split() == [
                "default", "research", "task-847", "devices:fabric-gpu", "2", "2", "100%", "Enforce"
            ]  # fmt: skip
            print(shown.stdout)
            metrics = await _metrics(manager.address)
            labels = {"namespace": "default", "budget": "research", "limit": "devices:fabric-gpu"}
            tree = {**labels, "tree": "task-847"}
            assert metrics[("fabric_dra_budget_used", frozenset(tree.items()))] == 2.0
            assert metrics[("fabric_dra_budget_limit", frozenset(tree.items()))] == 2.0
            assert metrics[("fabric_dra_budget_refusals_total", frozenset(labels.items()))] == 1.0

            # One of the first two ends: the third is admitted.
            await client.detach(gpus[0], NODE, claims[0], wait_seconds=20)
            attached = await client.attach(gpus[2], NODE, claims[2], wait_seconds=20)
            assert attached.state is AttachmentState.ATTACHED
            assert _on_fabric(fabric, targets, gpus) == gpus[1:]
            for device, claim in zip(gpus[1:], claims[1:], strict=True):
                await client.detach(device, NODE, claim, wait_seconds=20)
        bad = _cli(manager.address, "--namespace", "Not_A_Namespace")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    finally:
        manager.stop()


async def _metrics(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the manager's ``/metrics``: (name, labels) → value."""
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.get(f"{address}/metrics", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        answer.raise_for_status()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


async def test_attaches_of_one_tree_sent_at_once_never_pass_its_cap(
    fabric: FabricAdmin, cluster: ApiServerProcess, tmp_path: Path
) -> None:
    await _setup(cluster, budget("burst", "burst", 2))
    args = manager_args(
        fabric, tmp_path, "--kubeconfig", str(cluster.kubeconfig), "--namespace", "fabric-dra"
    )
    manager = start_manager(tmp_path, fabric.url, args=args, name="m")
    try:
        gpus = await _gpus(manager.address, 4)
        claims = await _claims(cluster, "burst", gpus)
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=60) as client:

            async def budget_known() -> bool:
                async with ManagerClient(manager.address, token=OPERATOR_TOKEN) as operator:
                    return bool((await operator.budgets("default")).budgets)

            await eventually(budget_known, what="the manager's view of the budget", within=30)
            answers = await asyncio.gather(
                *(
                    client.attach(device, NODE, claim, wait_seconds=20)
                    for device, claim in zip(gpus, claims, strict=True)
                ),
                return_exceptions=True,
            )
            refused = [a for a in answers if isinstance(a, BudgetExceeded)]
            attached = [a for a in answers if not isinstance(a, BaseException)]
            assert (len(attached), len(refused)) == (2, 2), answers
            bound = _on_fabric(fabric, await _targets(manager.address), gpus)
            assert sorted(bound) == sorted(a.device.name for a in attached), bound
            for held in attached:
                await client.detach(held.device.name, NODE, held.claim_uid, wait_seconds=20)
    finally:
        manager.stop()
