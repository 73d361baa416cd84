"""DeviceTaintRule as the API test server serves it (``ValidateDeviceTaintRule`` and its update and
status rules, ``pkg/apis/resource/validation/validation.go``), and the rules' taints merged into
the devices they select as the scheduler's device taint tracker does."""

from __future__ import annotations

from typing import Any

from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.registry import find_resource
from kube_standin.apiserver.rules import validate_object, validate_update
from kube_standin.cluster.taint_tracker import merged_slices, rule_taints
from tests.unit.kube_standin.objects import DRIVER

RULES = find_resource("resource.k8s.io", "v1beta2", "devicetaintrules")
K136_ON = FeatureGates.of("1.36.2", {"DRADeviceTaintRules": True})
K134 = FeatureGates.of("1.34.3", {"DRADeviceTaintRules": True})


def rule(selector: dict[str, Any] | None = None, **taint: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "taint": {"key": f"{DRIVER}/drain", "value": "fw", "effect": "NoSchedule", **taint}
    }
    if selector is not None:
        spec["deviceSelector"] = selector
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "r"},
        "spec": spec,
    }


def fields(causes: list[Any]) -> list[str]:
    return [c.field for c in causes]


def test_served_only_with_the_gate_and_in_the_versions_of_the_release() -> None:
    assert RULES is not None
    assert RULES.served_in("v1beta2", K136_ON) and not RULES.served_in("v1", K136_ON)
    assert not RULES.served_in("v1beta2", FeatureGates.of("1.36.2"))  # off by default in 1.36
    assert RULES.served_in("v1", FeatureGates.of("1.37.0"))  # on, and in v1, from 1.37
    assert not RULES.served_in("v1beta2", K134)  # 1.34 served it in v1alpha3 only


def test_selector_fields_and_taint_are_checked_as_the_real_server_does() -> None:
    assert RULES is not None
    assert (
        validate_object(RULES, rule({"driver": DRIVER, "pool": "fabric-pcie", "device": "gpu0"}), K136_ON)
        == []
    )
    assert validate_object(RULES, rule(), K136_ON) == []  # no selector: valid, matches nothing
    bad = rule({"driver": "Not_A_Driver", "pool": "a//b", "device": "GPU_0"}, key="bad key", value="x y")
    assert fields(validate_object(RULES, bad, K136_ON)) == [
        "spec.deviceSelector.driver",
        "spec.deviceSelector.pool",
        "spec.deviceSelector.device",
        "spec.taint.key",
        "spec.taint.value",
    ]
    assert fields(validate_object(RULES, rule(effect="PreferNoSchedule"), K136_ON)) == ["spec.taint.effect"]
    assert fields(validate_object(RULES, rule(effect="None"), K134)) == [
        "spec.taint.effect"
    ]  # None from 1.35


def test_status_holds_at_most_eight_valid_conditions() -> None:
    assert RULES is not None
    condition = {
        "type": "EvictionInProgress",
        "status": "False",
        "reason": "Idle",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    old = rule()
    ok = {**old, "status": {"conditions": [condition]}}
    assert validate_update(RULES, ok, old, "status", K136_ON) == []
    many = {**old, "status": {"conditions": [{**condition, "type": f"T{i}"} for i in range(9)]}}
    assert fields(validate_update(RULES, many, old, "status", K136_ON)) == ["status.conditions"]
    broken = {**old, "status": {"conditions": [{**condition, "status": "Maybe", "reason": ""}]}}
    assert fields(validate_update(RULES, broken, old, "status", K136_ON)) == [
        "status.conditions[0].status",
        "status.conditions[0].reason",
    ]


def test_rule_taints_are_merged_into_the_devices_they_select() -> None:
    rules = [
        rule({"driver": DRIVER, "pool": "p", "device": "gpu0"})
        | {"metadata": {"name": "a", "resourceVersion": "7"}},
        rule({"pool": "p"}, key=f"{DRIVER}/all") | {"metadata": {"name": "b", "resourceVersion": "8"}},
        rule(None, key=f"{DRIVER}/none") | {"metadata": {"name": "c", "resourceVersion": "9"}},
    ]
    assert [t["key"] for t in rule_taints(rules, DRIVER, "p", "gpu0")] == [f"{DRIVER}/drain", f"{DRIVER}/all"]
    assert [t["key"] for t in rule_taints(rules, DRIVER, "q", "gpu0")] == []
    own = {"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}
    slices: list[dict[str, Any]] = [
        {
            "metadata": {"name": "s", "resourceVersion": "3"},
            "spec": {"driver": DRIVER, "pool": {"name": "p"}, "devices": [{"name": "gpu0", "taints": [own]}]},
        }
    ]
    (merged,) = merged_slices(slices, rules)
    assert [t["key"] for t in merged["spec"]["devices"][0]["taints"]] == [
        f"{DRIVER}/unhealthy",
        f"{DRIVER}/drain",
        f"{DRIVER}/all",
    ]
    assert merged["metadata"]["resourceVersion"].startswith("3+")  # a new view for the scheduler's caches
    assert slices[0]["spec"]["devices"][0]["taints"] == [own]  # the informer's object is left alone
