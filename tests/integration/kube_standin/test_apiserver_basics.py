"""The API test server through the shared KubeClient (real process, real HTTP): CRUD,
optimistic concurrency, subresources, generation, finalizers, patches, discovery."""

from __future__ import annotations

import base64
import copy

import httpx
import pytest

from plumbing.kube import AlreadyExists, ApiError, Conflict, Forbidden, KubeClient, NotFound, Unauthorized
from plumbing.kube.resources import (
    CONFIGMAPS,
    DEPLOYMENTS,
    NAMESPACES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
)
from tests.support.apiserver import ApiServerProcess
from tests.unit.kube_standin.objects import allocation, resource_claim, resource_slice


async def test_create_get_update_delete(mkube: KubeClient, ns: str) -> None:
    kube = mkube
    created = await kube.create(
        CONFIGMAPS, {"metadata": {"name": "one", "namespace": ns}, "data": {"a": "1"}}
    )
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]
    fetched = await kube.get(CONFIGMAPS, "one", ns)
    assert fetched == created
    fetched["data"]["a"] = "2"
    updated = await kube.replace(CONFIGMAPS, fetched)
    assert int(updated["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    with pytest.raises(Conflict):
        await kube.replace(CONFIGMAPS, fetched)  # stale resourceVersion
    with pytest.raises(AlreadyExists):
        await kube.create(CONFIGMAPS, {"metadata": {"name": "one", "namespace": ns}})
    await kube.delete(CONFIGMAPS, "one", ns)
    with pytest.raises(NotFound) as missing:
        await kube.get(CONFIGMAPS, "one", ns)
    assert missing.value.body["details"] == {"name": "one", "kind": "configmaps"}
    assert missing.value.message == 'configmaps "one" not found'


async def test_requests_need_a_known_token(shared_apiserver: ApiServerProcess) -> None:
    async with shared_apiserver.client(token="not-a-token") as stranger:
        with pytest.raises(Unauthorized):
            await stranger.list(NAMESPACES)
    async with shared_apiserver.client() as admin:
        names = {ns["metadata"]["name"] for ns in (await admin.list(NAMESPACES))["items"]}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names


async def test_status_subresource_and_generation(mkube: KubeClient, ns: str) -> None:
    kube = mkube
    claim = await kube.create(RESOURCE_CLAIMS, resource_claim("c1", ns))
    assert claim["metadata"]["generation"] == 1 and "status" not in claim
    claim["status"] = {"allocation": allocation()}
    unchanged = await kube.replace(RESOURCE_CLAIMS, claim)
    assert "status" not in unchanged  # the main resource ignores status
    allocated = await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
    assert allocated["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    reserved = await kube.patch(
        RESOURCE_CLAIMS,
        "c1",
        {
            "status": {
                "reservedFor": [
                    {"resource": "pods", "name": "p", "uid": "8c0e7d52-1d2a-4f3e-9a61-0b1c2d3e4f50"}
                ]
            }
        },
        ns,
        subresource="status",
    )
    assert reserved["status"]["reservedFor"][0]["name"] == "p"
    assert reserved["metadata"]["generation"] == 1
    piece = await kube.create(RESOURCE_SLICES, resource_slice("gen-test", devices=2))
    piece["spec"]["pool"]["generation"] = 2
    bumped = await kube.replace(RESOURCE_SLICES, piece)
    assert bumped["metadata"]["generation"] == 2
    labelled = await kube.patch(RESOURCE_SLICES, "gen-test", {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 2  # metadata is not spec


async def test_finalizers_and_delete_preconditions(mkube: KubeClient, ns: str) -> None:
    kube = mkube
    obj = {"metadata": {"name": "held", "namespace": ns, "finalizers": ["fabric-dra.io/detach"]}}
    created = await kube.create(CONFIGMAPS, obj)
    with pytest.raises(Conflict, match="Precondition failed: UID"):
        await kube.delete(CONFIGMAPS, "held", ns, uid="00000000-0000-0000-0000-000000000000")
    marked = await kube.delete(CONFIGMAPS, "held", ns, uid=created["metadata"]["uid"])
    assert marked["metadata"]["deletionTimestamp"]
    still = await kube.get(CONFIGMAPS, "held", ns)
    assert still["metadata"]["finalizers"] == ["fabric-dra.io/detach"]
    await kube.patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, ns)
    with pytest.raises(NotFound):
        await kube.get(CONFIGMAPS, "held", ns)


async def test_patch_types_and_conflicts(kube: KubeClient) -> None:
    await kube.create(
        PODS,
        {
            "metadata": {"name": "p", "namespace": "default", "labels": {"a": "1"}},
            "spec": {"containers": [{"name": "app", "image": "busybox"}], "nodeName": "node-a"},
        },
    )
    merged = await kube.patch(PODS, "p", {"metadata": {"labels": {"b": "2"}}}, "default")
    assert merged["metadata"]["labels"] == {"a": "1", "b": "2"}
    strategic = await kube.patch(
        PODS,
        "p",
        {"spec": {"containers": [{"name": "app", "image": "busybox:2"}]}},
        "default",
        patch_type="strategic",
    )
    assert strategic["spec"]["containers"] == [{"name": "app", "image": "busybox:2"}]
    jsonp = await kube.patch(
        PODS, "p", [{"op": "remove", "path": "/metadata/labels/a"}], "default", patch_type="json"
    )
    assert jsonp["metadata"]["labels"] == {"b": "2"}
    with pytest.raises(ApiError) as failed_test:
        test_op = [{"op": "test", "path": "/spec/nodeName", "value": "x"}]
        await kube.patch(PODS, "p", test_op, "default", patch_type="json")
    assert failed_test.value.status == 422
    stale = {"metadata": {"resourceVersion": merged["metadata"]["resourceVersion"], "labels": {"c": "3"}}}
    with pytest.raises(Conflict):
        await kube.patch(PODS, "p", stale, "default")
    status = await kube.patch(PODS, "p", {"status": {"phase": "Running"}}, "default", subresource="status")
    assert status["status"]["phase"] == "Running"
    pods = await kube.list(PODS, "default", field_selector="status.phase=Running,spec.nodeName=node-a")
    assert [p["metadata"]["name"] for p in pods["items"]] == ["p"]


async def test_namespaces_secrets_scale_and_dry_run(apiserver: ApiServerProcess, kube: KubeClient) -> None:
    with pytest.raises(NotFound, match='namespaces "team" not found'):
        await kube.create(CONFIGMAPS, {"metadata": {"name": "c", "namespace": "team"}})
    await kube.create(NAMESPACES, {"metadata": {"name": "team"}})
    secret = await kube.create(
        SECRETS, {"metadata": {"name": "s", "namespace": "team"}, "stringData": {"token": "abc"}}
    )
    assert secret["data"] == {"token": base64.b64encode(b"abc").decode()} and "stringData" not in secret
    assert secret["type"] == "Opaque"
    deployment = {
        "metadata": {"name": "manager", "namespace": "team"},
        "spec": {
            "selector": {"matchLabels": {"app": "manager"}},
            "template": {
                "metadata": {"labels": {"app": "manager"}},
                "spec": {"containers": [{"name": "m", "image": "fabric-dra"}]},
            },
        },
    }
    created = await kube.create(DEPLOYMENTS, deployment)
    assert created["spec"]["replicas"] == 1
    scale = await kube.get(DEPLOYMENTS, "manager", "team", subresource="scale")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1
    assert scale["status"]["selector"] == "app=manager"
    scaled = await kube.patch(DEPLOYMENTS, "manager", {"spec": {"replicas": 0}}, "team", subresource="scale")
    assert scaled["spec"]["replicas"] == 0
    assert (await kube.get(DEPLOYMENTS, "manager", "team"))["metadata"]["generation"] == 2
    auth = {"Authorization": f"Bearer {apiserver.admin_token}"}
    async with httpx.AsyncClient(base_url=apiserver.url, headers=auth) as http:
        dry = await http.post(
            "/api/v1/namespaces/team/configmaps", params={"dryRun": "All"}, json={"metadata": {"name": "dry"}}
        )
        assert dry.status_code == 201 and dry.json()["metadata"]["name"] == "dry"
    with pytest.raises(NotFound):
        await kube.get(CONFIGMAPS, "dry", "team")
    await kube.delete(NAMESPACES, "team")
    with pytest.raises(NotFound):
        await kube.get(SECRETS, "s", "team")
    with pytest.raises(NotFound):
        await kube.get(NAMESPACES, "team")


async def test_discovery_and_error_shapes(shared_apiserver: ApiServerProcess) -> None:
    auth = {"Authorization": f"Bearer {shared_apiserver.admin_token}"}
    async with httpx.AsyncClient(base_url=shared_apiserver.url, headers=auth) as http:
        assert (await http.get("/version")).json()["gitVersion"] == "v1.37.0"
        assert (await http.get("/api")).json()["versions"] == ["v1"]
        groups = {g["name"]: g for g in (await http.get("/apis")).json()["groups"]}
        assert groups["resource.k8s.io"]["preferredVersion"]["version"] == "v1"
        # Beta APIs are off by default (--runtime-config turns them on), as on a real 1.34+ server.
        assert [v["version"] for v in groups["resource.k8s.io"]["versions"]] == ["v1"]
        assert (await http.get("/apis/resource.k8s.io/v1beta1")).status_code == 404
        assert (await http.get("/apis/resource.k8s.io/v1beta1/resourceslices")).status_code == 404
        resources = {r["name"]: r for r in (await http.get("/apis/resource.k8s.io/v1")).json()["resources"]}
        assert {"resourceclaims", "resourceclaims/status", "resourceslices", "deviceclasses"} <= set(
            resources
        )
        assert resources["resourceslices"]["namespaced"] is False
        core = {r["name"] for r in (await http.get("/api/v1")).json()["resources"]}
        assert {"pods", "pods/status", "nodes/status", "namespaces", "events", "secrets"} <= core
        missing = await http.get("/apis/resource.k8s.io/v1alpha3/resourceclaims")
        assert missing.status_code == 404 and missing.json()["kind"] == "Status"
        beta = {**resource_slice(devices=1), "apiVersion": "resource.k8s.io/v1beta1"}
        wrong = await http.post("/apis/resource.k8s.io/v1/resourceslices", json=beta)
        assert (
            wrong.status_code == 400 and "does not match the expected API version" in wrong.json()["message"]
        )
        unsupported = await http.get("/api/v1/configmaps", params={"fieldSelector": "spec.nodeName=x"})
        assert unsupported.status_code == 400
        assert unsupported.json()["message"] == "field label not supported: spec.nodeName"
        not_allowed = await http.put("/apis/authentication.k8s.io/v1/tokenreviews/x", json={})
        assert not_allowed.status_code == 405


async def test_forbidden_finalizer_growth(mkube: KubeClient, ns: str) -> None:
    kube = mkube
    await kube.create(CONFIGMAPS, {"metadata": {"name": "g", "namespace": ns, "finalizers": ["a.io/x"]}})
    marked = await kube.delete(CONFIGMAPS, "g", ns)
    grown = copy.deepcopy(marked)
    grown["metadata"]["finalizers"].append("b.io/y")
    with pytest.raises(Forbidden):
        await kube.replace(CONFIGMAPS, grown)
