"""Small ResourceSlice / DeviceClass / claim builders shared by the selection tests."""

from __future__ import annotations

from typing import Any

from dra_driver.selection.model import DeviceClass, Node, ResourceClaimSpec, ResourceSlice

DRIVER = "fabric-dra.io"
GPU_CLASS = 'device.driver == "fabric-dra.io" && device.attributes["fabric-dra.io"].type == "gpu"'
FABRIC_SELECTOR = {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": "fabric-dra.io/fabric", "operator": "In", "values": ["pcie"]}]}
    ]
}


def gpu(name: str, switch: str | None = None, memory: str = "80Gi", **extra: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": "gpu"}, "model": {"string": "H100"}}
    if switch is not None:
        attributes["switch"] = {"string": switch}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": memory}}, **extra}


def nvme(name: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "nvme"}}}


def pool_slice(
    devices: list[dict[str, Any]],
    *,
    name: str = "fabric-pcie-0",
    pool: str = "fabric-pcie",
    generation: int = 1,
    count: int = 1,
    **spec: Any,
) -> ResourceSlice:
    placement = spec or {"nodeSelector": FABRIC_SELECTOR}
    return ResourceSlice.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                "devices": devices,
                **placement,
            },
        }
    )


def device_class(name: str = "fabric-gpu", expression: str = GPU_CLASS) -> DeviceClass:
    return DeviceClass.model_validate(
        {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    )


def node(name: str = "node-a", fabric: str | None = "pcie") -> Node:
    labels = {"fabric-dra.io/fabric": fabric} if fabric else {}
    return Node.model_validate({"metadata": {"name": name, "labels": labels}})


def claim_spec(
    requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
) -> ResourceClaimSpec:
    return ResourceClaimSpec.model_validate(
        {"devices": {"requests": requests, "constraints": constraints or []}}
    )


def gpus(
    count: int, *, selectors: list[str] | None = None, name: str = "gpus", **exact: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "fabric-gpu", "count": count, **exact}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}
