"""Claims an orchestrator left behind: the manager finds claims holding devices whose agent tree's
root is gone and that no pod uses, reports them (API, metric, Event, ``fabric-dra status``) and, with
``--orphaned-trees release``, releases their devices — never a claim a running pod still holds.

Real processes: the API test server, the TLS emulator, ``fabric-dra manager serve`` with
``--kubeconfig``. The API test server runs no garbage collector, so a deleted root leaves its pods
and claims as a crashed orchestrator whose objects were orphaned (``propagationPolicy: Orphan``)
does; a pod with a finalizer stays ``Terminating`` after its deletion, as on a node that is gone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from manager_api.client import ManagerClient
from manager_api.models import OrphanedTreeClaims
from plumbing.kube.client import KubeClient
from plumbing.kube.resources import DEPLOYMENTS, EVENTS, NODES, PODS, RESOURCE_CLAIMS
from tests.integration.fabric.conftest import CONTROLLER_TOKEN, OPERATOR_TOKEN, FabricAdmin, manager_args
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.fabric_manager import start_manager

TREE_LABEL = "agents.example.com/tree"
NODE = "kind-worker3"
GRACE = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("apiserver")) as server:

        async def node() -> None:
            async with server.client() as kube:
                await kube.create(NODES, {"metadata": {"name": NODE}})  # the host of the same name

        asyncio.run(node())
        yield server


def _deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }


def _ref(obj: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


async def _worker(
    kube: KubeClient,
    name: str,
    device: str,
    *,
    root: dict[str, Any] | None = None,
    tree: str | None = None,
    stuck: bool = False,
) -> str:
    """A pod (owned by ``root``; with a finalizer when it is to hang in Terminating) and its claim,
    owned by the pod as a template's claim is, allocated ``device`` and reserved for the pod."""
    pod_meta: dict[str, Any] = {"name": f"{name}-pod", "namespace": "default"}
    if root is not None:
        pod_meta["ownerReferences"] = [_ref(root, "apps/v1", "Deployment")]
    if stuck:
        pod_meta["finalizers"] = ["example.com/node-gone"]
    pod = await kube.create(
        PODS, {"metadata": pod_meta, "spec": {"containers": [{"name": "c", "image": "x"}]}}, "default"
    )
    claim_meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "ownerReferences": [_ref(pod, "v1", "Pod")],
    }
    if tree is not None:
        claim_meta["labels"] = {TREE_LABEL: tree}
    claim = await kube.create(
        RESOURCE_CLAIMS,
        {
            "metadata": claim_meta,
            "spec": {
                "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "fabric-dev"}}]}
            },
        },
        "default",
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "dev", "driver": "fabric-dra.io", "pool": "fabric-pcie", "device": device}
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }
    await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
    return str(claim["metadata"]["uid"])


async def _wait_for(client: ManagerClient, names: set[str], within: float = 20.0) -> OrphanedTreeClaims:
    deadline = time.monotonic() + within
    while True:
        found = await client.orphaned_trees()
        if {c.name for c in found.claims} == names:
            return found
        assert time.monotonic() < deadline, (
            f"orphaned tree claims {[c.name for c in found.claims]}, wanted {names}"
        )
        await asyncio.sleep(0.2)


def _args(fabric: FabricAdmin, work: Path, cluster: ApiServerProcess, policy: str) -> list[str]:
    return manager_args(
        fabric,
        work,
        *("--kubeconfig", str(cluster.kubeconfig), "--namespace", "default"),
        *("--orphaned-trees", policy, "--orphaned-tree-grace-seconds", str(GRACE)),
        *("--orphan-interval-seconds", "0.3", "--orphan-grace-seconds", "0"),
        *("--tree-root-label", f"{TREE_LABEL}=apps/v1/Deployment"),
        *("--plugin-report-ttl-seconds", "0.5"),
    )


async def test_orphaned_trees_are_reported_and_only_unused_ones_released(
    cluster: ApiServerProcess, fabric: FabricAdmin, tmp_path: Path
) -> None:
    async with cluster.client() as kube:
        root_a = await kube.create(DEPLOYMENTS, _deployment("orchestrator-a"), "default")
        root_c = await kube.create(DEPLOYMENTS, _deployment("orchestrator-c"), "default")
        await kube.create(DEPLOYMENTS, _deployment("task-b"), "default")
        uids = {
            # by owner chain: claim → pod (will hang Terminating) → Deployment orchestrator-a
            "claim-a": await _worker(kube, "claim-a", "nvme0", root=root_a, stuck=True),
            # by label: the tree's root is the Deployment named by the label; the pod will go
            "claim-b": await _worker(kube, "claim-b", "nvme1", tree="task-b"),
            # its root stays: never an orphan
            "claim-c": await _worker(kube, "claim-c", "gpu0", root=root_c),
            # its root never existed, but its pod runs: never released, never reported
            "claim-d": await _worker(kube, "claim-d", "gpu1", tree="task-d-gone"),
        }
    devices = {"claim-a": "nvme0", "claim-b": "nvme1", "claim-c": "gpu0", "claim-d": "gpu1"}
    manager = start_manager(tmp_path, fabric.url, args=_args(fabric, tmp_path, cluster, "report"))
    try:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN) as client:
            for name, device in devices.items():
                await client.attach(device, NODE, uids[name], wait_seconds=20)
            await asyncio.sleep(GRACE * 2)
            assert (await client.orphaned_trees()).claims == []  # every root there, or a pod running
            async with cluster.client() as kube:
                await kube.delete(DEPLOYMENTS, "orchestrator-a", "default")
                await kube.delete(PODS, "claim-a-pod", "default")  # hangs: its finalizer
                await kube.delete(DEPLOYMENTS, "task-b", "default")
                await kube.delete(PODS, "claim-b-pod", "default")  # gone
            found = await _wait_for(client, {"claim-a", "claim-b"})
            assert found.policy == "report"
            by_name = {c.name: c for c in found.claims}
            assert by_name["claim-a"].reason == "root-gone-pods-terminating"
            assert by_name["claim-a"].root == "Deployment orchestrator-a"
            assert "Terminating since" in by_name["claim-a"].pods[0]
            assert by_name["claim-b"].reason == "root-gone-pods-gone"
            assert by_name["claim-b"].root == "Deployment task-b"
            # report only: every device stays bound
            assert set(fabric.bound_hosts()) >= set(devices.values())
            async with httpx.AsyncClient(
                timeout=10, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
            ) as http:
                metrics = (await http.get(f"{manager.address}/metrics")).text
            assert (
                'fabric_dra_orphaned_tree_claims{namespace="default",reason="root-gone-pods-terminating"} 1.0'
                in metrics
            )
            assert (
                'fabric_dra_orphaned_tree_claims{namespace="default",reason="root-gone-pods-gone"} 1.0'
                in metrics
            )
            status = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "fabric_dra", "status", "--manager-url", manager.address],
                env={**os.environ, "FABRIC_DRA_TOKEN": OPERATOR_TOKEN},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert status.returncode == 0, status.stderr
            assert "ORPHANED AGENT TREES (policy report)" in status.stdout
            assert "default/claim-a  root-gone-pods-terminating  Deployment orchestrator-a" in status.stdout
        async with cluster.client() as kube:
            events, _ = await kube.list_all(EVENTS, "default")
        reported = {e["regarding"]["name"] for e in events if e.get("reason") == "OrphanedAgentTree"}
        assert reported == {"claim-a", "claim-b"}
    finally:
        manager.stop()

    # The same cluster under --orphaned-trees release: what no pod uses goes back to the pool.
    manager = start_manager(tmp_path, fabric.url, args=_args(fabric, tmp_path, cluster, "release"))
    try:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN) as client:
            deadline = time.monotonic() + 30
            while {"nvme0", "nvme1"} & set(fabric.bound_hosts()):
                assert time.monotonic() < deadline, f"not released: {fabric.bound_hosts()}"
                await asyncio.sleep(0.2)
            await asyncio.sleep(GRACE * 2)
            bound = fabric.bound_hosts()
            assert bound.get("gpu0") and bound.get("gpu1"), bound  # a live root, a running pod
            for name in ("claim-c", "claim-d"):
                await client.detach(devices[name], NODE, uids[name], wait_seconds=20)
        async with cluster.client() as kube:
            events, _ = await kube.list_all(EVENTS, "default")
        released = {e["regarding"]["name"] for e in events if e.get("reason") == "OrphanedAgentTreeReleased"}
        assert released == {"claim-a", "claim-b"}
    finally:
        manager.stop()
