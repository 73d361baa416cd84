"""The root of every error dra_driver raises on purpose, and the few bases callers catch::

    DriverError
    ├── InputError (ValueError)      what was given cannot work as written; the message says where
    │   ├── CelCompileError, QuantityError, SemverError, CapacityUndefined     (selection)
    │   ├── SliceInvalid             a ResourceSlice the API server would reject (controller.slices)
    │   ├── CdiSpecError             not a CDI spec this plugin wrote (plugin.cdi)
    │   └── ExplainInputError        a claim file ``explain`` cannot read (explain)
    ├── AllocationError              the scheduler's selection must stop on this node (selection)
    ├── KubeletPluginError           the kubelet plugin could not do its part on this node
    │   ├── PluginError              at start: the operator must act (printed as one line)
    │   ├── PrepareFailed            a claim not prepared; its message is the kubelet's error
    │   ├── ClaimNotFound, DeviceNotVisible, CheckpointCorrupt, ConfigError
    │   ├── PartitionFailed, MemoryFailed  a GPU partition, a CXL share's memory not made usable
    │   ├── HookError            ``fabric-dra cdi-hook``: a container not bound to its NUMA node
    │   └── DeviceInUse, StillDetaching, MemoryInUse    also manager_api FabricErrors: retriable
    └── ControllerError              the ResourceSlice and binding-condition controller
        └── ResourceApiMissing (RuntimeError)   the cluster serves no resource.k8s.io/v1

Errors are turned into what the other side reads in one place each: the kubelet's per-claim
``error`` of NodePrepareResources / NodeUnprepareResources in :class:`dra_driver.plugin.driver.Driver`
(with :mod:`dra_driver.plugin.prepare_errors` for the fabric's failures), the ``AttachFailed``
condition's reason in :class:`dra_driver.controller.binding_conditions.ClaimBinder`. The fabric
manager's errors keep their own tree (:mod:`manager_api.errors`), the Kubernetes API's theirs
(:mod:`plumbing.errors`).
"""

from __future__ import annotations

__all__ = ["ControllerError", "DriverError", "InputError", "KubeletPluginError"]


class DriverError(Exception):
    """Base of every error dra_driver raises on purpose."""


class InputError(DriverError, ValueError):
    """Input that cannot work as written (an expression, a quantity, a file, a slice)."""


class KubeletPluginError(DriverError):
    """The kubelet plugin could not do its part on this node."""


class ControllerError(DriverError):
    """The controller could not do its part in the cluster."""
