"""Device selection of ``resource.k8s.io/v1``, one implementation for the scheduler and for explain.

- :mod:`~dra_driver.selection.celenv`: DRA's CEL environment (``device.*``, quantity, semver)
- :mod:`~dra_driver.selection.model`: the ResourceSlice / DeviceClass / claim models (v1, v1beta1)
- :mod:`~dra_driver.selection.allocator`: the first-fit allocator of kube-scheduler's DRA plugin
- :mod:`~dra_driver.selection.report`: device-by-device explanations of an allocation attempt
"""

from dra_driver.selection.allocator import (
    AllocationError,
    AllocationResult,
    Allocator,
    ClaimToAllocate,
    Features,
)
from dra_driver.selection.celenv import CelCompileError, DeviceInput, SelectorCache
from dra_driver.selection.model import DeviceClass, Node, ResourceClaimSpec, ResourceSlice
from dra_driver.selection.pools import DeviceID
from dra_driver.selection.quantity import Quantity, parse_quantity
from dra_driver.selection.report import NodeReport, explain_node
from plumbing.kube.dra import ResourceClaim

__all__ = [
    "AllocationError",
    "AllocationResult",
    "Allocator",
    "CelCompileError",
    "ClaimToAllocate",
    "DeviceClass",
    "DeviceID",
    "DeviceInput",
    "Features",
    "Node",
    "NodeReport",
    "Quantity",
    "ResourceClaimSpec",
    "ResourceSlice",
    "SelectorCache",
    "allocated_devices",
    "explain_node",
    "parse_quantity",
]


def allocated_devices(
    claims: list[dict[str, object]], exclude: set[str] | None = None
) -> dict[DeviceID, str]:
    """Devices held by claims (JSON objects), ``namespace/name`` by device; admin access excluded.

    ``exclude`` names claims (``namespace/name``) whose own allocation should not count,
    e.g. the claim being explained.
    """
    held: dict[DeviceID, str] = {}
    for obj in claims:
        claim = ResourceClaim.read(obj)
        if claim is None:
            continue
        key = f"{claim.metadata.namespace or ''}/{claim.metadata.name}"
        if exclude and key in exclude:
            continue
        for result in claim.results:
            if result.admin_access or result.share_id:
                continue
            held[(result.driver, result.pool, result.device)] = key
    return held
