"""The binding-condition flow with the controller as a real process, the API test server, and the
small HTTP stand-in of the manager (tests/support/controller.py) — fast, with every failure mode.
The flow against the real manager and emulator is in test_binding_fabric.py."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.support.controller import InventoryServer, make_device, make_inventory
from tests.support.waiting import wait_until

_claims = itertools.count(1)


def ensure_namespace(apiserver: ApiServer, name: str = "default") -> None:
    response = apiserver.http.post(
        "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    assert response.status_code in (201, 409), response.text


def claim_path(name: str = "", namespace: str = "default") -> str:
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    return f"{base}/{name}" if name else base


def create_claim(apiserver: ApiServer, requests: list[str]) -> dict[str, Any]:
    ensure_namespace(apiserver)
    name = f"claim-{next(_claims)}"
    return apiserver.create(
        claim_path(),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": r, "exactly": {"deviceClassName": "fabric-gpu"}} for r in requests]
                }
            },
        },
    )


def allocate(
    apiserver: ApiServer,
    claim: dict[str, Any],
    driver: str,
    devices: dict[str, str],
    node: str,
    *,
    conditions: bool = True,
    pool: str = "fabric-pcie",
) -> dict[str, Any]:
    """Do what the scheduler does in PreBind: write the allocation (request → device) for ``node``."""
    results = []
    for request, device in devices.items():
        result: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
        if conditions:
            result["bindingConditions"] = [f"{driver}/Attached"]
            result["bindingFailureConditions"] = [f"{driver}/AttachFailed"]
        results.append(result)
    obj = apiserver.http.get(claim_path(claim["metadata"]["name"])).json()
    obj["status"] = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
            "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "reservedFor": [
            {
                "resource": "pods",
                "name": "pod-" + obj["metadata"]["name"],
                "uid": "pod-uid-" + obj["metadata"]["uid"],
            }
        ],
    }
    response = apiserver.http.put(claim_path(obj["metadata"]["name"]) + "/status", json=obj)
    assert response.status_code == 200, response.text
    return dict(response.json())


def deallocate(apiserver: ApiServer, claim: dict[str, Any]) -> None:
    """What the scheduler does when it gives an allocation up (PostFilter)."""
    obj = apiserver.http.get(claim_path(claim["metadata"]["name"])).json()
    obj["status"] = {}
    response = apiserver.http.put(claim_path(obj["metadata"]["name"]) + "/status", json=obj)
    assert response.status_code == 200, response.text


def device_conditions(apiserver: ApiServer, claim: dict[str, Any], device: str) -> dict[str, dict[str, Any]]:
    obj = apiserver.http.get(claim_path(claim["metadata"]["name"])).json()
    for entry in (obj.get("status") or {}).get("devices") or []:
        if entry["device"] == device:
            return {c["type"]: c for c in entry.get("conditions") or []}
    return {}


def condition(apiserver: ApiServer, claim: dict[str, Any], device: str, kind: str) -> dict[str, Any] | None:
    return device_conditions(apiserver, claim, device).get(kind)


def condition_status(apiserver: ApiServer, claim: dict[str, Any], device: str, kind: str) -> str | None:
    found = condition(apiserver, claim, device, kind)
    return None if found is None else str(found["status"])


@pytest.fixture
def fabric() -> Any:
    devices = [make_device(f"gpu-{i}", switch="Switch1") for i in range(4)]
    with InventoryServer(make_inventory(devices, pools={"fabric-pcie": ["bn-1", "bn-2"]})) as server:
        yield server


def binding_flags(*, release_grace: str = "0.5") -> tuple[str, ...]:
    return ("--binding-conditions", "--busy-timeout", "1", "--release-grace", release_grace)


def test_published_devices_carry_bindsToNode_and_conditions(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: InventoryServer
) -> None:
    start_controller(fabric, driver, *binding_flags())
    slices = wait_until(lambda: apiserver.slices(driver), what="publication")
    device = slices[0]["spec"]["devices"][0]
    assert device["bindsToNode"] is True
    assert device["bindingConditions"] == [f"{driver}/Attached"]
    assert device["bindingFailureConditions"] == [f"{driver}/AttachFailed"]


def test_allocated_device_is_attached_and_reported(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: InventoryServer
) -> None:
    start_controller(fabric, driver, *binding_flags())
    wait_until(lambda: apiserver.slices(driver), what="publication")
    claim = create_claim(apiserver, ["a", "b"])
    allocate(apiserver, claim, driver, {"a": "gpu-0", "b": "gpu-1"}, "bn-1")

    for device in ("gpu-0", "gpu-1"):
        attached = wait_until(
            lambda d=device: (  # type: ignore[misc]
                (c := condition(apiserver, claim, d, f"{driver}/Attached")) and c["status"] == "True" and c
            ),
            what=f"Attached=True on {device}",
        )
        assert attached["reason"] == "Attached" and attached["lastTransitionTime"]
        assert condition_status(apiserver, claim, device, f"{driver}/AttachFailed") == "False"
    uid = claim["metadata"]["uid"]
    assert {("gpu-0", "bn-1", uid), ("gpu-1", "bn-1", uid)} <= set(fabric.attach_calls)
    held = {d.name: (d.node, d.claim_uid) for d in fabric.inventory.devices}
    assert held["gpu-0"] == held["gpu-1"] == ("bn-1", uid)

    # The claim is done with and deallocated: after the release grace, the devices go back.
    deallocate(apiserver, claim)
    wait_until(
        lambda: {("gpu-0", "bn-1", uid), ("gpu-1", "bn-1", uid)} <= set(fabric.detach_calls), what="release"
    )
    assert all(d.claim_uid is None for d in fabric.inventory.devices if d.name in ("gpu-0", "gpu-1"))


def test_bind_failure_sets_the_failure_condition_and_releases_the_rest(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: InventoryServer
) -> None:
    # A long grace: the pod can never bind with a failed allocation, so release must not wait.
    start_controller(fabric, driver, *binding_flags(release_grace="600"))
    wait_until(lambda: apiserver.slices(driver), what="publication")
    fabric.fail_attach["gpu-3"] = "BindFailed"
    claim = create_claim(apiserver, ["a", "b"])
    allocate(apiserver, claim, driver, {"a": "gpu-2", "b": "gpu-3"}, "bn-2")

    failed = wait_until(
        lambda: (
            (c := condition(apiserver, claim, "gpu-3", f"{driver}/AttachFailed"))
            and c["status"] == "True"
            and c
        ),
        what="AttachFailed=True",
    )
    assert failed["reason"] == "BindFailed" and "injected failure" in failed["message"]
    assert condition_status(apiserver, claim, "gpu-3", f"{driver}/Attached") == "False"
    wait_until(
        lambda: (c := condition(apiserver, claim, "gpu-2", f"{driver}/Attached")) and c["status"] == "True",
        what="gpu-2",
    )

    # The scheduler gives the allocation up: what was attached for it is detached again.
    deallocate(apiserver, claim)
    uid = claim["metadata"]["uid"]
    wait_until(lambda: ("gpu-2", "bn-2", uid) in fabric.detach_calls, what="detach of gpu-2")
    gpu2 = next(d for d in fabric.inventory.devices if d.name == "gpu-2")
    assert gpu2.claim_uid is None and gpu2.node is None


def test_a_busy_device_fails_after_the_busy_timeout(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: InventoryServer
) -> None:
    fabric.update_devices(
        lambda devices: [
            d.model_copy(update={"node": "bn-2", "claim_uid": "someone-else"}) if d.name == "gpu-0" else d
            for d in devices
        ]
    )
    start_controller(fabric, driver, *binding_flags())
    wait_until(lambda: apiserver.slices(driver), what="publication")
    claim = create_claim(apiserver, ["a"])
    allocate(apiserver, claim, driver, {"a": "gpu-0"}, "bn-1")
    failed = wait_until(
        lambda: (
            (c := condition(apiserver, claim, "gpu-0", f"{driver}/AttachFailed"))
            and c["status"] == "True"
            and c
        ),
        what="AttachFailed=True for a busy device",
    )
    assert failed["reason"] == "DeviceBusy"
    assert sum(1 for call in fabric.attach_calls if call[0] == "gpu-0") >= 2  # retried before giving up


def test_claims_without_our_binding_conditions_are_left_alone(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: InventoryServer
) -> None:
    proc = start_controller(fabric, driver, *binding_flags())
    wait_until(lambda: apiserver.slices(driver), what="publication")
    plain = create_claim(apiserver, ["a"])
    allocate(apiserver, plain, driver, {"a": "gpu-1"}, "bn-1", conditions=False)
    foreign = create_claim(apiserver, ["a"])
    allocate(apiserver, foreign, "gpu.example.com", {"a": "gpu-2"}, "bn-1", pool="other")
    # A claim that is ours, created after the other two: once it is handled, they were seen too.
    ours = create_claim(apiserver, ["a"])
    allocate(apiserver, ours, driver, {"a": "gpu-3"}, "bn-2")
    wait_until(lambda: condition(apiserver, ours, "gpu-3", f"{driver}/Attached"), what="our claim handled")
    assert [call[0] for call in fabric.attach_calls] == ["gpu-3"]
    assert device_conditions(apiserver, plain, "gpu-1") == {}
    assert device_conditions(apiserver, foreign, "gpu-2") == {}
    assert proc.alive()


def test_a_device_given_to_another_claim_is_released_without_waiting_for_the_grace(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: InventoryServer
) -> None:
    start_controller(fabric, driver, *binding_flags(release_grace="600"))
    wait_until(lambda: apiserver.slices(driver), what="publication")
    first = create_claim(apiserver, ["a"])
    allocate(apiserver, first, driver, {"a": "gpu-0"}, "bn-1")
    wait_until(
        lambda: (c := condition(apiserver, first, "gpu-0", f"{driver}/Attached")) and c["status"] == "True",
        what="first",
    )
    deallocate(apiserver, first)
    # The scheduler hands gpu-0 to another claim on another node while the first release waits.
    second = create_claim(apiserver, ["a"])
    allocate(apiserver, second, driver, {"a": "gpu-0"}, "bn-2")
    attached = wait_until(
        lambda: (
            (c := condition(apiserver, second, "gpu-0", f"{driver}/Attached")) and c["status"] == "True" and c
        ),
        what="the second claim's attach",
    )
    assert attached["message"].endswith("bn-2 by the fabric")
    assert ("gpu-0", "bn-1", first["metadata"]["uid"]) in fabric.detach_calls
    gpu0 = next(d for d in fabric.inventory.devices if d.name == "gpu-0")
    assert (gpu0.node, gpu0.claim_uid) == ("bn-2", second["metadata"]["uid"])
