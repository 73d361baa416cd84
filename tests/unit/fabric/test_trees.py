"""Agent trees: the label way and the owner-chain walk, against a hand-made set of objects."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from fabric.bindings.trees import OwnerChains, Root, label_tree, parent_reference
from plumbing.kube.client import ApiError
from plumbing.kube.dra import ResourceClaim


def _obj(kind: str, name: str, uid: str, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "uid": uid, "ownerReferences": owners or []}}


def _ref(api_version: str, kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller}


class Cluster:
    """Objects by (apiVersion, kind, name) in one namespace; counts reads."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.reads = 0
        self.served = {"v1", "batch/v1", "apps/v1", "agents.example.com/v1"}

    def put(self, api_version: str, obj: dict[str, Any]) -> None:
        self.objects[(api_version, obj["kind"], obj["metadata"]["name"])] = obj

    async def fetch(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        assert namespace == "team-a"
        self.reads += 1
        if api_version not in self.served:
            raise LookupError(f"no {kind} in {api_version}")
        return self.objects.get((api_version, kind, name))


def _chain(cluster: Cluster) -> list[dict[str, Any]]:
    """Orchestrator (custom resource) → Job → Pod → (claim): returns the claim's owner references."""
    cluster.put("agents.example.com/v1", _obj("Task", "task-847", "u-task"))
    cluster.put(
        "batch/v1",
        _obj("Job", "worker", "u-job", [_ref("agents.example.com/v1", "Task", "task-847", "u-task")]),
    )
    cluster.put("v1", _obj("Pod", "worker-x", "u-pod", [_ref("batch/v1", "Job", "worker", "u-job")]))
    return [_ref("v1", "Pod", "worker-x", "u-pod")]


def test_label_tree_reads_the_claims_label() -> None:
    claim = ResourceClaim.read(
        {"metadata": {"name": "c", "namespace": "n", "uid": "u", "labels": {"t": "task-1", "e": ""}}}
    )
    assert claim is not None
    assert label_tree(claim, "t") == "task-1"
    assert label_tree(claim, "e") is None
    assert label_tree(claim, "absent") is None


def test_parent_reference_prefers_the_controller() -> None:
    refs = [_ref("v1", "Pod", "a", "1", controller=False), _ref("batch/v1", "Job", "b", "2")]
    assert parent_reference(refs) == refs[1]
    assert parent_reference(refs[:1]) == refs[0]
    assert parent_reference([]) is None


def test_walk_finds_the_root_and_caches() -> None:
    cluster = Cluster()
    refs = _chain(cluster)
    chains = OwnerChains(cluster.fetch, ttl=60.0)
    found = asyncio.run(chains.root_of("team-a", refs))
    assert found.root == Root("agents.example.com/v1", "Task", "task-847", "u-task")
    assert found.root.kind_key == "agents.example.com/Task"
    assert not found.gone and not found.unknown and found.hops == 3
    asyncio.run(chains.root_of("team-a", refs))
    assert cluster.reads == 3  # the second walk came from the cache


def test_root_gone_when_an_owner_is_missing_or_replaced() -> None:
    cluster = Cluster()
    refs = _chain(cluster)
    del cluster.objects[("agents.example.com/v1", "Task", "task-847")]
    found = asyncio.run(OwnerChains(cluster.fetch).root_of("team-a", refs))
    assert found.gone and found.root is not None and found.root.kind == "Job"
    assert found.missing is not None and found.missing.name == "task-847"
    # Same name, another UID: the root the claim's tree had is gone all the same.
    cluster.put("agents.example.com/v1", _obj("Task", "task-847", "u-other"))
    assert asyncio.run(OwnerChains(cluster.fetch).root_of("team-a", refs)).gone


def test_unknown_never_reads_as_gone() -> None:
    cluster = Cluster()
    refs = _chain(cluster)
    cluster.served.discard("agents.example.com/v1")
    found = asyncio.run(OwnerChains(cluster.fetch).root_of("team-a", refs))
    assert found.unknown and not found.gone

    async def forbidden(api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        raise ApiError(403, "Forbidden", "pods is forbidden")

    found = asyncio.run(OwnerChains(forbidden).root_of("team-a", refs))
    assert found.unknown and not found.gone and found.root is None


@pytest.mark.parametrize("depth", [1, 2])
def test_depth_is_bounded(depth: int) -> None:
    cluster = Cluster()
    refs = _chain(cluster)
    found = asyncio.run(OwnerChains(cluster.fetch, max_depth=depth).root_of("team-a", refs))
    assert found.unknown and found.hops == depth


def test_a_claim_without_owners_is_its_own_root() -> None:
    found = asyncio.run(OwnerChains(Cluster().fetch).root_of("team-a", []))
    assert found.root is None and not found.gone and not found.unknown
