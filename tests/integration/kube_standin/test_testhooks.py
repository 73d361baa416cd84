"""Test hooks: injected failures (what the client sees) and per-resource request counts."""

from __future__ import annotations

import pytest

from plumbing.kube import ApiUnavailable, Conflict, KubeClient
from plumbing.kube.resources import CONFIGMAPS, RESOURCE_SLICES
from tests.support.apiserver import ApiServerProcess
from tests.unit.kube_standin.objects import resource_slice


async def test_injected_failures_hit_the_next_matching_requests(
    apiserver: ApiServerProcess, kube: KubeClient
) -> None:
    apiserver.hooks.fail("resourceslices", count=2, code=500, message="etcdserver: request timed out")
    for _ in range(2):
        with pytest.raises(ApiUnavailable, match="etcdserver: request timed out"):
            await kube.create(RESOURCE_SLICES, resource_slice("s", devices=1))
    assert (await kube.list(RESOURCE_SLICES))["items"] == []  # reads were not affected, nothing was written
    created = await kube.create(RESOURCE_SLICES, resource_slice("s", devices=1))
    apiserver.hooks.fail("resourceslices", verbs=["update"], code=409, name="s")
    with pytest.raises(Conflict):
        await kube.replace(RESOURCE_SLICES, created)
    assert apiserver.hooks.faults() == []
    await kube.replace(RESOURCE_SLICES, created)
    apiserver.hooks.fail("configmaps", verbs=["get"], code=429, retry_after_seconds=1, count=5)
    with pytest.raises(ApiUnavailable) as throttled:
        await kube.get(CONFIGMAPS, "nope", "default")
    assert throttled.value.status == 429
    apiserver.hooks.clear_faults()
    assert apiserver.hooks.faults() == []


async def test_requests_are_counted_per_resource_and_verb(
    apiserver: ApiServerProcess, kube: KubeClient
) -> None:
    apiserver.hooks.reset_counts()
    piece = await kube.create(RESOURCE_SLICES, resource_slice("counted", devices=1))
    await kube.replace(RESOURCE_SLICES, piece)  # unchanged: a write request, but no change
    await kube.list(RESOURCE_SLICES)
    await kube.get(RESOURCE_SLICES, "counted")
    counts = apiserver.hooks.requests()
    key = "resource.k8s.io/resourceslices"
    assert counts["requests"][key] == {"create": 1, "update": 1, "list": 1, "get": 1}
    assert apiserver.hooks.writes(key) == 2
    assert counts["changes"][key] == 1
    apiserver.hooks.reset_counts()
    assert apiserver.hooks.writes(key) == 0


async def test_a_delay_only_fault_lets_the_request_through(
    apiserver: ApiServerProcess, kube: KubeClient
) -> None:
    await kube.create(CONFIGMAPS, {"metadata": {"name": "slow", "namespace": "default"}})
    armed = apiserver.hooks.fail("configmaps", verbs=["get"], code=200, delay_seconds=0.2, name="slow")
    assert armed["remaining"] == 1 and armed["id"] >= 1
    fetched = await kube.get(CONFIGMAPS, "slow", "default")
    assert fetched["metadata"]["name"] == "slow"
    assert apiserver.hooks.faults() == []
