"""The API server's rules for shared counters, consumable capacity and shared devices' status, per
release: each case is what ``pkg/apis/resource/validation/validation.go`` refuses, with the field
path and message shape the real server answers with."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.rules import validate_object, validate_update
from kube_standin.apiserver.status import Cause
from kube_standin.apiserver.strategy import prepare_for_create, prepare_for_update
from tests.unit.kube_standin.objects import DRIVER, resource, resource_claim

SLICES = resource("resource.k8s.io", "v1", "resourceslices")
CLAIMS = resource("resource.k8s.io", "v1", "resourceclaims")
K136 = FeatureGates.of("1.36.2")
K135 = FeatureGates.of("1.35.1")
K134 = FeatureGates.of("1.34.3")
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SHARE = "9f3c1a2b-4d5e-4f60-8a7b-1c2d3e4f5a6b"
UNDASHED = SHARE.replace("-", "")


def messages(causes: list[Cause]) -> list[str]:
    return [f"{c.field}: {c.message}" for c in causes]


def slice_obj(
    *, devices: list[dict[str, Any]] | None = None, counters: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": "gpus", "generation": 1, "resourceSliceCount": 2},
    }
    body.update(spec or {"nodeName": "node-a"})
    if devices is not None:
        body["devices"] = devices
    if counters is not None:
        body["sharedCounters"] = counters
    return {"metadata": {"name": "gpus-0"}, "spec": body}


def counter_set(name: str = "gpu-0", count: int = 1) -> dict[str, Any]:
    return {"name": name, "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(count)}}


def consuming(name: str, *sets: tuple[str, int]) -> dict[str, Any]:
    return {
        "name": name,
        "consumesCounters": [
            {"counterSet": s, "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(n)}}
            for s, n in sets
        ],
    }


def shared(policy: dict[str, Any] | None, value: str = "256Gi", multi: bool = True) -> dict[str, Any]:
    capacity: dict[str, Any] = {"value": value}
    if policy is not None:
        capacity["requestPolicy"] = policy
    device: dict[str, Any] = {"name": "cxl-pool-1", "capacity": {"memory": capacity}}
    if multi:
        device["allowMultipleAllocations"] = True
    return device


# -- ResourceSlice, 1.35 and later ----------------------------------------------------------------


def test_a_split_pool_passes() -> None:
    assert validate_object(SLICES, slice_obj(counters=[counter_set()]), K136) == []
    assert validate_object(SLICES, slice_obj(devices=[consuming("gpu-0-mig-0", ("gpu-0", 1))]), K136) == []


@pytest.mark.parametrize(
    "devices", [[consuming("gpu-0-mig-0", ("gpu-0", 1))], []], ids=["devices", "empty-list"]
)
def test_counters_and_devices_in_one_slice_are_refused_from_1_35(devices: list[dict[str, Any]]) -> None:
    combined = slice_obj(devices=devices, counters=[counter_set()])
    assert messages(validate_object(SLICES, combined, K136)) == [
        'spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed'
    ]
    assert messages(validate_object(SLICES, combined, K135)) == messages(
        validate_object(SLICES, combined, K136)
    )


def test_a_counter_slice_still_needs_one_node_selection_field() -> None:
    counters = slice_obj(counters=[counter_set()])
    del counters["spec"]["nodeName"]
    assert messages(validate_object(SLICES, counters, K136)) == [
        (
            "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required"
        )
    ]


def test_counter_limits() -> None:
    nine_sets = slice_obj(counters=[counter_set(f"gpu-{i}") for i in range(9)])
    assert messages(validate_object(SLICES, nine_sets, K136)) == [
        "spec.sharedCounters: Too many: 9: must have at most 8 items"
    ]
    big_set = slice_obj(counters=[counter_set(count=33)])
    assert messages(validate_object(SLICES, big_set, K136)) == [
        "spec.sharedCounters[0].counters: Too many: 33: must have at most 32 items"
    ]
    three = slice_obj(devices=[consuming("d", ("a", 1), ("b", 1), ("c", 1))])
    assert messages(validate_object(SLICES, three, K136)) == [
        "spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items"
    ]
    big_consumption = slice_obj(devices=[consuming("d", ("a", 33))])
    assert messages(validate_object(SLICES, big_consumption, K136)) == [
        "spec.devices[0].consumesCounters[0].counters: Too many: 33: must have at most 32 items"
    ]


def test_64_devices_when_any_consumes_counters_or_has_taints_else_128() -> None:
    plain = [{"name": f"gpu-{i}"} for i in range(65)]
    assert validate_object(SLICES, slice_obj(devices=plain), K136) == []
    counting = [*plain[:64], consuming("gpu-64", ("gpu-0", 1))]
    assert messages(validate_object(SLICES, slice_obj(devices=counting), K136)) == [
        "spec.devices: Too many: 65: must have at most 64 items"
    ]
    tainted: list[dict[str, Any]] = [
        *plain[:64],
        {"name": "gpu-64", "taints": [{"key": "x", "effect": "NoSchedule"}]},
    ]
    assert messages(validate_object(SLICES, slice_obj(devices=tainted), K136)) == [
        "spec.devices: Too many: 65: must have at most 64 items"
    ]
    assert messages(
        validate_object(SLICES, slice_obj(devices=[{"name": f"g-{i}"} for i in range(129)]), K136)
    ) == ["spec.devices: Too many: 129: must have at most 128 items"]


def test_a_taint_has_a_label_name_key_a_label_value_and_an_effect_of_its_release() -> None:
    """``validateDeviceTaint``: ``ValidateLabelName`` for the key, ``validateLabelValue`` for a value
    that is given, the effect required and one of ``validDeviceTaintEffects`` (1.35 added None)."""

    def taint(**fields: Any) -> dict[str, Any]:
        return slice_obj(devices=[{"name": "d", "taints": [fields]}])

    good = taint(key=f"{DRIVER}/drain", value="firmware-2.1", effect="NoExecute")
    assert validate_object(SLICES, good, K136) == []
    assert validate_object(SLICES, taint(key=f"{DRIVER}/drain", effect="NoSchedule"), K134) == []
    assert messages(validate_object(SLICES, taint(key="bad key!", effect="NoSchedule"), K136)) == [
        'spec.devices[0].taints[0].key: Invalid value: "bad key!": name part must consist of alphanumeric '
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 "
        "characters)"
    ]
    assert messages(
        validate_object(SLICES, taint(key="k", value="two words", effect="NoSchedule"), K136)
    ) == [
        'spec.devices[0].taints[0].value: Invalid value: "two words": a valid label must be an empty string '
        "or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
        "character (at most 63 characters)"
    ]
    assert messages(validate_object(SLICES, taint(key="k", value="v" * 64, effect="NoSchedule"), K136))
    assert messages(validate_object(SLICES, taint(key="k", effect="Evict"), K136)) == [
        'spec.devices[0].taints[0].effect: Unsupported value: "Evict": supported values: "NoExecute", '
        '"NoSchedule", "None"'
    ]
    assert validate_object(SLICES, taint(key="k", effect="None"), K136) == []
    assert messages(validate_object(SLICES, taint(key="k", effect="None"), K134)) == [
        'spec.devices[0].taints[0].effect: Unsupported value: "None": supported values: "NoExecute", '
        '"NoSchedule"'
    ]


def test_counter_names_are_dns_labels_and_sets_unique() -> None:
    bad = slice_obj(
        counters=[
            {"name": "Gpu_0", "counters": {"Memory": {"value": "1"}}},
            counter_set("gpu-1"),
            counter_set("gpu-1"),
        ]
    )
    assert messages(validate_object(SLICES, bad, K136)) == [
        f'spec.sharedCounters[0].name: Invalid value: "Gpu_0": {LABEL_MSG}',
        f'spec.sharedCounters[0].counters[Memory]: Invalid value: "Memory": {LABEL_MSG}',
        'spec.sharedCounters[2]: Duplicate value: "gpu-1"',
    ]
    twice = slice_obj(devices=[consuming("d", ("gpu-0", 1), ("gpu-0", 1))])
    assert messages(validate_object(SLICES, twice, K136)) == [
        'spec.devices[0].consumesCounters[1]: Duplicate value: "gpu-0"'
    ]
    empty = slice_obj(counters=[{"name": "", "counters": {}}])
    assert messages(validate_object(SLICES, empty, K136)) == [
        "spec.sharedCounters[0].name: Required value",
        "spec.sharedCounters[0].counters: Required value",
    ]


def test_references_across_slices_are_the_allocators_business() -> None:
    """A consumesCounters naming a set no slice publishes is not the API server's to refuse
    (1.35+): the allocator marks the pool invalid."""
    dangling = slice_obj(devices=[consuming("gpu-0-mig-0", ("nowhere", 1))])
    assert validate_object(SLICES, dangling, K136) == []


# -- consumable capacity --------------------------------------------------------------------------

RP = "spec.devices[0].capacity[memory].requestPolicy"


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (
            shared({"default": "64Gi", "validRange": {"min": "64Gi"}}, multi=False),
            [f"{RP}: Forbidden: allowMultipleAllocations must be true"],
        ),
        (
            shared({"default": "64Gi", "validValues": ["64Gi"], "validRange": {"min": "64Gi"}}),
            [
                (
                    f'{RP}: Forbidden: exactly one policy can be specified, cannot specify "validValues" '
                    f'and "validRange" at the same time'
                )
            ],
        ),
        (
            shared({"validValues": ["64Gi"]}),
            [f"{RP}.default: Required value: required when validValues is defined"],
        ),
        (
            shared({"default": "64Gi", "validValues": ["128Gi", "64Gi"]}),
            [f'{RP}.validValues[1]: Invalid value: "64Gi": values must be sorted in ascending order'],
        ),
        (
            shared({"default": "64Gi", "validValues": ["64Gi", "64Gi"]}),
            [f'{RP}.validValues[1]: Duplicate value: "68719476736"'],
        ),
        (
            shared({"default": "64Gi", "validValues": ["64Gi", "512Gi"]}),
            [f'{RP}.validValues[1]: Invalid value: "512Gi": option is larger than capacity value: 256Gi'],
        ),
        (
            shared({"default": "96Gi", "validValues": ["64Gi", "128Gi"]}),
            [
                (
                    f'{RP}.validValues: Invalid value: "96Gi": default value is not valid according to the '
                    f"requestPolicy"
                )
            ],
        ),
        (
            shared({"default": "1Gi", "validValues": [f"{i}Gi" for i in range(1, 12)]}),
            [
                f"{RP}.validValues: Too many: 11: must have at most 10 items",
                (
                    f'{RP}.validValues: Invalid value: "1Gi": default value is not valid according to the '
                    f"requestPolicy"
                ),
            ],
        ),
    ],
    ids=[
        "not-multi",
        "both-policies",
        "no-default",
        "not-ascending",
        "duplicate",
        "over-capacity",
        "default-not-a-value",
        "eleven-values",
    ],
)
def test_request_policy_valid_values(device: dict[str, Any], expected: list[str]) -> None:
    assert messages(validate_object(SLICES, slice_obj(devices=[device]), K136)) == expected


@pytest.mark.parametrize(
    ("valid_range", "default", "expected"),
    [
        ({"min": "64Gi", "max": "256Gi", "step": "64Gi"}, "64Gi", []),
        ({"min": "64Gi"}, None, [f"{RP}.default: Required value: required when validRange is defined"]),
        (
            {"max": "64Gi"},
            "64Gi",
            [f"{RP}.validRange.min: Required value: required when validRange is defined"],
        ),
        (
            {"min": "512Gi"},
            "512Gi",
            [f'{RP}.validRange.min: Invalid value: "512Gi": min is larger than capacity value: 256Gi'],
        ),
        (
            {"min": "64Gi"},
            "32Gi",
            [f'{RP}.validRange.default: Invalid value: "32Gi": default is less than min: 64Gi'],
        ),
        (
            {"min": "128Gi", "max": "64Gi"},
            "128Gi",
            [
                f'{RP}.validRange.max: Invalid value: "128Gi": min is larger than max: 64Gi',
                f'{RP}.validRange.default: Invalid value: "128Gi": default is more than max: 64Gi',
            ],
        ),
        (
            {"min": "64Gi", "max": "512Gi"},
            "64Gi",
            [f'{RP}.validRange.max: Invalid value: "512Gi": max is larger than capacity value: 256Gi'],
        ),
        (
            {"min": "64Gi", "step": "0"},
            "64Gi",
            [f'{RP}.validRange.step: Invalid value: "0": must be greater than zero'],
        ),
        (
            {"min": "64Gi", "step": "256Gi"},
            "64Gi",
            [
                (
                    f'{RP}.validRange.step: Invalid value: "256Gi": one step 320Gi is larger than capacity '
                    f"value: 256Gi"
                )
            ],
        ),
        (
            {"min": "64Gi", "step": "64Gi"},
            "96Gi",
            [
                (
                    f'{RP}.validRange.step: Invalid value: "96Gi": value is not a multiple of a given step '
                    f"(64Gi) from (64Gi)"
                )
            ],
        ),
        (
            {"min": "64Gi", "max": "160Gi", "step": "64Gi"},
            "64Gi",
            [
                (
                    f'{RP}.validRange.step: Invalid value: "160Gi": value is not a multiple of a given '
                    f"step (64Gi) from (64Gi)"
                )
            ],
        ),
    ],
    ids=[
        "ok",
        "no-default",
        "no-min",
        "min-over-capacity",
        "default-under-min",
        "min-over-max",
        "max-over-capacity",
        "step-zero",
        "step-over-capacity",
        "default-off-grid",
        "max-off-grid",
    ],
)
def test_request_policy_valid_range(
    valid_range: dict[str, Any], default: str | None, expected: list[str]
) -> None:
    policy: dict[str, Any] = {"validRange": valid_range}
    if default is not None:
        policy["default"] = default
    assert messages(validate_object(SLICES, slice_obj(devices=[shared(policy)]), K136)) == expected


# -- ResourceSlice, 1.34 --------------------------------------------------------------------------


def test_1_34_keeps_counters_beside_devices_and_checks_the_references_there() -> None:
    combined = slice_obj(devices=[consuming("gpu-0-mig-0", ("gpu-0", 1))], counters=[counter_set(count=2)])
    assert validate_object(SLICES, combined, K134) == []
    dangling = slice_obj(
        devices=[
            consuming("a", ("gpu-9", 1)),
            {
                "name": "b",
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory-slice-9": {"value": "1"}}}],
            },
        ],
        counters=[counter_set(count=2)],
    )
    assert messages(validate_object(SLICES, dangling, K134)) == [
        (
            'spec.devices[0].consumesCounters[0].counterSet: Invalid value: "gpu-9": must reference a '
            "counterSet defined in the ResourceSlice sharedCounters"
        ),
        (
            'spec.devices[1].consumesCounters[0].counters: Invalid value: "memory-slice-9": must '
            "reference a counter defined in the ResourceSlice sharedCounters"
        ),
    ]


def test_1_34_limits() -> None:
    too_many = slice_obj(counters=[counter_set(f"gpu-{i}", 11) for i in range(3)])
    assert messages(validate_object(SLICES, too_many, K134)) == [
        "spec.sharedCounters: Invalid value: 33: the total number of shared counters must not exceed 32"
    ]
    # 65 devices with counters: 1.34 allows 128
    many = slice_obj(devices=[consuming(f"d-{i}", ("gpu-0", 1)) for i in range(65)], counters=[counter_set()])
    assert validate_object(SLICES, many, K134) == []
    assert "spec.devices: Too many: 65: must have at most 64 items" in messages(
        validate_object(
            SLICES, slice_obj(devices=[consuming(f"d-{i}", ("gpu-0", 1)) for i in range(65)]), K136
        )
    )
    taints = [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(5)]
    assert messages(validate_object(SLICES, slice_obj(devices=[{"name": "d", "taints": taints}]), K134)) == [
        "spec.devices[0].taints: Too many: 5: must have at most 4 items"
    ]
    assert validate_object(SLICES, slice_obj(devices=[{"name": "d", "taints": taints}]), K136) == []
    sets = [counter_set(f"s{i}", 4) for i in range(8)]
    heavy = [consuming(f"d-{i}", *((f"s{j}", 4) for j in range(8))) for i in range(33)]
    assert messages(validate_object(SLICES, slice_obj(devices=heavy, counters=sets), K134)) == [
        "spec.devices: Invalid value: 1056: the total number of counters in devices must not exceed 1024"
    ]


# -- ResourceClaim --------------------------------------------------------------------------------


def _allocated(share_id: str | None = SHARE, **result: Any) -> dict[str, Any]:
    claim = resource_claim()
    entry: dict[str, Any] = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "cxl",
        "device": "cxl-pool-1",
        **result,
    }
    if share_id is not None:
        entry["shareID"] = share_id
        entry["consumedCapacity"] = {"memory": "64Gi"}
    claim["status"] = {"allocation": {"devices": {"results": [entry]}}}
    return claim


@pytest.mark.parametrize(
    ("share_id", "expected"),
    [
        (SHARE, []),
        (
            SHARE.upper(),
            [
                (
                    f'status.allocation.devices.results[0].shareID: Invalid value: "{SHARE.upper()}": uid '
                    f"must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with "
                    f"lowercase hexadecimal characters"
                )
            ],
        ),
        (
            "share-1",
            [
                (
                    'status.allocation.devices.results[0].shareID: Invalid value: "share-1": error '
                    "validating uid: invalid UUID length: 7"
                )
            ],
        ),
        (
            UNDASHED,
            [
                (
                    f'status.allocation.devices.results[0].shareID: Invalid value: "{UNDASHED}": '
                    "uid must be in RFC 4122 normalized form, "
                    "`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters"
                )
            ],
        ),
        (
            SHARE[:-1] + "g",
            [
                (
                    f'status.allocation.devices.results[0].shareID: Invalid value: "{SHARE[:-1]}g": error '
                    f"validating uid: invalid UUID format"
                )
            ],
        ),
    ],
    ids=["lowercase", "uppercase", "not-a-uuid", "no-dashes", "bad-hex"],
)
def test_a_share_id_is_a_normalized_uuid(share_id: str, expected: list[str]) -> None:
    assert (
        messages(validate_update(CLAIMS, _allocated(share_id), resource_claim(), "status", K136)) == expected
    )


def test_device_status_names_the_device_and_its_share() -> None:
    old = _allocated()
    matching = copy.deepcopy(old)
    matching["status"]["devices"] = [
        {"driver": DRIVER, "pool": "cxl", "device": "cxl-pool-1", "shareID": SHARE}
    ]
    assert validate_update(CLAIMS, matching, old, "status", K136) == []
    no_share = copy.deepcopy(old)
    no_share["status"]["devices"] = [{"driver": DRIVER, "pool": "cxl", "device": "cxl-pool-1"}]
    assert messages(validate_update(CLAIMS, no_share, old, "status", K136)) == [
        f"status.devices[0]: Invalid value: {DRIVER}/cxl/cxl-pool-1: must be an allocated device in the claim"
    ]
    other = "0b5e8d6c-1f2a-4b3c-9d4e-5f6a7b8c9d0e"
    wrong_share = copy.deepcopy(old)
    wrong_share["status"]["devices"] = [
        {"driver": DRIVER, "pool": "cxl", "device": "cxl-pool-1", "shareID": other}
    ]
    assert messages(validate_update(CLAIMS, wrong_share, old, "status", K136)) == [
        (
            f"status.devices[0]: Invalid value: {DRIVER}/cxl/cxl-pool-1/{other}: must be an allocated "
            f"device in the claim"
        )
    ]
    twice = copy.deepcopy(matching)
    twice["status"]["devices"] *= 2
    assert messages(validate_update(CLAIMS, twice, old, "status", K136)) == [
        f"status.devices[1]: Duplicate value: {DRIVER}/cxl/cxl-pool-1/{SHARE}"
    ]


def _condition(kind: str, status: str = "True", reason: str = "Ready") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def test_device_status_conditions_and_data() -> None:
    old = _allocated()
    claim = copy.deepcopy(old)
    entry = {"driver": DRIVER, "pool": "cxl", "device": "cxl-pool-1", "shareID": SHARE}
    claim["status"]["devices"] = [
        {**entry, "conditions": [_condition(f"fabric-dra.io/c{i}") for i in range(9)]}
    ]
    assert messages(validate_update(CLAIMS, claim, old, "status", K136)) == [
        "status.devices[0].conditions: Too many: 9: must have at most 8 items"
    ]
    claim["status"]["devices"] = [
        {**entry, "conditions": [_condition("Ready", "Maybe"), _condition("Ready", reason="not ok")]}
    ]
    found = messages(validate_update(CLAIMS, claim, old, "status", K136))
    assert found[0] == (
        'status.devices[0].conditions[0].status: Unsupported value: "Maybe": supported values: '
        '"False", "True", "Unknown"'
    )
    assert found[1] == 'status.devices[0].conditions[1].type: Duplicate value: "Ready"'
    assert found[2].startswith(
        'status.devices[0].conditions[1].reason: Invalid value: "not ok": a condition reason must start'
    )
    claim["status"]["devices"] = [{**entry, "data": {"blob": "x" * (10 * 1024)}}]
    assert messages(validate_update(CLAIMS, claim, old, "status", K136)) == [
        "status.devices[0].data: Too long: may not be more than 10240 bytes"
    ]
    claim["status"]["devices"] = [{**entry, "data": ["not", "an", "object"]}]
    assert messages(validate_update(CLAIMS, claim, old, "status", K136)) == [
        'status.devices[0].data: Invalid value: "<value omitted>": must be a valid JSON object'
    ]
    claim["status"]["devices"] = [{**entry, "networkData": {"ips": ["10.0.0.1/24", "10.0.0.1"]}}]
    assert messages(validate_update(CLAIMS, claim, old, "status", K136)) == [
        (
            'status.devices[0].networkData.ips[1]: Invalid value: "10.0.0.1": must be a valid address in '
            "CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)"
        )
    ]


def test_a_constraint_needs_one_attribute() -> None:
    claim = resource_claim()
    claim["spec"]["devices"]["constraints"] = [{"requests": ["gpu"]}, {"distinctAttribute": "switch"}]
    assert messages(validate_object(CLAIMS, claim, K136)) == [
        (
            'spec.devices.constraints[0]: Required value: exactly one of "matchAttribute" or '
            '"distinctAttribute" is required, but multiple fields are set'
        ),
        (
            'spec.devices.constraints[1].distinctAttribute: Invalid value: "switch": a fully qualified '
            "name must be a domain and a name separated by a slash"
        ),
    ]
    assert (
        messages(validate_object(CLAIMS, {**claim}, K135))[0]
        == "spec.devices.constraints[0].matchAttribute: Required value"
    )


# -- strategy: fields of a gate that is off are dropped ------------------------------------------


def _capacity_claim() -> dict[str, Any]:
    claim = resource_claim()
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "64Gi"}}
    claim["spec"]["devices"]["constraints"] = [{"distinctAttribute": f"{DRIVER}/switch"}]
    return claim


def test_a_1_35_server_drops_capacity_requests_and_share_fields_unless_in_use() -> None:
    created = _capacity_claim()
    prepare_for_create(CLAIMS, created, K135)
    assert "capacity" not in created["spec"]["devices"]["requests"][0]["exactly"]
    assert "distinctAttribute" not in created["spec"]["devices"]["constraints"][0]
    kept = _capacity_claim()
    prepare_for_create(CLAIMS, kept, K136)
    assert kept == _capacity_claim()

    old = resource_claim()
    update = _allocated()
    update["status"]["devices"] = [
        {"driver": DRIVER, "pool": "cxl", "device": "cxl-pool-1", "shareID": SHARE}
    ]
    prepare_for_update(CLAIMS, update, old, K135)
    (result,) = update["status"]["allocation"]["devices"]["results"]
    assert "shareID" not in result and "consumedCapacity" not in result
    assert "shareID" not in update["status"]["devices"][0]
    # once in use, an update keeps them
    in_use = _allocated()
    again = copy.deepcopy(in_use)
    prepare_for_update(CLAIMS, again, in_use, K135)
    assert again["status"]["allocation"]["devices"]["results"][0]["shareID"] == SHARE
