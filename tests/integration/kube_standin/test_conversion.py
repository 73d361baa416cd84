"""resource.k8s.io served as v1, v1beta2 and v1beta1 from one v1 storage: the article's
manifest, written for v1beta1 clusters, applies and reads back in every version."""

from __future__ import annotations

import copy

from plumbing.kube import KubeClient
from plumbing.kube.resources import (
    EVENTS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Resource,
)
from tests.unit.kube_standin.objects import ARTICLE_TEMPLATE_V1BETA1, resource_claim, resource_slice

CORE_EVENTS = Resource("", "v1", "events", "Event", True)


async def test_the_articles_template_as_written_for_v1beta1(bkube: KubeClient, bns: str) -> None:
    template = copy.deepcopy(ARTICLE_TEMPLATE_V1BETA1)
    template["metadata"]["namespace"] = bns
    beta = RESOURCE_CLAIM_TEMPLATES.with_version("v1beta1")
    created = await bkube.create(beta, template)
    assert created["apiVersion"] == "resource.k8s.io/v1beta1"
    name = template["metadata"]["name"]
    as_v1 = await bkube.get(RESOURCE_CLAIM_TEMPLATES, name, bns)
    assert as_v1["apiVersion"] == "resource.k8s.io/v1"
    assert as_v1["spec"]["spec"]["devices"]["requests"] == [
        {
            "name": "dedicated-accelerator",
            "exactly": {"deviceClassName": "cohdi-pcie-device", "allocationMode": "ExactCount", "count": 1},
        }
    ]
    as_beta2 = await bkube.get(RESOURCE_CLAIM_TEMPLATES.with_version("v1beta2"), name, bns)
    assert as_beta2["spec"] == as_v1["spec"]
    as_beta = await bkube.get(beta, name, bns)
    assert as_beta["spec"]["spec"]["devices"]["requests"][0]["deviceClassName"] == "cohdi-pcie-device"
    assert as_beta["metadata"] == as_v1["metadata"]


async def test_a_claim_written_in_v1_reads_in_v1beta1_and_updates_back(bkube: KubeClient, bns: str) -> None:
    await bkube.create(RESOURCE_CLAIMS, resource_claim("claim", bns))
    beta = RESOURCE_CLAIMS.with_version("v1beta1")
    seen = await bkube.get(beta, "claim", bns)
    request = seen["spec"]["devices"]["requests"][0]
    assert request == {
        "name": "gpu",
        "deviceClassName": "fabric-gpu",
        "allocationMode": "ExactCount",
        "count": 1,
    }
    seen["metadata"]["labels"] = {"via": "v1beta1"}
    await bkube.replace(beta, seen)
    stored = await bkube.get(RESOURCE_CLAIMS, "claim", bns)
    assert stored["metadata"]["labels"] == {"via": "v1beta1"}
    assert stored["spec"] == resource_claim()["spec"] | {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": "fabric-gpu", "allocationMode": "ExactCount", "count": 1},
                }
            ]
        }
    }


async def test_slices_read_with_basic_devices_in_v1beta1(bkube: KubeClient) -> None:
    await bkube.create(RESOURCE_SLICES, resource_slice("conv-slice", devices=2))
    beta = await bkube.get(RESOURCE_SLICES.with_version("v1beta1"), "conv-slice")
    assert beta["spec"]["devices"][1]["basic"]["attributes"]["fabric-dra.io/type"] == {"string": "type-1"}
    listed = await bkube.list(
        RESOURCE_SLICES.with_version("v1beta1"), field_selector="metadata.name=conv-slice"
    )
    assert listed["kind"] == "ResourceSliceList" and listed["apiVersion"] == "resource.k8s.io/v1beta1"
    assert "basic" in listed["items"][0]["spec"]["devices"][0]


async def test_events_k8s_io_and_core_events_are_one_collection(bkube: KubeClient, bns: str) -> None:
    await bkube.create(
        EVENTS,
        {
            "metadata": {"name": "attached", "namespace": bns},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"kind": "Pod", "name": "worker", "namespace": bns},
            "reason": "DeviceAttached",
            "note": "gpu-0 attached to node-a",
            "type": "Normal",
            "action": "Attach",
            "reportingController": "fabric-dra.io/plugin",
            "reportingInstance": "node-a",
        },
    )
    core = await bkube.get(CORE_EVENTS, "attached", bns)
    assert core["involvedObject"]["name"] == "worker" and core["message"] == "gpu-0 attached to node-a"
    selected = await bkube.list(
        CORE_EVENTS, bns, field_selector="involvedObject.name=worker,reason=DeviceAttached"
    )
    assert [e["metadata"]["name"] for e in selected["items"]] == ["attached"]
