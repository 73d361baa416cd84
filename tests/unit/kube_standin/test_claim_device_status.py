"""A claim's ``status.devices`` as the API test server judges it (Kubernetes 1.36:
``validateDeviceStatus``/``validateResourceClaimStatusUpdate`` in
``pkg/apis/resource/validation/validation.go``, ``ValidateCondition`` of metav1, and the
``DRAResourceClaimDeviceStatus`` gate in the claim strategy): what the plugin writes is accepted;
each rule refuses its own case, with the field path and message the real server answers with."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.plugin.claimstatus import DeviceReadiness, merge_entries
from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.rules import validate_update
from kube_standin.apiserver.status import Cause
from kube_standin.apiserver.strategy import prepare_for_update
from tests.unit.kube_standin.objects import DRIVER, resource, resource_claim

CLAIMS = resource("resource.k8s.io", "v1", "resourceclaims")
K136 = FeatureGates.of("1.36.2")
SHARE = "9f3c1a2b-4d5e-4f60-8a7b-1c2d3e4f5a6b"
GPU = {"driver": DRIVER, "pool": "fabric-pcie", "device": "gpu0"}
MEMORY = {"driver": DRIVER, "pool": "fabric-cxl", "device": "cxl-pool-1", "shareID": SHARE}


def _allocated() -> dict[str, Any]:
    claim = resource_claim()
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", **GPU},
                    {"request": "gpu", **MEMORY, "consumedCapacity": {"memory": "64Gi"}},
                ]
            }
        }
    }
    return claim


def _ready(**overrides: Any) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "gpu0 is attached to node node-a",
        "lastTransitionTime": "2026-12-06T06:19:48Z",
        **overrides,
    }


def _with(*entries: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    old = _allocated()
    new = copy.deepcopy(old)
    new["status"]["devices"] = [copy.deepcopy(e) for e in entries]
    return new, old


def _refusals(*entries: dict[str, Any], gates: FeatureGates = K136) -> list[str]:
    new, old = _with(*entries)
    causes: list[Cause] = validate_update(CLAIMS, new, old, "status", gates)
    return [f"{c.field}: {c.message}" for c in causes]


def test_what_the_plugin_writes_is_accepted() -> None:
    """The plugin's own merge of a device and a share, Ready with data, next to another
    writer's condition: no refusal."""
    current = [{**GPU, "conditions": [_ready(type=f"{DRIVER}/Attached", reason="Attached")]}]
    data = {
        "node": "node-a",
        "fabric": "PCIe",
        "switch": "switch0",
        "port": "DP0",
        "pciAddress": "0000:41:00.0",
    }
    wanted: dict[Any, DeviceReadiness | None] = {
        ("fabric-pcie", "gpu0", None): DeviceReadiness(
            "fabric-pcie", "gpu0", None, True, "Prepared", "ok", data
        ),
        ("fabric-cxl", "cxl-pool-1", SHARE): DeviceReadiness(
            "fabric-cxl", "cxl-pool-1", SHARE, False, "MemoryFailed", "pages in use", None
        ),
    }
    allocated = {("fabric-pcie", "gpu0", None), ("fabric-cxl", "cxl-pool-1", SHARE)}
    entries = merge_entries(current, DRIVER, wanted, allocated, 1)
    assert [c["type"] for c in entries[0]["conditions"]] == [f"{DRIVER}/Attached", "Ready"]
    assert entries[1]["shareID"] == SHARE
    assert _refusals(*entries) == []


def test_the_plugin_never_names_a_device_the_claim_does_not_allocate() -> None:
    """A device the allocation no longer lists is not added: the API server would refuse it."""
    wanted: dict[Any, DeviceReadiness | None] = {
        ("fabric-pcie", "gpu9", None): DeviceReadiness("fabric-pcie", "gpu9", None, True, "Prepared", "ok")
    }
    assert merge_entries([], DRIVER, wanted, {("fabric-pcie", "gpu0", None)}, 1) == []


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param(
            [{**GPU, "device": "gpu9"}],
            [
                f"status.devices[0]: Invalid value: {DRIVER}/fabric-pcie/gpu9: must be an allocated device "
                "in the claim"
            ],
            id="not-allocated",
        ),
        pytest.param(
            [{**MEMORY, "shareID": None}],
            [
                f"status.devices[0]: Invalid value: {DRIVER}/fabric-cxl/cxl-pool-1: must be an allocated "
                "device in the claim"
            ],
            id="share-without-its-id",
        ),
        pytest.param(
            [{**GPU, "shareID": SHARE}],
            [
                f"status.devices[0]: Invalid value: {DRIVER}/fabric-pcie/gpu0/{SHARE}: must be an allocated "
                "device in the claim"
            ],
            id="whole-device-with-a-share-id",
        ),
        pytest.param(
            [GPU, GPU], [f"status.devices[1]: Duplicate value: {DRIVER}/fabric-pcie/gpu0"], id="twice"
        ),
        pytest.param(
            [{**GPU, "conditions": [_ready(type=f"{DRIVER}/c{i}") for i in range(9)]}],
            ["status.devices[0].conditions: Too many: 9: must have at most 8 items"],
            id="nine-conditions",
        ),
        pytest.param(
            [{**GPU, "conditions": [{k: v for k, v in _ready().items() if k != "lastTransitionTime"}]}],
            ["status.devices[0].conditions[0].lastTransitionTime: Required value: must be set"],
            id="no-transition-time",
        ),
        pytest.param(
            [{**GPU, "conditions": [_ready(type="not a type")]}],
            [
                'status.devices[0].conditions[0].type: Invalid value: "not a type": name part must consist '
                "of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                "character (at most 63 characters)"
            ],
            id="type-not-a-label-name",
        ),
        pytest.param(
            [{**GPU, "conditions": [_ready(reason="")]}],
            ["status.devices[0].conditions[0].reason: Required value: must be set"],
            id="no-reason",
        ),
        pytest.param(
            [{**GPU, "conditions": [_ready(message="m" * (32 * 1024 + 1))]}],
            ["status.devices[0].conditions[0].message: Too long: may not be more than 32768 bytes"],
            id="message-too-long",
        ),
        pytest.param(
            [{**GPU, "data": {"blob": "x" * (10 * 1024)}}],
            ["status.devices[0].data: Too long: may not be more than 10240 bytes"],
            id="data-over-10KiB",
        ),
        pytest.param(
            [{**GPU, "data": "text"}],
            ['status.devices[0].data: Invalid value: "<value omitted>": must be a valid JSON object'],
            id="data-not-an-object",
        ),
        pytest.param(
            [{**GPU, "networkData": {"interfaceName": "i" * 257}}],
            ["status.devices[0].networkData.interfaceName: Too long: may not be more than 256 bytes"],
            id="interface-name",
        ),
        pytest.param(
            [{**GPU, "networkData": {"hardwareAddress": "a" * 129}}],
            ["status.devices[0].networkData.hardwareAddress: Too long: may not be more than 128 bytes"],
            id="hardware-address",
        ),
        pytest.param(
            [{**GPU, "networkData": {"ips": [f"10.0.0.{i}/24" for i in range(17)]}}],
            ["status.devices[0].networkData.ips: Too many: 17: must have at most 16 items"],
            id="seventeen-ips",
        ),
        pytest.param(
            [{**GPU, "shareID": SHARE.upper()}],
            [
                f'status.devices[0].shareID: Invalid value: "{SHARE.upper()}": uid must be in RFC 4122 '
                "normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal "
                "characters",
                f"status.devices[0]: Invalid value: {DRIVER}/fabric-pcie/gpu0/{SHARE.upper()}: must be an "
                "allocated device in the claim",
            ],
            id="share-id-not-normalized",
        ),
    ],
)
def test_each_rule_refuses_its_case(entries: list[dict[str, Any]], expected: list[str]) -> None:
    entries = [{k: v for k, v in e.items() if v is not None} for e in entries]
    assert _refusals(*entries) == expected


def test_exactly_eight_conditions_and_10KiB_of_data_pass() -> None:
    conditions = [_ready(type=f"{DRIVER}/c{i}") for i in range(8)]
    blob = "x" * (10 * 1024 - len('{"blob":""}'))
    assert _refusals({**GPU, "conditions": conditions, "data": {"blob": blob}}) == []


def test_without_the_gate_the_server_drops_status_devices_unless_in_use() -> None:
    """``DRAResourceClaimDeviceStatus`` off (``--feature-gates``): the write succeeds, the field is
    not kept (``dropDisabledFields``); where the stored claim already has entries, they stay."""
    off = FeatureGates.of("1.36.2", {"DRAResourceClaimDeviceStatus": False})
    assert K136.enabled("DRAResourceClaimDeviceStatus"), "beta and on in 1.36"
    new, old = _with({**GPU, "conditions": [_ready()]})
    prepare_for_update(CLAIMS, new, old, off)
    assert "devices" not in new["status"]
    in_use = copy.deepcopy(old)
    in_use["status"]["devices"] = [GPU]
    new, _ = _with({**GPU, "conditions": [_ready()]})
    prepare_for_update(CLAIMS, new, in_use, off)
    assert new["status"]["devices"][0]["conditions"][0]["type"] == "Ready"


def test_a_deallocated_devices_entry_is_dropped() -> None:
    """``dropDeallocatedStatusDevices``: the allocation goes, the entries of its devices with it."""
    old, _ = _with({**GPU, "conditions": [_ready()]})
    new = copy.deepcopy(old)
    del new["status"]["allocation"]
    prepare_for_update(CLAIMS, new, old, K136)
    assert "devices" not in new["status"]
