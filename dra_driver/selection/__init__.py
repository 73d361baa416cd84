"""Device selection of ``resource.k8s.io/v1``, one implementation for the scheduler and for explain.

- :mod:`~dra_driver.selection.celenv`: DRA's CEL environment (``device.*``, quantity, semver)
- :mod:`~dra_driver.selection.model`: the ResourceSlice / DeviceClass / claim models (v1, v1beta1)
- :mod:`~dra_driver.selection.allocator`: the first-fit allocator of kube-scheduler's DRA plugin,
  with shared counters (:mod:`~dra_driver.selection.counters`) and consumable capacity
  (:mod:`~dra_driver.selection.capacity`)
- :mod:`~dra_driver.selection.allocated`: what existing allocations hold (``AllocatedState``)
- :mod:`~dra_driver.selection.report`: device-by-device explanations of an allocation attempt
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.selection.allocated import AllocatedState
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

#: Which submodule each name comes from. Loaded on first use: a role that needs one small part
#: (the controller formats quantities) must not pay for the CEL environment and the allocator
#: every time it starts.
_SUBMODULE = {
    "AllocatedState": "allocated",
    "AllocationError": "allocator",
    "AllocationResult": "allocator",
    "Allocator": "allocator",
    "ClaimToAllocate": "allocator",
    "Features": "allocator",
    "CelCompileError": "celenv",
    "DeviceInput": "celenv",
    "SelectorCache": "celenv",
    "DeviceClass": "model",
    "Node": "model",
    "ResourceClaimSpec": "model",
    "ResourceSlice": "model",
    "DeviceID": "pools",
    "Quantity": "quantity",
    "parse_quantity": "quantity",
    "NodeReport": "report",
    "explain_node": "report",
}


def __getattr__(name: str) -> Any:
    submodule = _SUBMODULE.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AllocatedState",
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
    "explain_node",
    "parse_quantity",
]
