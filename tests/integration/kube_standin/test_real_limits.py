"""The API test server refuses and drops what a real server of the same release does: object
size limits (etcd's request limit, a ConfigMap's 1 MiB, the 3 MiB body — DeleteOptions too —,
10,000 JSON patch operations) and the fields of feature gates that are off by default in the
emulated release (docs/testing.md, "What a real server enforces")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from plumbing.kube import ApiError, Invalid
from plumbing.kube.resources import CONFIGMAPS, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.unit.kube_standin.objects import allocation, resource_claim, resource_slice

GATED = {
    "taints": [{"key": "fabric-dra.io/unhealthy", "value": "Critical", "effect": "NoSchedule"}],
    "bindsToNode": True,
    "bindingConditions": ["fabric-dra.io/Attached"],
    "bindingFailureConditions": ["fabric-dra.io/AttachFailed"],
}


def _gated_slice(name: str) -> dict[str, Any]:
    obj = resource_slice(name, devices=2)
    obj["spec"]["devices"][0].update(GATED)
    return obj


@pytest.fixture(scope="module")
def server_134(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("k134"), extra_args=["--server-version", "1.34.3"]) as s:
        yield s


@pytest.fixture(scope="module")
def server_136(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("k136"), extra_args=["--server-version", "1.36.2"]) as s:
        yield s


async def test_a_1_34_server_drops_taints_and_binding_fields_but_keeps_them_once_in_use(
    server_134: ApiServerProcess,
) -> None:
    async with server_134.client() as kube:
        stored = await kube.create(RESOURCE_SLICES, _gated_slice("gated-134"))
        device = stored["spec"]["devices"][0]
        assert not set(GATED) & set(device), device  # accepted, and silently dropped
        dry = await kube.request(
            "POST", RESOURCE_SLICES.path(), params={"dryRun": "All"}, body=_gated_slice("dry-134")
        )
        assert "taints" not in dry["spec"]["devices"][0]


async def test_feature_gates_flag_turns_the_fields_on(tmp_path: Path) -> None:
    args = ["--server-version", "1.35.0", "--feature-gates", "DRADeviceTaints=true"]
    with start_apiserver(tmp_path / "k135", extra_args=args) as server:
        async with server.client() as kube:
            device = (await kube.create(RESOURCE_SLICES, _gated_slice("gated-135")))["spec"]["devices"][0]
    assert device["taints"][0]["effect"] == "NoSchedule"
    assert "bindsToNode" not in device  # DRADeviceBindingConditions is still off in 1.35


async def test_a_1_36_server_keeps_them_and_bindsToNode_alone(server_136: ApiServerProcess) -> None:
    async with server_136.client() as kube:
        device = (await kube.create(RESOURCE_SLICES, _gated_slice("gated-136")))["spec"]["devices"][0]
        # kept, each taint stamped with the write's time (SetDefaults_DeviceTaint)
        assert all(t.pop("timeAdded") for t in device["taints"])
        assert {k: device[k] for k in GATED} == GATED
        alone = resource_slice("binds-136", devices=1)
        alone["spec"]["devices"][0]["bindsToNode"] = True
        assert (await kube.create(RESOURCE_SLICES, alone))["spec"]["devices"][0]["bindsToNode"] is True


async def test_a_claims_deallocated_device_status_is_dropped(server_136: ApiServerProcess) -> None:
    async with server_136.client() as kube:
        claim = await kube.create(RESOURCE_CLAIMS, resource_claim("dealloc", "default"))
        claim["status"] = {
            "allocation": allocation(),
            "devices": [{"driver": "fabric-dra.io", "pool": "fabric-pcie", "device": "gpu-0"}],
        }
        claim = await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        assert claim["status"]["devices"]
        claim["status"] = {"devices": claim["status"]["devices"]}  # the scheduler gives it up
        cleared = await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        assert "devices" not in cleared.get("status", {})


async def test_a_configmap_over_1_mib_is_invalid(shared_apiserver: ApiServerProcess) -> None:
    async with shared_apiserver.client() as kube:
        meta = {"name": "ledger-big", "namespace": "default"}
        big = {"metadata": meta, "data": {"a": "x" * ((1 << 20) + 1)}}
        with pytest.raises(Invalid) as caught:
            await kube.create(CONFIGMAPS, big)
        assert "Too long: may not be more than 1048576 bytes" in str(caught.value)
        big["data"] = {"a": "x" * ((1 << 20) - 1), "b": "y"}  # exactly 1 MiB: fine
        await kube.create(CONFIGMAPS, big)
        big["data"]["c"] = "z"  # grown by an update: refused too
        with pytest.raises(Invalid):
            await kube.replace(CONFIGMAPS, {**big, "metadata": {**big["metadata"]}})


async def test_an_object_over_etcds_request_limit_is_refused(shared_apiserver: ApiServerProcess) -> None:
    images = [{"names": [f"registry.example/img-{i:06d}:" + "t" * 60]} for i in range(22_000)]
    node = {"metadata": {"name": "huge-node"}, "status": {"images": images}}
    assert 1.5 * 2**20 < len(json.dumps(node)) < 3 * 2**20  # under the body limit, over etcd's
    async with shared_apiserver.client() as kube:
        with pytest.raises(ApiError) as caught:
            await kube.create(NODES, node)
    assert caught.value.status == 500
    assert "etcdserver: request is too large" in str(caught.value)


async def test_bodies_over_3_mib_and_json_patches_over_10000_operations(
    shared_apiserver: ApiServerProcess,
) -> None:
    auth = {"Authorization": f"Bearer {shared_apiserver.admin_token}"}
    async with httpx.AsyncClient(base_url=shared_apiserver.url, headers=auth, timeout=30) as http:
        cm = {"metadata": {"name": "patched", "namespace": "default"}, "data": {}}
        assert (await http.post("/api/v1/namespaces/default/configmaps", json=cm)).status_code == 201
        ops = [{"op": "add", "path": f"/data/k{i}", "value": "v"} for i in range(10_001)]
        refused = await http.patch(
            "/api/v1/namespaces/default/configmaps/patched",
            content=json.dumps(ops),
            headers={"Content-Type": "application/json-patch+json"},
        )
        assert refused.status_code == 413
        assert "The allowed number of operations in a JSON patch is 10000" in refused.json()["message"]
        fine = await http.patch(
            "/api/v1/namespaces/default/configmaps/patched",
            content=json.dumps(ops[:10_000]),
            headers={"Content-Type": "application/json-patch+json"},
        )
        assert fine.status_code == 200
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"], "x": "y" * (3 << 20)}
        deleted = await http.request(
            "DELETE", "/api/v1/namespaces/default/configmaps/patched", content=json.dumps(options)
        )
        assert deleted.status_code == 413
