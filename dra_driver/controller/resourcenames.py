"""Names this role writes, and the resource.k8s.io limits they must obey.

The general name rules are :mod:`plumbing.names` (``k8s.io/apimachinery/pkg/util/validation``);
what resource.k8s.io adds to them is here, from ``k8s.io/kubernetes/pkg/apis/resource/validation``
(resource.k8s.io/v1, Kubernetes 1.34 to 1.37): the JSON schemas that ``kubernetes-validate``
checks do not carry these rules, the API server does.
"""

from __future__ import annotations

import hashlib
import re

from plumbing.names import is_c_identifier, is_dns1123_subdomain, is_qualified_name_part

__all__ = [
    "ATTRIBUTE_VALUE_MAX_BYTES",
    "BINDING_CONDITIONS_MAX",
    "CONSUMPTION_MAX_COUNTERS",
    "COUNTER_SET_MAX_COUNTERS",
    "C_IDENTIFIER_MAX",
    "DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX",
    "DEVICE_MAX_COUNTERS_1_34",
    "DEVICE_MAX_COUNTER_CONSUMPTIONS",
    "DEVICE_TAINTS_MAX",
    "DRIVER_NAME_MAX",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "NODE_LABEL_NAMESPACE",
    "POOL_NAME_MAX",
    "SLICE_MAX_COUNTER_SETS",
    "SLICE_MAX_DEVICES",
    "SLICE_MAX_DEVICES_WITH_TAINTS",
    "SLICE_MAX_DEVICE_COUNTERS_1_34",
    "SLICE_MAX_SHARED_COUNTERS_1_34",
    "BindingConditionNames",
    "attach_failed_taint_key",
    "drain_rule_label",
    "drain_taint_key",
    "fabric_unavailable_taint_key",
    "fit_value",
    "is_attribute_id",
    "is_driver_name",
    "is_pool_name",
    "legacy_node_label_key",
    "link_errors_taint_key",
    "pool_label_key",
    "pool_label_prefix",
    "publisher_label",
    "publisher_of",
    "reach_label_key",
    "short_hash",
    "slice_name",
    "unhealthy_taint_key",
    "warm_label_key",
    "warm_label_prefix",
]

# resource.k8s.io/v1 limits (k8s.io/api/resource/v1/types.go).
SLICE_MAX_DEVICES = 128
#: "If any device uses taints or consumes counters the limit is 64" (ResourceSliceSpec.Devices).
SLICE_MAX_DEVICES_WITH_TAINTS = 64
DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX = 32
DEVICE_TAINTS_MAX = 16
#: 1.35+ (ResourceSliceMaxCounterSets, ResourceSliceMaxCountersPerCounterSet,
#: ResourceSliceMaxDeviceCounterConsumptionsPerDevice, …PerDeviceCounterConsumption)
SLICE_MAX_COUNTER_SETS = 8
COUNTER_SET_MAX_COUNTERS = 32
DEVICE_MAX_COUNTER_CONSUMPTIONS = 2
CONSUMPTION_MAX_COUNTERS = 32
#: 1.34, where counter sets share the slice of their devices (ResourceSliceMaxSharedCounters,
#: ResourceSliceMaxCountersPerDevice, ResourceSliceMaxDeviceCountersPerSlice)
SLICE_MAX_SHARED_COUNTERS_1_34 = 32
DEVICE_MAX_COUNTERS_1_34 = 32
SLICE_MAX_DEVICE_COUNTERS_1_34 = 1024
ATTRIBUTE_VALUE_MAX_BYTES = 64
C_IDENTIFIER_MAX = 32
DRIVER_NAME_MAX = 63
POOL_NAME_MAX = 253
BINDING_CONDITIONS_MAX = 4

#: Slices this role owns carry this label; it never touches other slices of the driver.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "fabric-dra-controller"

#: The node labels this role writes (pool reach, warm counts) live under subdomains of this label
#: namespace, which the NodeRestriction admission plugin forbids kubelets to add, change or remove
#: on their own Node (``getForbiddenLabels`` in kubernetes
#: ``plugin/pkg/admission/noderestriction/admission.go``: a key whose prefix is this namespace or
#: ends in ``.`` + it). Outside it a compromised node could set them on itself and pull in the
#: pods that select them (docs/controller.md, "Node label keys").
NODE_LABEL_NAMESPACE = "node-restriction.kubernetes.io"

_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9.-]+")


def short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def is_driver_name(value: str) -> bool:
    """A DRA driver name, or the domain of a qualified attribute: a DNS subdomain of ≤ 63."""
    return len(value) <= DRIVER_NAME_MAX and is_dns1123_subdomain(value)


def is_attribute_id(value: str) -> bool:
    """The identifier of a device attribute or capacity: a C identifier of ≤ 32."""
    return len(value) <= C_IDENTIFIER_MAX and is_c_identifier(value)


def is_pool_name(value: str) -> bool:
    """≤ 253 characters, one or more DNS subdomains separated by slashes (ResourcePool.Name)."""
    return 0 < len(value) <= POOL_NAME_MAX and all(is_dns1123_subdomain(part) for part in value.split("/"))


def fit_value(value: str, max_bytes: int = ATTRIBUTE_VALUE_MAX_BYTES) -> str:
    """``value`` if it fits in ``max_bytes`` UTF-8 bytes; else its head plus a hash of the whole.

    The hash keeps distinct long values distinct, so ``matchAttribute`` on a cut value never
    joins two devices that differ.
    """
    encoded = value.encode()
    if len(encoded) <= max_bytes:
        return value
    suffix = "~" + short_hash(value)
    head = encoded[: max_bytes - len(suffix)].decode(errors="ignore")
    return head + suffix


def _label_name(text: str, max_length: int = 63) -> str:
    """A label-name part made from free text: lowercased, invalid runs → '-', cut with a hash."""
    cleaned = _NOT_LABEL_CHARS.sub("-", text.lower()).strip("-.") or "pool"
    if len(cleaned) <= max_length and is_qualified_name_part(cleaned) and cleaned == text:
        return cleaned
    # The text was altered or is too long: a hash of the original keeps two pools apart.
    suffix = "-" + short_hash(text)
    return cleaned[: max_length - len(suffix)].rstrip("-.") + suffix


def _node_label_prefix(kind: str, driver: str) -> str:
    # ≤ 5 + 63 + 1 + 30 characters, well within the 253 of a label prefix; every DNS label of it is
    # the driver's own or fixed, so the prefix is a DNS subdomain whenever the driver name is.
    return f"{kind}.{driver}.{NODE_LABEL_NAMESPACE}"


def pool_label_prefix(driver: str) -> str:
    """Node labels saying "this node reaches pool P" live under
    ``pool.<driver>.node-restriction.kubernetes.io/``."""
    return _node_label_prefix("pool", driver)


def pool_label_key(driver: str, pool: str) -> str:
    """``pool.<driver>.node-restriction.kubernetes.io/<pool>`` (value ``"true"``) on every node the
    pool's fabric reaches."""
    return f"{pool_label_prefix(driver)}/{_label_name(pool)}"


def reach_label_key(driver: str, pool: str, group: str) -> str:
    """``pool.<driver>.node-restriction.kubernetes.io/<pool>.<group>`` (value ``"true"``) on every
    node that reaches the devices of one reach group of the pool (a switch cabled to some of the
    pool's hosts only)."""
    return f"{pool_label_prefix(driver)}/{_label_name(f'{pool}.{group}')}"


def warm_label_prefix(driver: str) -> str:
    """Node labels counting a node's warm devices live under
    ``warm.<driver>.node-restriction.kubernetes.io/``."""
    return _node_label_prefix("warm", driver)


def warm_label_key(driver: str, device_type: str, publisher: str = "default") -> str:
    """``warm.<driver>.node-restriction.kubernetes.io/<device type>`` (value: how many, e.g.
    ``"2"``; absent at 0) on a node where devices of that type are warm; ``…/<publisher>.<device
    type>`` for a controller whose ``--publisher`` is not ``default``, so the controllers of several
    fabric managers under one driver each own their keys. Pods prefer nodes with ``Gt 0`` on it
    (docs/manager.md, "What the scheduler guarantees about picking a warm device"); the name part
    stays a valid label name part (a device type, or the publisher's, cleaned and hashed like pool
    names)."""
    name = device_type if publisher == "default" else f"{publisher}.{device_type}"
    return f"{warm_label_prefix(driver)}/{_label_name(name)}"


def legacy_node_label_key(key: str) -> str | None:
    """The key releases before the move under :data:`NODE_LABEL_NAMESPACE` wrote for the same
    thing (``pool.<driver>/<name>``, ``warm.<driver>/<name>``), or None for a key of no such form.

    The controller removes these from the nodes it labels: left behind, a kubelet could still
    set them, and a pod or policy still selecting them would follow a forged label."""
    prefix, slash, name = key.partition("/")
    suffix = "." + NODE_LABEL_NAMESPACE
    if not slash or not prefix.endswith(suffix) or not prefix.startswith(("pool.", "warm.")):
        return None
    return f"{prefix.removesuffix(suffix)}/{name}"


def publisher_label(driver: str) -> str:
    """Label naming the controller instance that owns a slice (``--publisher``)."""
    return f"{driver}/publisher"


def unhealthy_taint_key(driver: str) -> str:
    return f"{driver}/unhealthy"


def attach_failed_taint_key(driver: str) -> str:
    """The taint of a device taken out of allocation after failed attaches (:mod:`.quarantine`)."""
    return f"{driver}/attach-failed"


def publisher_of(publisher: str, manager: str) -> str:
    """The publisher name of a named manager's slices and node labels, ``<publisher>.<manager>``
    (``--publisher`` itself for the manager of ``--manager-url``)."""
    return f"{publisher}.{manager}" if manager else publisher


def fabric_unavailable_taint_key(driver: str) -> str:
    """The taint of every device of a manager whose inventory cannot be read (docs/controller.md,
    "Several fabric managers"): its Redfish service, or the manager itself, is down."""
    return f"{driver}/fabric-unavailable"


def drain_taint_key(driver: str) -> str:
    """The taint of a device an operator drained (``fabric-dra drain``; the manager's ``Device.drain``)."""
    return f"{driver}/drain"


def link_errors_taint_key(driver: str) -> str:
    """The taint of a device whose PCIe link keeps erring (:mod:`.linktaints`)."""
    return f"{driver}/link-errors"


def drain_rule_label(driver: str) -> str:
    """Label of the DeviceTaintRules a controller writes for drains (:mod:`.drainrules`); its value
    is the publisher's name, so each controller finds its own rules again."""
    return f"{driver}/drain-rule"


def slice_name(driver: str, pool: str, index: int, count: int = 1) -> str:
    """Stable ResourceSlice name: ``<driver>-<pool>-<index>`` when that is a DNS subdomain.

    Otherwise (a long or slashed pool name) ``<driver>.<pool head>-<hash>-<index>``, every
    label within 63 characters. The index is zero-padded to the width of the pool's last one
    (``count`` slices), so names sort as the indices do: the allocator takes a pool's slices in
    name order (``sortSlicesByName`` in the structured allocator's ``pools_experimental.go``), and
    ``-10`` would otherwise come before ``-2`` and put the shared devices of an 11-slice pool ahead
    of the warm ones in node-local slices 2 to 9.
    """
    index_text = str(index).zfill(len(str(max(count - 1, 0))))
    name = f"{driver}-{pool.replace('/', '.')}-{index_text}"
    # Kubernetes bounds only the whole name; a label over 63 would still not be a DNS name.
    if is_dns1123_subdomain(name) and all(len(label) <= 63 for label in name.split(".")):
        return name
    tail = f"-{short_hash(pool)}-{index_text}"
    head = _NOT_LABEL_CHARS.sub("-", pool.lower()).replace(".", "-").strip("-")
    head = head[: 63 - len(tail)].rstrip("-") or "pool"
    return f"{driver}.{head}{tail}"


class BindingConditionNames:
    """The condition types the binding-condition flow uses, qualified with the driver name.

    CamelCase after the domain, as ``metav1.Condition`` types are written.
    """

    def __init__(self, driver: str) -> None:
        self.attached = f"{driver}/Attached"
        self.failed = f"{driver}/AttachFailed"
