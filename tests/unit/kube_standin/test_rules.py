"""What the real API server rejects beyond the schemas: names, limits, exclusive fields, immutability."""

from __future__ import annotations

import copy

from kube_standin.apiserver.rules import validate_object, validate_update
from tests.unit.kube_standin.objects import allocation, resource, resource_claim, resource_slice

SLICES = resource("resource.k8s.io", "v1", "resourceslices")
CLAIMS = resource("resource.k8s.io", "v1", "resourceclaims")
CLASSES = resource("resource.k8s.io", "v1", "deviceclasses")


def fields(causes: list) -> list[str]:  # type: ignore[type-arg]
    return [c.field for c in causes]


def test_a_publisher_slice_passes() -> None:
    assert validate_object(SLICES, resource_slice()) == []


def test_slice_limits_and_exclusive_node_selection() -> None:
    too_many = resource_slice(devices=129)
    assert "spec.devices" in fields(validate_object(SLICES, too_many))
    both = resource_slice(devices=1)
    both["spec"]["nodeName"] = "node-a"
    causes = validate_object(SLICES, both)
    assert fields(causes) == ["spec"] and "multiple fields are set" in causes[0].message
    dup = resource_slice(devices=2)
    dup["spec"]["devices"][1]["name"] = "gpu-0"
    # validateSet of 1.35 and later reports the duplicate entry (1.34: its name field)
    assert fields(validate_object(SLICES, dup)) == ["spec.devices[1]"]
    bad = resource_slice(devices=1)
    bad["spec"]["devices"][0]["name"] = "GPU_0"
    bad["spec"]["devices"][0]["attributes"]["fabric-dra.io/two"] = {"string": "a", "int": 1}
    bad["spec"]["devices"][0]["attributes"]["fabric-dra.io/long"] = {"string": "x" * 65}
    bad["spec"]["devices"][0]["attributes"]["bad-name!"] = {"bool": True}
    assert sorted(fields(validate_object(SLICES, bad))) == [
        "spec.devices[0].attributes[bad-name!]",
        "spec.devices[0].attributes[fabric-dra.io/long].string",
        "spec.devices[0].attributes[fabric-dra.io/two]",
        "spec.devices[0].name",
    ]


def test_slice_driver_pool_and_node_are_immutable() -> None:
    old = resource_slice(devices=1)
    new = copy.deepcopy(old)
    new["spec"]["pool"]["name"] = "other"
    new["spec"]["pool"]["generation"] = 2
    assert fields(validate_update(SLICES, new, old, None)) == ["spec.pool.name"]


def test_claim_rules() -> None:
    assert validate_object(CLAIMS, resource_claim()) == []
    neither = resource_claim()
    neither["spec"]["devices"]["requests"] = [{"name": "gpu"}]
    assert fields(validate_object(CLAIMS, neither)) == ["spec.devices.requests[0]"]
    bad_cel = resource_claim()
    bad_cel["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.x =="}}
    ]
    assert fields(validate_object(CLAIMS, bad_cel)) == [
        "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    ]
    old = resource_claim()
    changed = copy.deepcopy(old)
    changed["spec"]["devices"]["requests"][0]["name"] = "other"
    assert fields(validate_update(CLAIMS, changed, old, None)) == ["spec"]


def test_claim_status_rules() -> None:
    old = resource_claim()
    allocated = copy.deepcopy(old)
    allocated["status"] = {
        "allocation": allocation(),
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
    }
    assert validate_update(CLAIMS, allocated, old, "status") == []
    moved = copy.deepcopy(allocated)
    moved["status"]["allocation"] = allocation(device_name="gpu-9")
    assert fields(validate_update(CLAIMS, moved, allocated, "status")) == ["status.allocation"]
    orphan = copy.deepcopy(old)
    orphan["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    assert fields(validate_update(CLAIMS, orphan, old, "status")) == ["status.reservedFor"]
    unknown_request = copy.deepcopy(old)
    unknown_request["status"] = {"allocation": allocation()}
    unknown_request["status"]["allocation"]["devices"]["results"][0]["request"] = "nope"
    assert fields(validate_update(CLAIMS, unknown_request, old, "status")) == [
        "status.allocation.devices.results[0].request"
    ]


def test_metadata_names_and_labels() -> None:
    cls = {"metadata": {"name": "Fabric_GPU", "labels": {"ok": "yes", "bad key": "x", "k": "-x"}}, "spec": {}}
    assert sorted(fields(validate_object(CLASSES, cls))) == [
        "metadata.labels[bad key]",
        "metadata.labels[k]",
        "metadata.name",
    ]
