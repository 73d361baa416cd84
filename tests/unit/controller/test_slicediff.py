"""The rewrite log names the differing fields of a stored and a rendered slice."""

from __future__ import annotations

from dra_driver.controller.slicediff import differences


def _spec(health: str, memory: str = "80Gi") -> dict[str, object]:
    return {
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists"}]}]},
        "devices": {
            "gpu-0": {
                "attributes": {"fabric-dra.io/health": {"string": "Healthy"}},
                "capacity": {"memory": {"value": memory}},
            },
            "gpu-1": {"attributes": {"fabric-dra.io/health": {"string": health}}},
        },
    }


def test_equal_forms_have_no_difference() -> None:
    assert differences(_spec("Healthy"), _spec("Healthy")) == []


def test_a_changed_attribute_is_named_by_device_and_key() -> None:
    found = differences(_spec("Healthy"), _spec("Critical"))
    assert found == [
        "devices[gpu-1].attributes[fabric-dra.io/health].string: stored 'Healthy', rendered 'Critical'"
    ]


def test_a_field_present_on_one_side_only_says_absent() -> None:
    stored = _spec("Healthy")
    rendered = _spec("Healthy")
    rendered["devices"]["gpu-0"]["allowMultipleAllocations"] = True  # type: ignore[index]
    assert differences(stored, rendered) == [
        "devices[gpu-0].allowMultipleAllocations: stored absent, rendered True"
    ]


def test_lists_of_another_length_are_one_difference_and_values_are_shortened() -> None:
    found = differences({"taints": [{"key": "a" * 200}]}, {"taints": []})
    assert len(found) == 1
    assert found[0].startswith("taints: stored [{'key': 'aaa")
    assert found[0].endswith("…, rendered []")
    assert len(found[0]) < 120


def test_the_number_of_differences_is_capped() -> None:
    stored = {f"f{i}": i for i in range(20)}
    rendered = {f"f{i}": i + 1 for i in range(20)}
    found = differences(stored, rendered, limit=3)
    assert found == ["f0: stored 0, rendered 1", "f1: stored 1, rendered 2", "f10: stored 10, rendered 11"]
