"""One fabric pool → its ResourceSlices, and what it takes to bring the stored slices there.

A pool is published in slices with stable names (``<driver>-<pool>-<n>``). Its devices are first
grouped by the nodes that reach them: the devices every node of the pool reaches, then each reach
group of the pool (a switch cabled to some of the pool's hosts only; ``FabricPool.reachGroups``),
by group id; a fresh group is cut into ``ceil`` (devices / limit) slices, devices sorted by name,
and after that each device stays in its slice, a new one going to a slice with room
(:mod:`.layout`: an added device must not shift every later one into the next slice); each slice
selects exactly the group's nodes by a node label the controller keeps
(:func:`desired_node_labels`, :mod:`.nodelabels`). A device the manager keeps warm on node N (ledger
state ``warm``) leaves its group's slice for a *node-local* slice of the same pool
(``spec.nodeName: N``, attribute ``warm: true``): only N's claims can be allocated it, so the
scheduler never picks it for another node. Node-local slices come first (by node), so in a node's
view of the pool its warm devices precede the shared ones wherever slices are taken in name order
(the stand-in scheduler; the real one takes them in lister order — docs/manager.md, "Warm devices").
A device is in exactly one slice of its pool: two would make the pool invalid for the allocator
(``poolIsInvalid``: "duplicate device name"). ``nodeName`` is immutable, so a slice whose
``nodeName`` changes is deleted and created again. All slices of a pool carry the same
``pool.generation`` and ``pool.resourceSliceCount``. A change that keeps the pool's slices
(their number, names, node selection and counter sets: devices changed, added, removed, or moving
between slices that exist already — a node keeps its node-local slice, empty, once it had one) is
written in place under the current generation, to the slices that differ only, slices that lose
devices before slices that gain them, so the pool stays complete and valid at every instant
(:func:`_plan_in_place`). Any other change is written as a new generation on *every* slice of the
pool, then obsolete slices are deleted — so a consumer that only trusts the highest generation
with a complete slice count never sees a mixed pool (ResourcePool, k8s.io/api/resource/v1).
Where taints are published every slice is cut at 64 devices (:func:`.layout.cut`), so a taint
never changes the layout.

Stored slices are compared *semantically* with the desired ones: quantities by value, taint
``timeAdded`` ignored (the API server fills it in), nulls and empty lists ignored. An
unchanged pool therefore plans no writes at all.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from dra_driver.controller.delta import first_of
from dra_driver.controller.devices import (
    WARM_ATTRIBUTE,
    Conversion,
    CounterLayout,
    PublishPolicy,
    WithheldReason,
    counter_set_entry,
    mark_warm,
    partition_conversions,
    to_dra_device,
)
from dra_driver.controller.layout import Layout, cut, halves_limit, placement_key, sticky_chunks
from dra_driver.controller.render_memo import IdentityMemo, RenderMemo
from dra_driver.controller.resourcenames import (
    ATTRIBUTE_VALUE_MAX_BYTES,
    BINDING_CONDITIONS_MAX,
    CONSUMPTION_MAX_COUNTERS,
    COUNTER_SET_MAX_COUNTERS,
    DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX,
    DEVICE_MAX_COUNTER_CONSUMPTIONS,
    DEVICE_MAX_COUNTERS_1_34,
    DEVICE_TAINTS_MAX,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    SLICE_MAX_COUNTER_SETS,
    SLICE_MAX_DEVICE_COUNTERS_1_34,
    SLICE_MAX_DEVICES,
    SLICE_MAX_DEVICES_WITH_TAINTS,
    SLICE_MAX_SHARED_COUNTERS_1_34,
    is_attribute_id,
    is_driver_name,
    is_pool_name,
    pool_label_key,
    publisher_label,
    reach_label_key,
    slice_name,
    warm_label_key,
)
from dra_driver.errors import InputError
from dra_driver.selection.quantity import parse_quantity
from manager_api.models import BindingState, Device, Health, Inventory
from plumbing.names import is_dns1123_label, is_dns1123_subdomain, is_label_value, is_qualified_name

__all__ = [
    "DesiredPool",
    "DeviceMarks",
    "NormalCache",
    "PoolPlan",
    "SliceInvalid",
    "SliceWrite",
    "check_pool",
    "check_slice",
    "chunk_devices",
    "convert_device",
    "desired_node_labels",
    "desired_pools",
    "desired_warm_labels",
    "first_warm",
    "node_selector",
    "partition_node",
    "plan_pool",
    "reaching_nodes",
    "slice_labels",
    "slice_selector",
    "warm_first_request",
    "warm_labels_of",
    "warm_node",
    "warm_node_preference",
]

API_VERSION = "resource.k8s.io/v1"


class SliceInvalid(InputError):
    """A slice breaks a rule the API server enforces; writing it would be rejected."""


def slice_labels(driver: str, publisher: str) -> dict[str, str]:
    """Labels of every slice this role writes; it lists and touches only slices carrying them."""
    return {MANAGED_BY_LABEL: MANAGED_BY_VALUE, publisher_label(driver): publisher}


def slice_selector(driver: str, publisher: str) -> str:
    return ",".join(f"{k}={v}" for k, v in slice_labels(driver, publisher).items())


def _label_key(driver: str, pool: str, group: str | None) -> str:
    return pool_label_key(driver, pool) if group is None else reach_label_key(driver, pool, group)


def node_selector(driver: str, pool: str, group: str | None = None) -> dict[str, Any]:
    """Exactly the nodes labelled as reaching ``pool`` — or, with ``group``, as reaching that reach
    group of the pool (labels kept right by :mod:`.nodelabels`).

    Labels, not node names: a selector of names would grow with the nodes (thousands of names in
    every slice, past the object size limit) and every node that joins or leaves would rewrite every
    slice of the pool under a new generation; a label is one patch of the node that changed."""
    requirement = {"key": _label_key(driver, pool, group), "operator": "In", "values": ["true"]}
    return {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}


def desired_node_labels(inventory: Inventory, driver: str) -> dict[str, set[str]]:
    """Node name → the label keys it must carry: one per pool it reaches, one per reach group of
    a pool whose devices it reaches. The slices' node selectors (:func:`node_selector`) use these."""
    wanted: dict[str, set[str]] = {}
    for pool in inventory.pools:
        key = pool_label_key(driver, pool.pool)
        for node in pool.nodes:
            wanted.setdefault(node, set()).add(key)
        for group in pool.reach_groups:
            key = reach_label_key(driver, pool.pool, group.id)
            for node in group.nodes:
                wanted.setdefault(node, set()).add(key)
    return wanted


def desired_warm_labels(
    inventory: Inventory,
    driver: str,
    publisher: str = "default",
    allocated: AbstractSet[tuple[str, str]] = frozenset(),
) -> dict[str, dict[str, str]]:
    """Node name → ``{warm label key: count}``: per device type, how many devices are published warm
    and untainted in the node's node-local slices (:func:`desired_pools`); a type with none has no
    key, so a pod's
    ``Exists`` and ``Gt 0`` mean the same. Pods prefer these nodes through a preferred node affinity
    (docs/manager.md, "What the scheduler guarantees about picking a warm device"). ``allocated``:
    the (pool, device) of this driver that ResourceClaims hold; not counted, as no new claim gets
    them (the inventory shows such a device warm until its claim is prepared)."""
    return warm_labels_of(
        first_warm(inventory.devices).values(), reaching_nodes(inventory), driver, publisher, allocated
    )


def first_warm(devices: Iterable[Device]) -> dict[tuple[str, str], Device]:
    """The warm devices of ``devices`` by (pool, name); of a name twice, the first, as
    :func:`desired_pools` publishes it."""
    return first_of(devices, _is_warm)


def _is_warm(device: Device) -> bool:
    return device.state is BindingState.WARM


def warm_labels_of(
    warm: Iterable[Device],
    reaching: Mapping[tuple[str, str | None], frozenset[str]],
    driver: str,
    publisher: str = "default",
    allocated: AbstractSet[tuple[str, str]] = frozenset(),
) -> dict[str, dict[str, str]]:
    """:func:`desired_warm_labels` of the warm devices ``warm`` (no name twice): what the node
    labeller keeps up to date from the devices that change."""
    counts: dict[str, dict[str, int]] = {}
    for device in warm:
        node = warm_node(device, reaching)
        # Only what a claim can be allocated without a toleration: not withheld, not tainted
        # (devices.to_dra_device); a warm device is never unavailable or unmanaged.
        offered = device.health is Health.OK and is_dns1123_label(device.name) and is_pool_name(device.pool)
        if node is not None and offered and (device.pool, device.name) not in allocated:
            key = warm_label_key(driver, device.type.value, publisher)
            counts.setdefault(node, {}).setdefault(key, 0)
            counts[node][key] += 1
    return {node: {k: str(n) for k, n in keys.items()} for node, keys in counts.items()}


def warm_node_preference(driver: str, device_type: str, *, weight: int = 100) -> dict[str, Any]:
    """The pod-spec recipe that steers a pod to a node with a warm device of ``device_type``: one
    ``preferredDuringSchedulingIgnoredDuringExecution`` term of a node affinity, ``Gt 0`` on the
    node's warm count (:func:`desired_warm_labels`). The scheduler's ``NodeAffinity`` score (weight
    2 in the default profile) then adds 200 of 100-point scores to those nodes (docs/manager.md)."""
    requirement = {"key": warm_label_key(driver, device_type), "operator": "Gt", "values": ["0"]}
    return {"weight": weight, "preference": {"matchExpressions": [requirement]}}


def warm_first_request(driver: str, name: str, device_class: str) -> dict[str, Any]:
    """The claim-side recipe that prefers a warm device: one request ``name`` with
    ``firstAvailable: [warm, any]`` — a device of ``device_class`` carrying the warm attribute
    (present only on warm devices, so ``in`` and not a lookup, which would fail the node), else any
    of the class. The scheduler's DRA ``Score`` ranks a node whose allocation used the first
    subrequest above one that needed the second (8 against 7 before normalisation, weight 1), and
    its allocator counts a warm device taken by a pod placed a moment ago at once: with
    :func:`warm_node_preference` it keeps a burst of pods off a node whose warm device is gone
    while that node's label still counts it (docs/manager.md)."""
    warm = f'"{WARM_ATTRIBUTE}" in device.attributes["{driver}"]'
    return {
        "name": name,
        "firstAvailable": [
            {"name": "warm", "deviceClassName": device_class, "selectors": [{"cel": {"expression": warm}}]},
            {"name": "any", "deviceClassName": device_class},
        ],
    }


#: the pool cut in name order (:func:`.layout.cut`), as this module offered it before the layout
#: stayed put across changes (:mod:`.layout`)
chunk_devices = cut


# -- semantic comparison --------------------------------------------------------------------


def _prune(value: Any) -> Any:
    """Drop nulls, empty lists and empty maps, recursively: the API server omits them."""
    if isinstance(value, dict):
        out = {}
        # Scalars are kept as they are without a call each: a pool with partitions has hundreds of
        # thousands of them (every counter of every placement).
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                item = _prune(item)
                if not item:
                    continue
            elif item is None:
                continue
            out[key] = item
        return out
    if isinstance(value, list):
        return [_prune(v) if isinstance(v, (dict, list)) else v for v in value]
    return value


def _q(value: Any) -> str:
    """A quantity by value: the API server re-serialises quantities canonically."""
    return _quantity_value(str(value if value is not None else "0"))


@functools.lru_cache(maxsize=4096)
def _quantity_value(text: str) -> str:
    # A pool repeats a few spellings thousands of times (every partition's "1", "16", "9984Mi").
    return str(parse_quantity(text).value)


@functools.lru_cache(maxsize=4096)
def _quantity_problem(text: str) -> str | None:
    """Why ``text`` is no quantity, or None."""
    try:
        parse_quantity(text)
    except ValueError as err:
        return str(err)
    return None


def _normal_counters(counters: Any) -> dict[str, str]:
    if not isinstance(counters, Mapping):
        return {}
    return {str(k): _q((v or {}).get("value")) for k, v in counters.items()}


def _normal_policy(policy: Any) -> Any:
    if not isinstance(policy, Mapping):
        return policy
    out: dict[str, Any] = {}
    for key, value in policy.items():
        if key == "default":
            out[key] = _q(value)
        elif key == "validValues" and isinstance(value, list):
            out[key] = [_q(v) for v in value]
        elif key == "validRange" and isinstance(value, Mapping):
            out[key] = {k: _q(v) for k, v in value.items()}
        else:
            out[key] = value
    return out


def _normal_device(device: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(_prune(device))
    capacity = out.get("capacity")
    if isinstance(capacity, dict):
        out["capacity"] = {
            # The API server re-serialises quantities canonically: compare values, not spellings.
            name: {
                **entry,
                "value": _q(entry.get("value", "0")),
                **(
                    {"requestPolicy": _normal_policy(entry["requestPolicy"])}
                    if "requestPolicy" in entry
                    else {}
                ),
            }
            for name, entry in capacity.items()
        }
    consumes = out.get("consumesCounters")
    if isinstance(consumes, list):
        out["consumesCounters"] = [
            (str(c.get("counterSet")), _normal_counters(c.get("counters"))) for c in consumes
        ]
    taints = out.get("taints")
    if isinstance(taints, list):
        out["taints"] = sorted(
            (str(t.get("key")), str(t.get("value", "")), str(t.get("effect"))) for t in taints
        )
    return out


def _normal_spec(spec: Mapping[str, Any], memo: RenderMemo | None = None) -> dict[str, Any]:
    """Everything of a slice spec that matters, except the pool's generation and slice count;
    ``memo`` keeps each device's normal form, and a slice's, for as long as the devices are the
    same objects."""
    # devices are pruned once each, by _normal_device
    pruned = _prune({k: v for k, v in spec.items() if k != "devices"})
    pool = dict(pruned.get("pool") or {})
    pool.pop("generation", None)
    pool.pop("resourceSliceCount", None)
    rest = {k: v for k, v in pruned.items() if k not in ("pool", "sharedCounters")}
    listed = spec.get("devices") or []
    if memo is None:
        devices = {str(d.get("name")): _normal_device(d) for d in listed if isinstance(d, dict)}
    else:
        normals = memo.normals
        devices = memo.chunk_normal(
            listed,
            lambda: {
                str(d.get("name")): normals.get(d, functools.partial(_normal_device, d))
                for d in listed
                if isinstance(d, dict)
            },
        )
    counters = {
        str(c.get("name")): _normal_counters(c.get("counters")) for c in pruned.get("sharedCounters") or []
    }
    if counters:
        rest["sharedCounters"] = counters
    return {**rest, "pool": pool, "devices": devices}


def _normal_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The normalised spec of a stored slice, computed afresh."""
    return _normal_spec(obj.get("spec") or {})


class NormalCache:
    """Normalised specs of stored slices, by (uid, resourceVersion): a resync that re-lists
    unchanged slices compares them without normalising 10,000 devices again."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))

    def _put(self, key: tuple[str, str], normal: dict[str, Any]) -> None:
        if len(self._cache) >= self._size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = normal

    def remember(self, stored: Mapping[str, Any], normal: dict[str, Any]) -> None:
        """``stored`` is what the API server kept of a write whose spec normalises to ``normal``."""
        key = self._key(stored)
        if all(key):
            self._put(key, normal)

    def __call__(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        key = self._key(obj)
        if not all(key):
            return _normal_slice(obj)
        found = self._cache.get(key)
        if found is None:
            found = _normal_slice(obj)
            self._put(key, found)
        return found


# -- desired state --------------------------------------------------------------------------


@dataclass
class DesiredPool:
    """What one pool should look like, independent of its generation."""

    name: str
    chunks: list[list[dict[str, Any]]]
    #: each chunk's node selection: ``{"nodeSelector": …}`` (its reach group) or ``{"nodeName": …}``
    #: (the warm devices of one node)
    placements: list[dict[str, Any]]
    withheld: dict[str, WithheldReason] = field(default_factory=dict)
    #: each slice's shared counter sets (``CounterSet`` entries), parallel to ``chunks``; a counter
    #: slice (1.35+) has sets and no devices; empty: none
    counter_sets: list[list[dict[str, Any]]] = field(default_factory=list)
    nodes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    #: each published device's normal form, by the device's identity (the publisher's memo)
    normals: RenderMemo | None = field(default=None, repr=False, compare=False)
    #: each slice's normal form, None where not computed yet (:meth:`normal_specs`)
    _normal: list[dict[str, Any] | None] | None = field(default=None, repr=False)
    #: published device name → its slice's index (:meth:`where`)
    _where: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @property
    def device_count(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    def sets(self, index: int) -> list[dict[str, Any]]:
        return self.counter_sets[index] if index < len(self.counter_sets) else []

    def spec(self, driver: str, index: int, generation: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "driver": driver,
            "pool": {"name": self.name, "generation": generation, "resourceSliceCount": len(self.chunks)},
            **self.placements[index],
        }
        if self.sets(index):
            spec["sharedCounters"] = self.sets(index)
        if self.chunks[index]:
            spec["devices"] = self.chunks[index]
        return spec

    def normal_specs(self, driver: str) -> list[dict[str, Any]]:
        """Each slice's normal form (:func:`_normal_spec`); a pool patched in place
        (:mod:`.patch`) computes only those of the slices it changed."""
        if self._normal is None:
            self._normal = [None] * len(self.chunks)
        normal = self._normal
        for index, known in enumerate(normal):
            if known is None:
                normal[index] = _normal_spec(self.spec(driver, index, 0), self.normals)
        return normal  # type: ignore[return-value]  # every entry is filled above

    def where(self) -> dict[str, int]:
        """Published device name → the index of its slice; built once, then kept by the patches
        (:mod:`.patch`), which take it over."""
        if self._where is None:
            self._where = {str(d["name"]): i for i, chunk in enumerate(self.chunks) for d in chunk}
        return self._where

    def patched(
        self,
        chunks: Mapping[int, list[dict[str, Any]]],
        withheld: dict[str, WithheldReason],
        moved: Mapping[str, int | None],
    ) -> DesiredPool:
        """This pool with the slices of ``chunks`` (index → devices) replaced, ``withheld`` and the
        devices of ``moved`` now in the slice given (None: in none); the other slices keep their
        normal forms, and the index of devices is taken over (this pool is not used again)."""
        normal = list(self._normal) if self._normal is not None else None
        every = list(self.chunks)
        for index, chunk in chunks.items():
            every[index] = chunk
            if normal is not None:
                normal[index] = None
        where = self.where()
        for name, place in moved.items():
            if place is None:
                where.pop(name, None)
            else:
                where[name] = place
        self._where = None
        return dataclasses.replace(self, chunks=every, withheld=withheld, _normal=normal, _where=where)

    def layout(self) -> Layout:
        """Where each published device is (:mod:`.layout`): what the next whole build keeps."""
        out: Layout = {}
        for chunk, placement in zip(self.chunks, self.placements, strict=True):
            if chunk:
                out.setdefault(placement_key(placement), []).append([str(d["name"]) for d in chunk])
        return out


def reaching_nodes(inventory: Inventory) -> dict[tuple[str, str | None], frozenset[str]]:
    """(pool, reach group or None for the whole pool) → the nodes that reach its devices."""
    out: dict[tuple[str, str | None], frozenset[str]] = {}
    for pool in inventory.pools:
        out[(pool.pool, None)] = frozenset(pool.nodes)
        for group in pool.reach_groups:
            out[(pool.pool, group.id)] = frozenset(group.nodes)
    return out


def warm_node(device: Device, reaching: Mapping[tuple[str, str | None], frozenset[str]]) -> str | None:
    """The node whose node-local slice publishes ``device`` warm: the node it is warm on, when that
    node reaches it (else it is published as if cold)."""
    warm = device.state is BindingState.WARM and device.node
    if warm and device.node in reaching.get((device.pool, device.reach), ()):
        return device.node
    return None


def partition_node(device: Device, reaching: Mapping[tuple[str, str | None], frozenset[str]]) -> str | None:
    """The node a partitioned GPU is bound to while any of its partitions is held (one GPU, one
    node): its remaining placements are offered there only, in that node's node-local slice."""
    if not device.partitions:
        return None
    node = device.node or device.partitions[0].node
    if node in reaching.get((device.pool, device.reach), ()):
        return node
    return None


@dataclass
class _Unit:
    """Devices that travel together: a device, or a partitionable GPU with its partitions and the
    counter set they consume (in 1.34's layout, one slice must hold them all)."""

    name: str
    devices: list[dict[str, Any]]
    counter_set: dict[str, Any] | None = None

    @property
    def consumed(self) -> int:
        return sum(
            len(c.get("counters") or {}) for d in self.devices for c in d.get("consumesCounters") or []
        )


def convert_device(
    device: Device, policy: PublishPolicy, quarantined: str | None, link_fault: str | None = None
) -> tuple[Conversion, list[Conversion], dict[str, Any] | None, _Unit | None]:
    """``device`` published (or withheld), its partitions, the counter set they consume, and —
    for a published device without partitions — its unit where it is not warm (the common case,
    kept whole by the memo)."""
    whole = to_dra_device(device, policy, quarantined, link_fault)
    if device.partition_table is None or policy.counters is CounterLayout.OFF:
        cold = _Unit(device.name, [whole.device]) if whole.device is not None else None
        return whole, [], None, cold
    counters = counter_set_entry(device) if whole.device is not None else None
    return whole, partition_conversions(device, whole, policy.driver), counters, None


def _pool_units(
    devices: Sequence[Device],
    policy: PublishPolicy,
    marks: DeviceMarks,
    reaching: Mapping[tuple[str, str | None], frozenset[str]],
    memo: IdentityMemo[Any] | None = None,
) -> tuple[dict[str | None, list[_Unit]], dict[str, list[_Unit]], dict[str, Conversion]]:
    """One pool's devices as units: by reach group (None: every node of the pool), by node (the
    node-local slices: warm devices, and the GPUs whose partitions a node holds), and every
    conversion by name (published or withheld)."""
    names = {d.name for d in devices}
    converted: dict[str, Conversion] = {}
    groups: dict[str | None, list[_Unit]] = {None: []}
    local: dict[str, list[_Unit]] = {}
    for device in devices:
        if device.name in converted:
            continue  # a device name is unique within a pool; the manager guarantees it, we enforce it
        key = (device.pool, device.name)
        reason, link_fault = marks.quarantined.get(key), marks.link_faults.get(key)
        if memo is None:
            whole, parts, counters, cold = convert_device(device, policy, reason, link_fault)
        else:
            # the same device object, policy, quarantine and link fault: the same conversion as last pass
            whole, parts, counters, cold = memo.get(
                device,
                functools.partial(convert_device, device, policy, reason, link_fault),
                (policy, reason, link_fault),
            )
        converted[device.name] = whole
        warm = warm_node(device, reaching)
        node = warm or partition_node(device, reaching)
        if cold is not None and node is None:
            groups.setdefault(device.reach, []).append(cold)
            continue
        if parts and not policy.binding_conditions and node is None:
            # Without binding conditions a partition's node is the pod's, bound before any attach: a
            # free GPU's partitions could go to two nodes at once, and the second pod would wait for
            # ever. Only a GPU already on a node (warm there, or holding partitions) offers them.
            parts = []
        for part in parts:
            if part.name in names or part.name in converted:
                part = Conversion(part.name, None, WithheldReason.PARTITION)
            converted[part.name] = part
        if whole.device is None:
            continue
        published = [whole.device, *(p.device for p in parts if p.device is not None)]
        if warm is not None:
            published = [mark_warm(d, policy.driver) for d in published]
        unit = _Unit(device.name, sorted(published, key=lambda d: str(d["name"])), counters)
        if node is not None:
            local.setdefault(node, []).append(unit)
        else:
            groups.setdefault(device.reach, []).append(unit)
    return groups, local, converted


def _pack_combined(units: Sequence[_Unit]) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Kubernetes 1.34's layout: each unit whole in one slice with its counter set, as many units a
    slice as its limits allow (128 devices, 64 where one is tainted; 32 shared counters; 1024
    counters consumed by its devices)."""
    out: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    devices: list[dict[str, Any]] = []
    sets: list[dict[str, Any]] = []
    shared = consumed = 0
    for unit in sorted(units, key=lambda u: u.name):
        unit_shared = len((unit.counter_set or {}).get("counters") or {})
        tainted = any(d.get("taints") for d in [*devices, *unit.devices])
        limit = SLICE_MAX_DEVICES_WITH_TAINTS if tainted else SLICE_MAX_DEVICES
        if devices and (
            len(devices) + len(unit.devices) > limit
            or shared + unit_shared > SLICE_MAX_SHARED_COUNTERS_1_34
            or consumed + unit.consumed > SLICE_MAX_DEVICE_COUNTERS_1_34
        ):
            out.append((devices, sets))
            devices, sets, shared, consumed = [], [], 0, 0
        devices = [*devices, *unit.devices]
        if unit.counter_set is not None:
            sets = [*sets, unit.counter_set]
        shared += unit_shared
        consumed += unit.consumed
    if devices or not out:
        out.append((devices, sets))
    return out


def _layout(
    units: Sequence[_Unit], policy: PublishPolicy, before: Sequence[Sequence[str]] | None = None
) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """The slices (devices, counter sets) of one node selection; ``before``: where its devices
    were (:func:`.layout.sticky_chunks`). 1.34's layout keeps a GPU's partitions with their
    counter set in one slice and is packed afresh each time."""
    if policy.counters is CounterLayout.COMBINED:
        return _pack_combined(units)
    devices = [d for u in units for d in u.devices]
    return [(chunk, []) for chunk in sticky_chunks(devices, before, taintable=policy.device_taints)]


@dataclass(frozen=True)
class DeviceMarks:
    """What the controller itself knows of devices, beside the inventory: (pool, device) → why."""

    #: devices out of allocation after failed attaches (:mod:`.quarantine`)
    quarantined: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: devices whose PCIe link errs past the thresholds (:mod:`.linktaints`)
    link_faults: Mapping[tuple[str, str], str] = field(default_factory=dict)


def _selections(
    pool: str,
    groups: Mapping[str | None, Sequence[_Unit]],
    local: Mapping[str, Sequence[_Unit]],
    policy: PublishPolicy,
    was: Layout,
) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """One pool's device slices — devices, counter sets and node selection of each: each node's
    node-local devices first, then the devices every node of the pool reaches, then each reach
    group (module docstring). A device goes to exactly one of them; ``was``: where they were."""
    chunks: list[list[dict[str, Any]]] = []
    sets: list[list[dict[str, Any]]] = []
    placements: list[dict[str, Any]] = []
    selections: list[tuple[dict[str, Any], Sequence[_Unit]]] = [
        ({"nodeName": node}, local[node]) for node in sorted(local)
    ]
    selections += [
        ({"nodeSelector": node_selector(policy.driver, pool, group)}, groups[group])
        for group in sorted(groups, key=lambda g: (g is not None, g or ""))
    ]
    for placement, units in selections:
        for devices, counter_sets in _layout(units, policy, was.get(placement_key(placement))):
            chunks.append(devices)
            sets.append(counter_sets)
            placements.append(dict(placement))
    return chunks, sets, placements


def desired_pools(
    inventory: Inventory,
    policy: PublishPolicy,
    quarantined: Mapping[tuple[str, str], str] | None = None,
    link_faults: Mapping[tuple[str, str], str] | None = None,
    memo: RenderMemo | None = None,
    before: Mapping[str, Layout] | None = None,
) -> dict[str, DesiredPool]:
    """Every pool of the inventory with the devices to publish, in slice-sized chunks; a device
    of ``before`` (pool → where its devices are: the last pass's, or the stored slices') stays in
    its slice (:mod:`.layout`).

    ``quarantined``: (pool, device) → why, for devices out of allocation after failed attaches;
    ``link_faults``: (pool, device) → the fault, for devices whose link errs past the thresholds.

    A partitionable GPU (``partition_table``) is published whole and as every placement of its
    profiles, all consuming the GPU's counter set; 1.35+ (``CounterLayout.SPLIT``) puts the pool's
    counter sets in counter slices of their own after its device slices (at most 8 sets each,
    selecting the pool's nodes: the allocator reads a pool's counter slices whatever their node
    selection), 1.34 (``COMBINED``) puts each set in the slice of its GPU's devices. While a node
    holds partitions of a GPU (``Device.partitions``), the GPU's devices are in that node's
    node-local slice, as a warm device's are, so no other node is offered its placements."""
    marks = DeviceMarks(quarantined or {}, link_faults or {})
    if memo is not None:
        memo.turn()
    nodes_by_pool: dict[str, tuple[str, ...]] = {p.pool: tuple(sorted(set(p.nodes))) for p in inventory.pools}
    reaching = reaching_nodes(inventory)
    by_pool: dict[str, list[Device]] = defaultdict(list)
    for device in inventory.devices:
        by_pool[device.pool].append(device)
    pools: dict[str, DesiredPool] = {}
    for pool in sorted(set(nodes_by_pool) | set(by_pool)):
        if not is_pool_name(pool):
            continue
        groups, local, converted = _pool_units(
            by_pool.get(pool, []), policy, marks, reaching, memo.conversions if memo else None
        )
        if not groups[None] and (len(groups) > 1 or local):
            del groups[None]  # no device for every node: no empty slice for them either
        chunks, sets, placements = _selections(pool, groups, local, policy, (before or {}).get(pool, {}))
        if policy.counters is CounterLayout.SPLIT:
            every_set = sorted(
                (
                    u.counter_set
                    for units in [*groups.values(), *local.values()]
                    for u in units
                    if u.counter_set
                ),
                key=lambda c: str(c["name"]),
            )
            for start in range(0, len(every_set), SLICE_MAX_COUNTER_SETS):
                chunks.append([])
                sets.append(every_set[start : start + SLICE_MAX_COUNTER_SETS])
                placements.append({"nodeSelector": node_selector(policy.driver, pool)})
        pools[pool] = DesiredPool(
            name=pool,
            chunks=chunks,
            placements=placements,
            withheld={n: c.withheld for n, c in converted.items() if c.withheld is not None},
            nodes=nodes_by_pool.get(pool, ()),
            labels=slice_labels(policy.driver, policy.publisher),
            counter_sets=sets,
            normals=memo,
        )
    return pools


# -- planning -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SliceWrite:
    """Create (``resource_version`` None) or compare-and-swap replace one slice."""

    obj: dict[str, Any]
    resource_version: str | None
    #: the normalised form of ``obj``'s spec, to remember for what the API server stores
    normal: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


@dataclass
class PoolPlan:
    pool: str
    generation: int
    writes: list[SliceWrite]
    #: (name, resourceVersion) of slices to remove once the writes have succeeded
    deletes: list[tuple[str, str]]
    #: slices that must go *before* a write reuses their name (they belong to another pool)
    deletes_first: list[tuple[str, str]] = field(default_factory=list)
    #: writes that must wait until every one of ``writes`` has succeeded: a warm change in place
    #: adds the devices a slice gains only once every other slice has dropped them
    #: (:func:`plan_pool`); their ``resource_version`` is the one ``writes`` left
    writes_after: list[SliceWrite] = field(default_factory=list)


def _generation(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _in_sync(
    desired: DesiredPool,
    existing: Mapping[str, dict[str, Any]],
    driver: str,
    normal_of: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> bool:
    count = len(desired.chunks)
    if len(existing) != count:
        return False
    normal = desired.normal_specs(driver)
    generations: set[int] = set()
    for index in range(count):
        stored = existing.get(slice_name(driver, desired.name, index, count))
        if stored is None:
            return False
        spec = stored.get("spec") or {}
        pool = spec.get("pool") or {}
        if int(pool.get("resourceSliceCount") or 0) != count:
            return False
        labels = _meta(stored).get("labels") or {}
        if any(labels.get(k) != v for k, v in desired.labels.items()):
            return False
        generations.add(_generation(stored))
        if not _same(stored, normal[index], normal_of):
            return False
    return len(generations) == 1


def _taint_times(existing: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str, str], str]:
    """timeAdded of every stored taint, keyed by (device, key, value, effect)."""
    times: dict[tuple[str, str, str, str], str] = {}
    for stored in existing:
        for device in (stored.get("spec") or {}).get("devices") or []:
            for taint in device.get("taints") or []:
                if taint.get("timeAdded"):
                    key = (
                        str(device.get("name")),
                        taint.get("key"),
                        taint.get("value", ""),
                        taint.get("effect"),
                    )
                    times[key] = taint["timeAdded"]
    return times


def _with_taint_times(
    devices: list[dict[str, Any]], times: Mapping[tuple[str, str, str, str], str]
) -> list[dict[str, Any]]:
    """Keep a taint's original timeAdded across rewrites, so it reads as when the device turned bad."""
    if not times:
        return devices
    out = []
    for device in devices:
        taints = device.get("taints")
        if taints:
            kept = []
            for taint in taints:
                added = times.get((device["name"], taint["key"], taint.get("value", ""), taint["effect"]))
                kept.append({**taint, "timeAdded": added} if added else taint)
            device = {**device, "taints": kept}
        out.append(device)
    return out


def _node_of(placement: Mapping[str, Any]) -> str | None:
    node = placement.get("nodeName")
    return str(node) if node else None


def _keep_slots(desired: DesiredPool, existing: Mapping[str, dict[str, Any]]) -> DesiredPool:
    """``desired`` with an empty node-local slice for each node of the pool that has one stored but
    no warm device now.

    A node's node-local slice stays once it exists, so the pool's slices — their number, names and
    ``nodeName`` — do not change each time a node's last warm device is taken or its first one
    comes, and such a change is written in place (:func:`_plan_in_place`) instead of as a new
    generation of every slice. The price is one empty slice per node that ever held warm devices
    of the pool (at most one per node it reaches); a node that leaves the pool loses its slot."""
    have = {_node_of(desired.placements[i]) for i in range(len(desired.chunks))}
    stored = {str(n) for obj in existing.values() if (n := (obj.get("spec") or {}).get("nodeName"))}
    keep = sorted((stored - have) & set(desired.nodes))
    if not keep:
        return desired
    local: list[tuple[str, int, list[dict[str, Any]], list[dict[str, Any]]]] = []
    shared: list[tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]] = []
    for index, (chunk, placement) in enumerate(zip(desired.chunks, desired.placements, strict=True)):
        node = _node_of(placement)
        if node is None:
            shared.append((chunk, placement, desired.sets(index)))
        else:
            local.append((node, index, chunk, desired.sets(index)))
    local += [(node, -1, [], []) for node in keep]
    local.sort(key=lambda item: (item[0], item[1]))
    chunks = [chunk for _, _, chunk, _ in local] + [chunk for chunk, _, _ in shared]
    placements = [{"nodeName": node} for node, _, _, _ in local] + [p for _, p, _ in shared]
    sets = [c for _, _, _, c in local] + [c for _, _, c in shared]
    return dataclasses.replace(
        desired, chunks=chunks, placements=placements, counter_sets=sets, _normal=None, _where=None
    )


def _replace(
    desired: DesiredPool,
    driver: str,
    index: int,
    generation: int,
    name: str,
    resource_version: str,
    devices: list[dict[str, Any]],
    times: Mapping[tuple[str, str, str, str], str],
) -> SliceWrite:
    """Replace slice ``index`` of ``desired`` under ``generation`` with ``devices`` in it."""
    spec = desired.spec(driver, index, generation)
    spec.pop("devices", None)
    if devices:
        spec["devices"] = _with_taint_times(devices, times)
    obj = {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": dict(desired.labels), "resourceVersion": resource_version},
        "spec": spec,
    }
    return SliceWrite(obj, resource_version, _normal_spec(spec, desired.normals))


def _same(
    stored: Mapping[str, Any],
    normal: dict[str, Any],
    normal_of: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> bool:
    """Whether stored slice ``stored`` already shows ``normal``. When it does, a :class:`NormalCache`
    is told to take ``normal`` as the stored slice's normal form: the next pass compares device by
    device *identity* (the memo keeps unchanged devices' normal forms), not 10,000 devices deeply."""
    now = normal_of(stored)
    if now != normal:
        return False
    if isinstance(normal_of, NormalCache) and now is not normal:
        normal_of.remember(stored, normal)
    return True


def _plan_in_place(
    desired: DesiredPool,
    existing: Mapping[str, dict[str, Any]],
    driver: str,
    normal_of: Callable[[Mapping[str, Any]], dict[str, Any]],
    only: AbstractSet[int] | None = None,
) -> PoolPlan | None:
    """The writes of a change that keeps the pool's slices — their number, names, node selection
    and counter sets — made in place under the pool's current generation: devices changed (a
    health, a taint, a drain), added or removed, or moving between slices (warm ones between the
    shared and node-local slices); None for any other change (those are a new generation of every
    slice, as before). Only the slices whose devices differ are written.

    The API server's rule for consumers (the structured allocator's ``GatherPools``,
    ``pools_experimental.go``) is that a pool is usable only when all ``resourceSliceCount``
    slices of its highest generation are seen (``IsIncomplete`` otherwise, and ``allocateOne``
    skips incomplete or invalid pools), and invalid when a device name appears twice in it
    (``validateDeviceNames``). Writing a new generation on every slice makes the pool incomplete
    for every node until the last write lands — with one pool per fabric, no device of that fabric
    is allocatable meanwhile. Kept at its generation and count the pool stays complete; ordered,
    it stays valid: first each changed slice is written with only the devices it already holds
    (the ones it loses are dropped), then each slice that gains devices is written whole, so a
    device is in at most one slice at every instant — at worst briefly in none. Upstream's own
    publisher keeps the generation for a change of one slice (``numNewSlices == 0 &&
    len(changedDesiredSlices) <= 1`` in ``resourceslice/resourceslicecontroller.go``); the
    ordering extends that to changes of several."""
    count = len(desired.chunks)
    if len(existing) != count:
        return None
    generations = {_generation(obj) for obj in existing.values()}
    if len(generations) != 1:
        return None
    generation = generations.pop()
    normal = desired.normal_specs(driver)
    stored: dict[int, dict[str, Any]] = {}
    for index in range(count) if only is None else sorted(only):
        obj = existing.get(slice_name(driver, desired.name, index, count))
        if obj is None:
            return None
        spec = obj.get("spec") or {}
        labels = _meta(obj).get("labels") or {}
        if int((spec.get("pool") or {}).get("resourceSliceCount") or 0) != count or any(
            labels.get(k) != v for k, v in desired.labels.items()
        ):
            return None
        now = normal_of(obj)
        # the same node selection (nodeName is immutable) and the same counter sets
        if {k: v for k, v in now.items() if k != "devices"} != {
            k: v for k, v in normal[index].items() if k != "devices"
        }:
            return None
        stored[index] = obj
    changed = [index for index, obj in stored.items() if not _same(obj, normal[index], normal_of)]
    # a device moves only between slices that change: their taints' times are all that is kept
    times = _taint_times(stored[index] for index in changed)
    writes: list[SliceWrite] = []
    writes_after: list[SliceWrite] = []
    for index in changed:
        obj = stored[index]
        now = normal_of(obj)
        name = str(_meta(obj)["name"])
        rv = str(_meta(obj).get("resourceVersion") or "")
        final = desired.chunks[index]
        kept = [d for d in final if d["name"] in now["devices"]]
        if len(kept) == len(final):
            # it only loses devices, or its devices change
            writes.append(_replace(desired, driver, index, generation, name, rv, final, times))
            continue
        first = _replace(desired, driver, index, generation, name, rv, kept, times)
        if first.normal != now:
            writes.append(first)
        writes_after.append(_replace(desired, driver, index, generation, name, rv, final, times))
    return PoolPlan(desired.name, generation, writes, [], writes_after=writes_after)


def plan_pool(
    pool: str,
    desired: DesiredPool | None,
    existing: Mapping[str, dict[str, Any]],
    *,
    driver: str,
    all_slices: Mapping[str, dict[str, Any]] | None = None,
    normal_of: Callable[[Mapping[str, Any]], dict[str, Any]] = _normal_slice,
    only: AbstractSet[int] | None = None,
) -> PoolPlan | None:
    """The writes that bring ``existing`` (this pool's stored slices, by name) to ``desired``.

    ``only``: the indices of the slices that can differ — the stored slices are what this role
    wrote for the pool ``desired`` was patched from (:mod:`.patch`) — so no other is compared.

    ``None`` when the pool is in sync. ``desired`` None means the pool is gone: delete it all.
    ``all_slices`` (every slice this role owns) lets a write detect a stored slice of the same
    name in another pool; pool names are immutable, so that one is deleted first.
    ``normal_of`` normalises a stored slice for comparison (a :class:`NormalCache` in the publisher).
    """
    if desired is None:
        if not existing:
            return None
        deletes = [
            (name, str(_meta(obj).get("resourceVersion") or "")) for name, obj in sorted(existing.items())
        ]
        return PoolPlan(pool=pool, generation=0, writes=[], deletes=deletes)
    check_pool(desired, only)
    kept = _keep_slots(desired, existing)
    if kept is not desired:
        only = None  # the indices moved: every slice is compared
    desired = kept
    if only is None and _in_sync(desired, existing, driver, normal_of):
        return None
    in_place = _plan_in_place(desired, existing, driver, normal_of, only)
    if in_place is not None:
        return in_place if (in_place.writes or in_place.writes_after or only is None) else None
    generation = max((_generation(obj) for obj in existing.values()), default=0) + 1
    times = _taint_times(existing.values())
    writes: list[SliceWrite] = []
    deletes_first: list[tuple[str, str]] = []
    wanted: set[str] = set()
    for index in range(len(desired.chunks)):
        name = slice_name(driver, desired.name, index, len(desired.chunks))
        wanted.add(name)
        spec = desired.spec(driver, index, generation)
        if "devices" in spec:
            spec["devices"] = _with_taint_times(spec["devices"], times)
        obj: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": dict(desired.labels)},
            "spec": spec,
        }
        stored = existing.get(name)
        if stored is not None and (stored.get("spec") or {}).get("nodeName") != spec.get("nodeName"):
            # nodeName is immutable (a slice turning node-local, or local to another node): the
            # stored slice goes first and this one is created.
            deletes_first.append((name, str(_meta(stored).get("resourceVersion") or "")))
            stored = None
        elif stored is None and all_slices is not None and name in all_slices:
            other = all_slices[name]
            deletes_first.append((name, str(_meta(other).get("resourceVersion") or "")))
        rv = str(_meta(stored).get("resourceVersion") or "") if stored is not None else None
        if stored is not None:
            obj["metadata"]["resourceVersion"] = rv
        writes.append(SliceWrite(obj, rv, desired.normal_specs(driver)[index]))
    deletes = [
        (name, str(_meta(obj).get("resourceVersion") or ""))
        for name, obj in sorted(existing.items())
        if name not in wanted
    ]
    return PoolPlan(pool, generation, writes, deletes, deletes_first)


# -- the API server's own rules -------------------------------------------------------------


def _check_qualified_attribute(name: str, where: str) -> None:
    domain, sep, ident = name.rpartition("/")
    if sep and not is_driver_name(domain):
        raise SliceInvalid(f"{where}: domain {domain!r} is not a DNS subdomain of at most 63 characters")
    if not is_attribute_id(ident):
        raise SliceInvalid(f"{where}: {ident!r} is not a C identifier of at most 32 characters")


def _check_device(device: Mapping[str, Any], where: str) -> None:
    name = str(device.get("name") or "")
    if not is_dns1123_label(name):
        raise SliceInvalid(f"{where}.name: {name!r} is not a DNS label")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX:
        raise SliceInvalid(
            f"{where}: more than {DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX} attributes and capacities"
        )
    for attr_name, value in attributes.items():
        at = f"{where}.attributes[{attr_name}]"
        _check_qualified_attribute(attr_name, at)
        if not isinstance(value, Mapping) or len(value) != 1:
            raise SliceInvalid(f"{at}: exactly one of int, bool, string, version must be set")
        ((kind, item),) = value.items()
        if kind in ("string", "version") and len(str(item).encode()) > ATTRIBUTE_VALUE_MAX_BYTES:
            raise SliceInvalid(f"{at}: longer than {ATTRIBUTE_VALUE_MAX_BYTES} bytes")
        if kind not in ("int", "bool", "string", "version"):
            raise SliceInvalid(f"{at}: unknown value type {kind!r}")
    for cap_name, entry in capacity.items():
        at = f"{where}.capacity[{cap_name}]"
        _check_qualified_attribute(cap_name, at)
        problem = _quantity_problem(str((entry or {}).get("value")))
        if problem is not None:
            raise SliceInvalid(f"{at}.value: {problem}")
    taints = device.get("taints") or []
    if len(taints) > DEVICE_TAINTS_MAX:
        raise SliceInvalid(f"{where}.taints: more than {DEVICE_TAINTS_MAX}")
    for i, taint in enumerate(taints):
        if not is_qualified_name(str(taint.get("key") or "")):
            raise SliceInvalid(f"{where}.taints[{i}].key: not a label name")
        if not is_label_value(str(taint.get("value") or "")):
            raise SliceInvalid(f"{where}.taints[{i}].value: not a label value")
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            raise SliceInvalid(f"{where}.taints[{i}].effect: must be NoSchedule or NoExecute")
    for key in ("bindingConditions", "bindingFailureConditions"):
        conditions = device.get(key) or []
        if len(conditions) > BINDING_CONDITIONS_MAX:
            raise SliceInvalid(f"{where}.{key}: more than {BINDING_CONDITIONS_MAX}")
        for condition in conditions:
            if not is_qualified_name(condition):
                raise SliceInvalid(f"{where}.{key}: {condition!r} is not a valid condition type")
        if conditions and device.get("bindsToNode") is not True:
            raise SliceInvalid(f"{where}.{key}: set without bindsToNode: true")


def _check_counters(counters: Any, where: str, limit: int | None) -> None:
    if not isinstance(counters, Mapping) or not counters:
        raise SliceInvalid(f"{where}: required")
    if limit is not None and len(counters) > limit:
        raise SliceInvalid(f"{where}: {len(counters)} counters, at most {limit} allowed")
    for name, entry in counters.items():
        if not is_dns1123_label(str(name)):
            raise SliceInvalid(f"{where}[{name}]: not a DNS label")
        problem = _quantity_problem(str((entry or {}).get("value")))
        if problem is not None:
            raise SliceInvalid(f"{where}[{name}].value: {problem}")


def _check_shared_counters(sets: list[Any], layout: CounterLayout) -> dict[str, set[str]]:
    """``validateCounterSet`` of the release's layout; the sets' counters by set name."""
    split = layout is not CounterLayout.COMBINED
    if split and len(sets) > SLICE_MAX_COUNTER_SETS:
        raise SliceInvalid(f"spec.sharedCounters: {len(sets)} counter sets, at most {SLICE_MAX_COUNTER_SETS}")
    total = sum(len(s.get("counters") or {}) for s in sets)
    if not split and total > SLICE_MAX_SHARED_COUNTERS_1_34:
        raise SliceInvalid(f"spec.sharedCounters: {total} counters, at most {SLICE_MAX_SHARED_COUNTERS_1_34}")
    published: dict[str, set[str]] = {}
    for i, counter_set in enumerate(sets):
        name = str(counter_set.get("name") or "")
        if not is_dns1123_label(name):
            raise SliceInvalid(f"spec.sharedCounters[{i}].name: {name!r} is not a DNS label")
        if name in published:
            raise SliceInvalid(f"spec.sharedCounters[{i}].name: duplicate counter set {name!r}")
        counters = counter_set.get("counters")
        _check_counters(
            counters, f"spec.sharedCounters[{i}].counters", COUNTER_SET_MAX_COUNTERS if split else None
        )
        published[name] = set(counters)
    return published


def _check_consumes(
    device: Mapping[str, Any], where: str, layout: CounterLayout, published: Mapping[str, set[str]]
) -> int:
    """``validateDeviceCounterConsumption``; the counters the device consumes."""
    consumes = device.get("consumesCounters") or []
    split = layout is not CounterLayout.COMBINED
    if split and len(consumes) > DEVICE_MAX_COUNTER_CONSUMPTIONS:
        raise SliceInvalid(f"{where}.consumesCounters: more than {DEVICE_MAX_COUNTER_CONSUMPTIONS}")
    total = 0
    for i, consumption in enumerate(consumes):
        at = f"{where}.consumesCounters[{i}]"
        counter_set = str(consumption.get("counterSet") or "")
        if not is_dns1123_label(counter_set):
            raise SliceInvalid(f"{at}.counterSet: {counter_set!r} is not a DNS label")
        counters = consumption.get("counters")
        _check_counters(counters, f"{at}.counters", CONSUMPTION_MAX_COUNTERS if split else None)
        total += len(counters)
        if not split:
            # 1.34: a device consumes only counters of a set published in its own slice
            missing = set(counters) - published.get(counter_set, set())
            if counter_set not in published or missing:
                raise SliceInvalid(
                    f"{at}: counter set {counter_set!r} of this slice has no {sorted(missing)}"
                )
    if not split and total > DEVICE_MAX_COUNTERS_1_34:
        raise SliceInvalid(f"{where}: consumes {total} counters, at most {DEVICE_MAX_COUNTERS_1_34}")
    return total


def _check_request_policy(device: Mapping[str, Any], where: str) -> None:
    """``validateMultiAllocatableDeviceCapacity`` of the range policies this role writes."""
    for name, entry in (device.get("capacity") or {}).items():
        policy = (entry or {}).get("requestPolicy")
        if policy is None:
            continue
        at = f"{where}.capacity[{name}].requestPolicy"
        if device.get("allowMultipleAllocations") is not True:
            raise SliceInvalid(f"{at}: allowMultipleAllocations must be true")
        valid_range = policy.get("validRange")
        if valid_range is None:
            continue
        value = parse_quantity(str(entry.get("value"))).value
        low, high, step, default = (
            parse_quantity(str(v)).value if v is not None else None
            for v in (
                valid_range.get("min"),
                valid_range.get("max"),
                valid_range.get("step"),
                policy.get("default"),
            )
        )
        if low is None or default is None:
            raise SliceInvalid(f"{at}: validRange.min and default are required")
        if low > value or (high is not None and (high > value or high < low)):
            raise SliceInvalid(f"{at}.validRange: outside the capacity's value")
        if default < low or (high is not None and default > high):
            raise SliceInvalid(f"{at}.default: outside validRange")
        if step is not None:
            if step <= 0 or low + step > value:
                raise SliceInvalid(f"{at}.validRange.step: not a step within the capacity's value")
            for amount in (default, high):
                if amount is not None and (amount - low) % step:
                    raise SliceInvalid(f"{at}: {amount} is not a whole number of steps from min")


def check_pool(desired: DesiredPool, only: AbstractSet[int] | None = None) -> None:
    """Raise :class:`SliceInvalid` when a device of the pool consumes a counter set or counter the
    pool does not publish: the allocator takes such a pool for invalid as a whole (``poolIsInvalid``),
    so it is never written. ``only``: the devices of these slices (the others were checked before)."""
    published: dict[str, set[str]] = {}
    for index in range(len(desired.chunks)):
        for counter_set in desired.sets(index):
            published[str(counter_set["name"])] = set(counter_set.get("counters") or {})
    for chunk in desired.chunks if only is None else [desired.chunks[i] for i in sorted(only)]:
        for device in chunk:
            for consumption in device.get("consumesCounters") or []:
                name = str(consumption.get("counterSet"))
                missing = set(consumption.get("counters") or {}) - published.get(name, set())
                if name not in published or missing:
                    raise SliceInvalid(
                        f"pool {desired.name}: device {device.get('name')} consumes counter set {name!r} "
                        f"the pool does not publish{f' (no {sorted(missing)})' if missing else ''}"
                    )


def check_slice(obj: Mapping[str, Any], layout: CounterLayout = CounterLayout.SPLIT) -> None:
    """Raise :class:`SliceInvalid` naming the field when the API server would reject ``obj``.

    Covers the Go-side validation of resource.k8s.io/v1 ResourceSlices that JSON schemas do
    not express (names, lengths, counts, counters, request policies) for the release ``layout``
    stands for (``COMBINED``: 1.34; else 1.35+); the schemas themselves are checked in tests.
    """
    name = str(_meta(obj).get("name") or "")
    if not is_dns1123_subdomain(name):
        raise SliceInvalid(f"metadata.name: {name!r} is not a DNS subdomain")
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver") or "")
    if not is_driver_name(driver):
        raise SliceInvalid(f"spec.driver: {driver!r} is not a DNS subdomain of at most 63 characters")
    pool = spec.get("pool") or {}
    if not is_pool_name(str(pool.get("name") or "")):
        raise SliceInvalid(f"spec.pool.name: {pool.get('name')!r} is not a valid pool name")
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        raise SliceInvalid("spec.pool.resourceSliceCount: must be greater than zero")
    if int(pool.get("generation") or 0) < 0:
        raise SliceInvalid("spec.pool.generation: must not be negative")
    chosen = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(chosen) != 1:
        raise SliceInvalid("spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    if "nodeSelector" in chosen and len(spec["nodeSelector"].get("nodeSelectorTerms") or []) != 1:
        raise SliceInvalid("spec.nodeSelector.nodeSelectorTerms: must have exactly one term")
    devices = spec.get("devices") or []
    if layout is not CounterLayout.COMBINED and "sharedCounters" in spec and "devices" in spec:
        raise SliceInvalid("spec: only one of `sharedCounters` or `devices` is allowed")
    published = _check_shared_counters(spec.get("sharedCounters") or [], layout)
    # 1.34 halves the limit for taints only (this role always does); 1.35+ for counters too
    advanced = halves_limit if layout is not CounterLayout.COMBINED else lambda d: bool(d.get("taints"))
    limit = SLICE_MAX_DEVICES_WITH_TAINTS if any(advanced(d) for d in devices) else SLICE_MAX_DEVICES
    if len(devices) > limit:
        raise SliceInvalid(f"spec.devices: {len(devices)} devices, at most {limit} allowed")
    seen: set[str] = set()
    consumed = 0
    for i, device in enumerate(devices):
        _check_device(device, f"spec.devices[{i}]")
        consumed += _check_consumes(device, f"spec.devices[{i}]", layout, published)
        _check_request_policy(device, f"spec.devices[{i}]")
        if device["name"] in seen:
            raise SliceInvalid(f"spec.devices[{i}].name: duplicate device {device['name']!r}")
        seen.add(device["name"])
    if layout is CounterLayout.COMBINED and consumed > SLICE_MAX_DEVICE_COUNTERS_1_34:
        raise SliceInvalid(
            f"spec.devices: {consumed} counters consumed, at most {SLICE_MAX_DEVICE_COUNTERS_1_34}"
        )
