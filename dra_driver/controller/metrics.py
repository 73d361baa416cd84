"""Prometheus metrics of the controller, served on ``/metrics`` by :mod:`.health`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from plumbing.promstats import register_process_metrics

__all__ = [
    "BIND_SECONDS",
    "BIND_TOTAL",
    "INVENTORY_VERSION",
    "IS_LEADER",
    "LINK_TAINTED_DEVICES",
    "MANAGER_UP",
    "NODE_LABEL_PATCHES",
    "POOL_COLLISIONS",
    "POOL_DEVICES",
    "POOL_GENERATION",
    "QUARANTINED_DEVICES",
    "QUARANTINES",
    "REGISTRY",
    "SLICE_RECONCILE_SECONDS",
    "SLICE_WRITES",
]

REGISTRY = CollectorRegistry(auto_describe=True)
register_process_metrics(REGISTRY, "controller")

SLICE_WRITES = Counter(
    "fabric_dra_controller_slice_writes",
    "ResourceSlice writes by verb (create, update, delete) and outcome (ok or the API error reason).",
    ["verb", "outcome"],
    registry=REGISTRY,
)
SLICE_RECONCILE_SECONDS = Histogram(
    "fabric_dra_controller_slice_reconcile_seconds",
    "Time to bring every pool's ResourceSlices in line with one inventory.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
POOL_DEVICES = Gauge(
    "fabric_dra_controller_pool_devices",
    "Devices per pool: published, or withheld with the reason.",
    ["pool", "state"],
    registry=REGISTRY,
)
POOL_GENERATION = Gauge(
    "fabric_dra_controller_pool_generation",
    "The pool generation last written or found in sync.",
    ["pool"],
    registry=REGISTRY,
)
INVENTORY_VERSION = Gauge(
    "fabric_dra_controller_inventory_version",
    "The fabric manager's inventory version last received.",
    registry=REGISTRY,
)
MANAGER_UP = Gauge(
    "fabric_dra_controller_manager_up",
    "1 while the fabric manager's inventory is readable (or has failed for less than its grace), else 0.",
    ["manager"],
    registry=REGISTRY,
)
POOL_COLLISIONS = Gauge(
    "fabric_dra_controller_pool_collisions",
    "1 while a manager's pool is refused because a manager listed before it reports the same pool.",
    ["pool", "refused"],
    registry=REGISTRY,
)
IS_LEADER = Gauge(
    "fabric_dra_controller_leader",
    "1 while this replica holds the lease and writes, else 0.",
    registry=REGISTRY,
)
NODE_LABEL_PATCHES = Counter(
    "fabric_dra_controller_node_label_patches",
    "Node label patches by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
BIND_TOTAL = Counter(
    "fabric_dra_controller_binding_results",
    "Binding-condition outcomes per device: attached, failed (with reason), detached.",
    ["result", "reason"],
    registry=REGISTRY,
)
BIND_SECONDS = Histogram(
    "fabric_dra_controller_bind_seconds",
    "From first seeing an allocated device to its Attached (or AttachFailed) condition.",
    ["result"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
QUARANTINES = Counter(
    "fabric_dra_controller_device_quarantines",
    "Devices taken out of allocation after failed attaches, by the last failure's reason.",
    ["reason"],
    registry=REGISTRY,
)
QUARANTINED_DEVICES = Gauge(
    "fabric_dra_controller_quarantined_devices",
    "Devices out of allocation now (tainted attach-failed, or withheld) per pool.",
    ["pool"],
    registry=REGISTRY,
)
LINK_TAINTED_DEVICES = Gauge(
    "fabric_dra_controller_link_tainted_devices",
    "Devices tainted (or withheld) for PCIe link errors past the controller's thresholds, by reason "
    "(PCIeFatal, PCIeNonFatal, PCIeCorrectable).",
    ["reason"],
    registry=REGISTRY,
)
