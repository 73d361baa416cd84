"""The API test server through the shared KubeClient: CRUD, optimistic concurrency, errors."""

from __future__ import annotations

import pytest

from dra_driver.kube import AlreadyExists, Conflict, KubeClient, NotFound, Unauthorized
from dra_driver.kube.resources import CONFIGMAPS, NAMESPACES
from tests.support.apiserver import ApiServerProcess


async def test_create_get_update_delete(kube: KubeClient) -> None:
    created = await kube.create(
        CONFIGMAPS, {"metadata": {"name": "one", "namespace": "default"}, "data": {"a": "1"}}
    )
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]
    fetched = await kube.get(CONFIGMAPS, "one", "default")
    assert fetched == created
    fetched["data"]["a"] = "2"
    updated = await kube.replace(CONFIGMAPS, fetched)
    assert int(updated["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    with pytest.raises(Conflict):
        await kube.replace(CONFIGMAPS, fetched)  # stale resourceVersion
    with pytest.raises(AlreadyExists):
        await kube.create(CONFIGMAPS, {"metadata": {"name": "one", "namespace": "default"}})
    await kube.delete(CONFIGMAPS, "one", "default")
    with pytest.raises(NotFound):
        await kube.get(CONFIGMAPS, "one", "default")


async def test_requests_need_a_known_token(apiserver: ApiServerProcess) -> None:
    async with apiserver.client(token="not-a-token") as stranger:
        with pytest.raises(Unauthorized):
            await stranger.list(NAMESPACES)
    async with apiserver.client() as admin:
        names = {ns["metadata"]["name"] for ns in (await admin.list(NAMESPACES))["items"]}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names
