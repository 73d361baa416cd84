"""Shared counters, consumable capacity and shared devices' status through the API test server (a
real process) of each release: what a real server of that release refuses comes back as a 422
naming the field, in the real message's words; what it drops is gone from the answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from plumbing.kube import Invalid, KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.unit.kube_standin.objects import DRIVER, resource_claim

SHARE = "3b6c2f1e-8d4a-4c7b-9e2f-5a1d0c3b7e64"
#: DRAPartitionableDevices is alpha (off) in 1.34: without the gate the server drops the fields
K134_PARTITIONABLE = ["--server-version", "1.34.3", "--feature-gates", "DRAPartitionableDevices=true"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ApiServerProcess]]:
    started: dict[str, ApiServerProcess] = {}
    with (
        start_apiserver(tmp_path_factory.mktemp("k134"), extra_args=K134_PARTITIONABLE) as k134,
        start_apiserver(tmp_path_factory.mktemp("k135"), extra_args=["--server-version", "1.35.1"]) as k135,
        start_apiserver(tmp_path_factory.mktemp("k136"), extra_args=["--server-version", "1.36.2"]) as k136,
    ):
        started.update({"1.34": k134, "1.35": k135, "1.36": k136})
        yield started


def _slice(
    name: str, *, devices: list[dict[str, Any]] | None = None, counters: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": "node-a-gpus", "generation": 1, "resourceSliceCount": 2},
        "nodeName": "node-a",
    }
    if devices is not None:
        spec["devices"] = devices
    if counters is not None:
        spec["sharedCounters"] = counters
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


GPU3 = {"name": "gpu-3", "counters": {"memory-slice-2": {"value": "1"}, "memory-slice-3": {"value": "1"}}}
MIG = {
    "name": "gpu-3-mig-1g10gb-19-2",
    "consumesCounters": [{"counterSet": "gpu-3", "counters": {"memory-slice-2": {"value": "1"}}}],
}


async def _refused(kube: KubeClient, obj: dict[str, Any]) -> Invalid:
    with pytest.raises(Invalid) as refused:
        await kube.create(RESOURCE_SLICES, obj)
    assert refused.value.status == 422
    return refused.value


async def test_1_36_wants_counters_in_slices_of_their_own(servers: dict[str, ApiServerProcess]) -> None:
    async with servers["1.36"].client() as kube:
        await kube.create(RESOURCE_SLICES, _slice("gpu-3-counters", counters=[GPU3]))
        await kube.create(RESOURCE_SLICES, _slice("gpu-3-devices", devices=[MIG]))
        refused = await _refused(kube, _slice("combined", devices=[MIG], counters=[GPU3]))
        assert refused.message == (
            'ResourceSlice.resource.k8s.io "combined" is invalid: spec: Invalid value: "": '
            "only one of `sharedCounters` or `devices` is allowed"
        )
        nowhere = _slice("nowhere", counters=[GPU3])
        del nowhere["spec"]["nodeName"]
        refused = await _refused(kube, nowhere)
        assert refused.body["details"]["causes"] == [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
                "field": "spec",
            }
        ]
        sets = [{"name": f"gpu-{i}", "counters": {"memory": {"value": "80Gi"}}} for i in range(9)]
        refused = await _refused(kube, _slice("nine-sets", counters=sets))
        assert "spec.sharedCounters: Too many: 9: must have at most 8 items" in refused.message


async def test_1_34_keeps_them_beside_devices_and_checks_references_there(
    servers: dict[str, ApiServerProcess],
) -> None:
    async with servers["1.34"].client() as kube:
        stored = await kube.create(RESOURCE_SLICES, _slice("combined", devices=[MIG], counters=[GPU3]))
        assert stored["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] == "gpu-3"
        consumed = {"memory-slice-2": {"value": "1"}}
        dangling = {**MIG, "consumesCounters": [{"counterSet": "gpu-9", "counters": consumed}]}
        refused = await _refused(kube, _slice("dangling", devices=[dangling], counters=[GPU3]))
        assert (
            'spec.devices[0].consumesCounters[0].counterSet: Invalid value: "gpu-9": '
            "must reference a counterSet defined in the ResourceSlice sharedCounters"
        ) in refused.message


async def test_request_policies_are_checked(servers: dict[str, ApiServerProcess]) -> None:
    policy = {"default": "96Gi", "validRange": {"min": "64Gi", "step": "64Gi"}}
    pool = {"name": "cxl-pool-1", "capacity": {"memory": {"value": "256Gi", "requestPolicy": policy}}}
    async with servers["1.36"].client() as kube:
        refused = await _refused(kube, _slice("not-shared", devices=[pool]))
        assert refused.body["details"]["causes"] == [
            {
                "reason": "FieldValueForbidden",
                "message": "Forbidden: allowMultipleAllocations must be true",
                "field": "spec.devices[0].capacity[memory].requestPolicy",
            }
        ]
        refused = await _refused(
            kube, _slice("off-grid", devices=[{**pool, "allowMultipleAllocations": True}])
        )
        assert refused.body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": (
                    'Invalid value: "96Gi": value is not a multiple of a given step (64Gi) from (64Gi)'
                ),
                "field": "spec.devices[0].capacity[memory].requestPolicy.validRange.step",
            }
        ]


async def test_shared_device_status_needs_its_share_id(servers: dict[str, ApiServerProcess]) -> None:
    async with servers["1.36"].client() as kube:
        claim = await kube.create(RESOURCE_CLAIMS, resource_claim("shared", "default"), "default")
        result = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": "cxl",
            "device": "cxl-pool-1",
            "shareID": SHARE.upper(),
            "consumedCapacity": {"memory": "128Gi"},
        }
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        with pytest.raises(
            Invalid,
            match=(
                r"shareID: Invalid value: \"3B6C2F1E-.*uid must be in RFC "
                r"4122 normalized form"
            ),
        ):
            await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        result["shareID"] = SHARE
        claim = await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        assert claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] == {
            "memory": "128Gi"
        }
        claim["status"]["devices"] = [{"driver": DRIVER, "pool": "cxl", "device": "cxl-pool-1"}]
        with pytest.raises(Invalid) as refused:
            await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        assert refused.value.body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": (
                    f"Invalid value: {DRIVER}/cxl/cxl-pool-1: must be an allocated device in the claim"
                ),
                "field": "status.devices[0]",
            }
        ]
        claim["status"]["devices"][0]["shareID"] = SHARE
        written = await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        assert written["status"]["devices"][0]["shareID"] == SHARE


async def test_a_1_35_server_drops_capacity_requests(servers: dict[str, ApiServerProcess]) -> None:
    """DRAConsumableCapacity is alpha (off) in 1.35: the request is accepted, its capacity dropped."""
    claim = resource_claim("wants-capacity", "default")
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "64Gi"}}
    async with servers["1.35"].client() as kube:
        stored = await kube.create(RESOURCE_CLAIMS, claim, "default")
        assert "capacity" not in stored["spec"]["devices"]["requests"][0]["exactly"]
    async with servers["1.36"].client() as kube:
        stored = await kube.create(RESOURCE_CLAIMS, claim, "default")
        exactly = stored["spec"]["devices"]["requests"][0]["exactly"]
        assert exactly["capacity"] == {"requests": {"memory": "64Gi"}}
