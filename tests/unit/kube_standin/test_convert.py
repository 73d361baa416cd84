"""resource.k8s.io v1beta1/v1beta2 <-> v1 conversion, events.k8s.io <-> core Events, defaults."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from kube_standin.apiserver.convert import apply_defaults, from_storage, to_storage
from kube_standin.apiserver.schemas import SchemaCatalog
from tests.unit.kube_standin.objects import ARTICLE_TEMPLATE_V1BETA1, resource, resource_slice

TEMPLATES = resource("resource.k8s.io", "v1", "resourceclaimtemplates")
SLICES = resource("resource.k8s.io", "v1", "resourceslices")
CORE_EVENTS = resource("", "v1", "events")
EVENTS = resource("events.k8s.io", "v1", "events")


def test_the_article_template_converts_to_v1_and_back() -> None:
    stored = to_storage(TEMPLATES, "v1beta1", ARTICLE_TEMPLATE_V1BETA1)
    apply_defaults(TEMPLATES, stored)
    assert stored["apiVersion"] == "resource.k8s.io/v1"
    assert stored["spec"]["spec"]["devices"]["requests"] == [
        {
            "name": "dedicated-accelerator",
            "exactly": {"deviceClassName": "cohdi-pcie-device", "allocationMode": "ExactCount", "count": 1},
        }
    ]
    catalog = SchemaCatalog()
    assert catalog.validate(stored) == []
    back = from_storage(TEMPLATES, "v1beta1", stored)
    assert back["spec"]["spec"]["devices"]["requests"] == [
        {
            "name": "dedicated-accelerator",
            "deviceClassName": "cohdi-pcie-device",
            "allocationMode": "ExactCount",
            "count": 1,
        }
    ]
    assert catalog.validate(back) == []
    assert from_storage(TEMPLATES, "v1beta2", stored)["spec"] == stored["spec"]


def test_first_available_requests_are_the_same_in_both_versions() -> None:
    template = copy.deepcopy(ARTICLE_TEMPLATE_V1BETA1)
    template["spec"]["spec"]["devices"]["requests"] = [
        {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "fabric-gpu", "count": 2}]}
    ]
    stored = to_storage(TEMPLATES, "v1beta1", template)
    assert (
        stored["spec"]["spec"]["devices"]["requests"][0] == template["spec"]["spec"]["devices"]["requests"][0]
    )
    apply_defaults(TEMPLATES, stored)
    assert (
        stored["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["allocationMode"]
        == "ExactCount"
    )


def test_slice_devices_wrap_in_basic_for_v1beta1() -> None:
    v1 = resource_slice(devices=2)
    beta = from_storage(SLICES, "v1beta1", v1)
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"
    assert set(beta["spec"]["devices"][0]) == {"name", "basic"}
    assert beta["spec"]["devices"][0]["basic"]["capacity"] == v1["spec"]["devices"][0]["capacity"]
    assert SchemaCatalog(["1.34"]).validate(beta) == []
    assert to_storage(SLICES, "v1beta1", beta) == v1


def test_events_k8s_io_is_a_view_of_core_events() -> None:
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e1", "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "p"},
        "note": "attached gpu-0",
        "reason": "Attached",
        "reportingController": "fabric-dra.io/plugin",
        "reportingInstance": "node-a",
        "type": "Normal",
        "action": "Attach",
    }
    core = to_storage(EVENTS, "v1", event)
    assert core["apiVersion"] == "v1"
    assert core["involvedObject"] == {"kind": "Pod", "name": "p"}
    assert core["message"] == "attached gpu-0" and core["reportingComponent"] == "fabric-dra.io/plugin"
    assert SchemaCatalog(["1.34"]).validate(core) == []
    assert from_storage(EVENTS, "v1", core) == event


def test_a_device_taint_gets_the_time_of_the_write_unless_it_has_one() -> None:
    """``SetDefaults_DeviceTaint``: ``timeAdded`` filled in (to the second), a given one kept, and
    the written document's own taints left as they were."""
    written = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "d.example.com",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [
                {"name": "a", "taints": [{"key": "d.example.com/x", "effect": "NoSchedule"}]},
                {
                    "name": "b",
                    "taints": [
                        {"key": "d.example.com/y", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"}
                    ],
                },
                {"name": "c"},
            ],
        },
    }
    sent = copy.deepcopy(written)
    before = datetime.now(UTC).replace(microsecond=0)
    stored = to_storage(SLICES, "v1", written)
    apply_defaults(SLICES, stored)
    a, b, c = stored["spec"]["devices"]
    added = datetime.strptime(a["taints"][0]["timeAdded"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= added <= datetime.now(UTC)
    assert b["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z"
    assert c == {"name": "c"}
    assert written == sent
    assert SchemaCatalog().validate(stored) == []


def test_a_slice_is_stored_with_every_quantity_canonical() -> None:
    """resource.Quantity is decoded and encoded again (Quantity.String()): a slice written with
    "1024Mi" reads back "1Gi", a plain 10^9 reads back "1G", and the original is never edited."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "sharedCounters": [
                {"name": "gpu0", "counters": {"memory": {"value": "81920Mi"}, "sm": {"value": "1000"}}}
            ],
            "devices": [
                {
                    "name": "d",
                    "capacity": {
                        "x/memory": {
                            "value": "1024Mi",
                            "requestPolicy": {
                                "default": "0.5Gi",
                                "validRange": {"min": "512Mi", "max": "1000000000", "step": "1000e0"},
                            },
                        },
                        "x/storage": {"value": "1000000000"},
                    },
                    "consumesCounters": [
                        {"counterSet": "gpu0", "counters": {"memory": {"value": "10240Mi"}}}
                    ],
                }
            ],
        },
    }
    written = copy.deepcopy(obj)
    apply_defaults(SLICES, obj)
    device = obj["spec"]["devices"][0]
    assert device["capacity"]["x/memory"] == {
        "value": "1Gi",
        "requestPolicy": {"default": "512Mi", "validRange": {"min": "512Mi", "max": "1G", "step": "1e3"}},
    }
    assert device["capacity"]["x/storage"] == {"value": "1G"}
    assert device["consumesCounters"][0]["counters"] == {"memory": {"value": "10Gi"}}
    assert obj["spec"]["sharedCounters"][0]["counters"] == {
        "memory": {"value": "80Gi"},
        "sm": {"value": "1k"},
    }
    assert written["spec"]["devices"][0]["capacity"]["x/memory"]["value"] == "1024Mi"


def test_a_claims_capacity_requests_and_consumed_capacity_are_stored_canonical() -> None:
    claims = resource("resource.k8s.io", "v1", "resourceclaims")
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {"deviceClassName": "m", "capacity": {"requests": {"x/memory": "2048Mi"}}},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": "x",
                            "pool": "p",
                            "device": "d",
                            "consumedCapacity": {"x/memory": "2048Mi"},
                        }
                    ]
                }
            }
        },
    }
    apply_defaults(claims, obj)
    assert obj["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {"x/memory": "2Gi"}
    assert obj["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] == {"x/memory": "2Gi"}
