"""Objects the API test server's tests write: shaped like fabric-dra's own, built in one place."""

from __future__ import annotations

import copy
from typing import Any

DRIVER = "fabric-dra.io"
ATTRIBUTES = (
    "type",
    "vendor",
    "vendorID",
    "deviceID",
    "model",
    "serial",
    "uuid",
    "fabric",
    "switch",
    "port",
    "health",
)

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


def device(index: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {f"{DRIVER}/{name}": {"string": f"{name}-{index}"} for name in ATTRIBUTES}
    attributes[f"{DRIVER}/pcieGen"] = {"int": 5}
    attributes[f"{DRIVER}/pcieWidth"] = {"int": 16}
    return {
        "name": f"gpu-{index}",
        "attributes": attributes,
        "capacity": {f"{DRIVER}/memory": {"value": "80Gi"}},
    }


def resource_slice(name: str = "fabric-pcie-0", devices: int = 128, generation: int = 1) -> dict[str, Any]:
    """A pool ResourceSlice as the publisher writes it (node selector, up to 128 devices)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"fabric-dra.io/pool": "fabric-pcie"}},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "fabric-pcie", "generation": generation, "resourceSliceCount": 1},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "fabric-dra.io/fabric", "operator": "In", "values": ["pcie"]}
                        ]
                    }
                ]
            },
            "devices": [device(i) for i in range(devices)],
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
