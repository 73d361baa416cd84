"""Objects the API test server's tests write: shaped like fabric-dra's own, built in one place."""

from __future__ import annotations

import copy
from typing import Any

from fabric_dra_testbed.standins import SLICE_ATTRIBUTES as ATTRIBUTES
from fabric_dra_testbed.standins import pool_device as device
from fabric_dra_testbed.standins import resource_slice
from kube_standin.apiserver.registry import ResourceType, find_resource
from plumbing import DEFAULT_DRIVER_NAME

__all__ = [
    "ARTICLE_TEMPLATE_V1BETA1",
    "ATTRIBUTES",
    "DRIVER",
    "allocation",
    "device",
    "resource",
    "resource_claim",
    "resource_slice",
    "without",
]

DRIVER = DEFAULT_DRIVER_NAME


def resource(group: str, version: str, plural: str) -> ResourceType:
    """The registry's entry for a resource the tests rely on being served."""
    found = find_resource(group, version, plural)
    if found is None:
        raise LookupError(f"the API test server does not serve {group or 'core'}/{version} {plural}")
    return found


# The seed article's template as written for clusters that serve resource.k8s.io/v1beta1:
# only its apiVersion changes (it was written for v1alpha3).
ARTICLE_TEMPLATE_V1BETA1: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1beta1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "cohdi-accelerator-template", "namespace": "agent-platform"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [{"name": "dedicated-accelerator", "deviceClassName": "cohdi-pcie-device"}]
            }
        }
    },
}


def resource_claim(name: str = "claim-0", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]}},
    }


def allocation(driver: str = DRIVER, device_name: str = "gpu-0") -> dict[str, Any]:
    return {
        "devices": {
            "results": [{"request": "gpu", "driver": driver, "pool": "fabric-pcie", "device": device_name}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
            ]
        },
    }


def without(obj: dict[str, Any], *path: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out
