"""Lists over real HTTP: pagination with consistent snapshots, label and field selectors."""

from __future__ import annotations

import pytest

from plumbing.kube import ApiError, KubeClient
from plumbing.kube.resources import CONFIGMAPS, PODS, RESOURCE_SLICES
from tests.unit.kube_standin.objects import resource_slice


async def test_pages_follow_the_first_pages_snapshot(mkube: KubeClient, ns: str) -> None:
    for i in range(7):
        await mkube.create(
            CONFIGMAPS, {"metadata": {"name": f"cm-{i}", "namespace": ns}, "data": {"v": "old"}}
        )
    first = await mkube.list(CONFIGMAPS, ns, limit=3)
    assert [o["metadata"]["name"] for o in first["items"]] == ["cm-0", "cm-1", "cm-2"]
    assert first["metadata"]["remainingItemCount"] == 4
    # Changes after the first page do not show in the next ones (etcd's consistent pagination).
    await mkube.patch(CONFIGMAPS, "cm-5", {"data": {"v": "new"}}, ns)
    await mkube.delete(CONFIGMAPS, "cm-6", ns)
    await mkube.create(CONFIGMAPS, {"metadata": {"name": "cm-9", "namespace": ns}})
    second = await mkube.list(CONFIGMAPS, ns, limit=3, continue_token=first["metadata"]["continue"])
    third = await mkube.list(CONFIGMAPS, ns, limit=3, continue_token=second["metadata"]["continue"])
    rest = second["items"] + third["items"]
    assert [(o["metadata"]["name"], o["data"]["v"]) for o in rest] == [
        ("cm-3", "old"),
        ("cm-4", "old"),
        ("cm-5", "old"),
        ("cm-6", "old"),
    ]
    assert "continue" not in third["metadata"]
    assert third["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    items, _ = await mkube.list_all(CONFIGMAPS, ns, page_size=2)
    assert [o["metadata"]["name"] for o in items] == ["cm-0", "cm-1", "cm-2", "cm-3", "cm-4", "cm-5", "cm-9"]
    assert all("kind" not in o and "apiVersion" not in o for o in items)  # as a real server lists them


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("tier=gpu", ["a", "b"]),
        ("tier!=gpu", ["c", "d"]),
        ("tier in (gpu,nic)", ["a", "b", "c"]),
        ("tier notin (gpu)", ["c", "d"]),
        ("zone", ["a", "c"]),
        ("!zone", ["b", "d"]),
        ("tier=gpu,zone=z1", ["a"]),
    ],
)
async def test_label_selectors(mkube: KubeClient, ns: str, selector: str, names: list[str]) -> None:
    labels = {
        "a": {"tier": "gpu", "zone": "z1"},
        "b": {"tier": "gpu"},
        "c": {"tier": "nic", "zone": "z2"},
        "d": {},
    }
    for name, these in labels.items():
        await mkube.create(CONFIGMAPS, {"metadata": {"name": name, "namespace": ns, "labels": these}})
    listed = await mkube.list(CONFIGMAPS, ns, label_selector=selector)
    assert [o["metadata"]["name"] for o in listed["items"]] == names


async def test_field_selectors_fabric_dra_uses(mkube: KubeClient, ns: str) -> None:
    for node in ("node-a", "node-b"):
        pod = {
            "metadata": {"name": f"p-{node}", "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }
        await mkube.create(PODS, pod)
    on_a = await mkube.list(PODS, field_selector="spec.nodeName=node-a")
    assert [p["metadata"]["name"] for p in on_a["items"] if p["metadata"]["namespace"] == ns] == ["p-node-a"]
    pool = resource_slice(f"{ns}-pool", devices=1)
    node_local = resource_slice(f"{ns}-local", devices=1)
    del node_local["spec"]["nodeSelector"]
    node_local["spec"]["nodeName"] = "node-a"
    node_local["spec"]["pool"]["name"] = f"{ns}-node-a"
    other = resource_slice(f"{ns}-other", devices=1)
    other["spec"]["driver"] = "gpu.example.com"
    for piece in (pool, node_local, other):
        await mkube.create(RESOURCE_SLICES, piece)

    async def names(selector: str) -> list[str]:
        listed = await mkube.list(RESOURCE_SLICES, field_selector=selector)
        return sorted(o["metadata"]["name"] for o in listed["items"] if o["metadata"]["name"].startswith(ns))

    assert await names("spec.driver=fabric-dra.io") == [f"{ns}-local", f"{ns}-pool"]
    assert await names("spec.nodeName=node-a") == [f"{ns}-local"]
    assert await names("spec.driver=fabric-dra.io,spec.pool.name=fabric-pcie") == [f"{ns}-pool"]
    assert await names(f"metadata.name={ns}-other") == [f"{ns}-other"]
    with pytest.raises(ApiError) as bad:
        await mkube.list(RESOURCE_SLICES, field_selector="spec.devices=x")
    assert bad.value.status == 400 and "field label not supported" in bad.value.message
