"""Resource pools as one node sees them (``GatherPools``, ``buildPool`` and ``checkSlicesInPool`` in
``internal/incubating/pools_incubating.go``).

A pool is the set of ResourceSlices with the same driver and pool name; only slices of the
newest generation count. Device slices count when they serve the node; counter slices
(``sharedCounters``) always count, whatever their node selection, since the pool's devices need
them. When fewer slices than ``resourceSliceCount`` serve the node, all slices of the pool are
looked at: a newer generation anywhere makes this one obsolete (ignored), a slice count that
still does not match makes the pool incomplete (being updated), and the devices of slices for
other nodes are kept (``DeviceSlicesNotTargetingNode``) because they consume the same counters.
A pool is invalid with a duplicate device name, a duplicate counter set name, or a device —
on any node — consuming a counter set or counter the pool does not have.

A slice holding ``sharedCounters`` beside ``devices`` (the Kubernetes 1.34 layout, refused by a
1.35+ API server) is a counter slice to the 1.36 allocator: its counter sets count, its devices
are never allocated.

Pools are ordered by driver and name, slices by name, and pools with binding conditions come
last, so the first-fit search prefers devices that need no attach before binding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.selection.celenv import AttributeValue, DeviceInput
from dra_driver.selection.model import Device, Node, ResourceSlice
from dra_driver.selection.nodes import describe_node_selector, node_matches
from dra_driver.selection.semver import SemverError, parse_semver

__all__ = ["DeviceID", "DeviceRef", "Pool", "PoolID", "PoolView", "gather_pools"]

#: (driver, pool, device): what ``status.allocation.devices.results`` name.
DeviceID = tuple[str, str, str]
#: (driver, pool)
PoolID = tuple[str, str]


@dataclass(eq=False)
class DeviceRef:
    """One device of one slice, with its CEL input built once."""

    slice: ResourceSlice
    device: Device
    _activation: dict[str, Any] | None = field(default=None, repr=False)
    _activation_error: str | None = field(default=None, repr=False)
    _content: str | None = field(default=None, repr=False)

    @property
    def id(self) -> DeviceID:
        return (self.slice.spec.driver, self.slice.spec.pool.name, self.device.name)

    @property
    def label(self) -> str:
        return f"{self.slice.spec.pool.name}/{self.device.name}"

    @property
    def content(self) -> str:
        """Everything a selector can see of this device (its driver and the device's fields), as
        one string: two refs with the same content get the same outcome from any expression."""
        if self._content is None:
            self._content = f"{self.slice.spec.driver}\n{self.device.model_dump()!r}"
        return self._content

    def activation(self) -> dict[str, Any]:
        """The ``device`` variable; raises ValueError for a malformed attribute, as compile.go errors."""
        if self._activation_error is not None:
            raise ValueError(self._activation_error)
        if self._activation is None:
            attributes: dict[str, AttributeValue] = {}
            for name, attr in self.device.attributes.items():
                if attr.version_value is not None and attr.kind() == "version":
                    try:
                        attributes[name] = parse_semver(attr.version_value)
                    except SemverError as err:
                        self._activation_error = f"attribute {name}: parse semantic version: {err}"
                        raise ValueError(self._activation_error) from err
                    continue
                value = attr.value()
                if value is None:
                    self._activation_error = f"attribute {name}: unsupported attribute value"
                    raise ValueError(self._activation_error)
                attributes[name] = value
            self._activation = DeviceInput(
                driver=self.slice.spec.driver,
                attributes=attributes,
                capacity=dict(self.device.capacity),
                allow_multiple_allocations=bool(self.device.allow_multiple_allocations),
            ).activation()
        return self._activation


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    #: the device slices serving the node, in search order
    slices: list[ResourceSlice] = field(default_factory=list)
    incomplete: bool = False
    invalid_reason: str | None = None
    #: every device of the pool's slices serving the node, in search order
    refs: list[DeviceRef] = field(default_factory=list)
    #: devices of the pool's slices for other nodes: they consume the same counters
    other_refs: list[DeviceRef] = field(default_factory=list)
    #: counter set → counter → value, from the pool's counter slices
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict)

    @property
    def id(self) -> PoolID:
        return (self.driver, self.name)

    @property
    def has_binding_conditions(self) -> bool:
        return any(ref.device.binding_conditions for ref in self.refs)


@dataclass
class PoolView:
    """What one node can allocate from, and why every other published device is out of reach."""

    node: Node
    pools: list[Pool]
    #: device id → why the node cannot use it (slice for another node, outdated generation, …)
    unreachable: dict[DeviceID, str]


def _slice_reach(slice_: ResourceSlice, node: Node) -> tuple[bool, str]:
    spec = slice_.spec
    if spec.node_name:
        return spec.node_name == node.name, f"slice {slice_.name} serves node {spec.node_name} only"
    if spec.all_nodes:
        return True, ""
    if spec.node_selector is not None:
        return (
            node_matches(node, None, None, spec.node_selector),
            f"node {node.name} does not match the node selector of slice {slice_.name} "
            f"({describe_node_selector(spec.node_selector)})",
        )
    if spec.per_device_node_selection:
        reachable = any(node_matches(node, d.node_name, d.all_nodes, d.node_selector) for d in spec.devices)
        return reachable, f"no device of slice {slice_.name} serves node {node.name}"
    return False, f"slice {slice_.name} names no nodes (unsupported node selection)"


def _mark(unreachable: dict[DeviceID, str], slices: Sequence[ResourceSlice], why: str) -> None:
    for slice_ in slices:
        for device in slice_.spec.devices:
            unreachable[(slice_.spec.driver, slice_.spec.pool.name, device.name)] = why


def _mark_outdated(
    slices: Sequence[ResourceSlice], generation: int, unreachable: dict[DeviceID, str]
) -> None:
    for slice_ in slices:
        _mark(
            unreachable,
            [slice_],
            f"slice {slice_.name} is outdated (pool generation {slice_.spec.pool.generation}, "
            f"current {generation})",
        )


def _add_slice(
    relevant: dict[PoolID, list[ResourceSlice]], slice_: ResourceSlice, unreachable: dict[DeviceID, str]
) -> None:
    """``addSlice``: only the newest generation of a pool is kept."""
    key = (slice_.spec.driver, slice_.spec.pool.name)
    current = relevant.get(key)
    generation = slice_.spec.pool.generation
    if current is None or generation > current[0].spec.pool.generation:
        if current is not None:
            _mark_outdated(current, generation, unreachable)
        relevant[key] = [slice_]
    elif generation < current[0].spec.pool.generation:
        _mark_outdated([slice_], current[0].spec.pool.generation, unreachable)
    else:
        current.append(slice_)


def _relevant_slices(
    slices: Sequence[ResourceSlice], node: Node, partitionable: bool, unreachable: dict[DeviceID, str]
) -> dict[PoolID, list[ResourceSlice]]:
    relevant: dict[PoolID, list[ResourceSlice]] = {}
    for slice_ in slices:
        spec = slice_.spec
        if not partitionable and (spec.per_device_node_selection is not None or spec.shared_counters):
            _mark(unreachable, [slice_], f"slice {slice_.name} needs DRAPartitionableDevices, which is off")
            continue
        if spec.shared_counters:
            if spec.devices:
                _mark(
                    unreachable,
                    [slice_],
                    f"slice {slice_.name} holds sharedCounters beside devices (the Kubernetes 1.34 "
                    "layout): from 1.35 on, the scheduler reads its counters and allocates none "
                    "of its devices",
                )
            _add_slice(relevant, slice_, unreachable)
            continue
        reachable, why = _slice_reach(slice_, node)
        if reachable:
            _add_slice(relevant, slice_, unreachable)
        else:
            _mark(unreachable, [slice_], why)
    return relevant


def _check_slices_in_pool(
    slices: Sequence[ResourceSlice], key: PoolID, generation: int
) -> tuple[ResourceSlice | None, list[ResourceSlice]]:
    """``checkSlicesInPool``: a slice of a newer generation (the pool is obsolete), or every slice
    of this generation."""
    same: list[ResourceSlice] = []
    for slice_ in slices:
        if (slice_.spec.driver, slice_.spec.pool.name) != key:
            continue
        if slice_.spec.pool.generation > generation:
            return slice_, []
        if slice_.spec.pool.generation == generation:
            same.append(slice_)
    return None, same


def gather_pools(slices: Sequence[ResourceSlice], node: Node, *, partitionable: bool = True) -> PoolView:
    """``GatherPools`` for ``node``; ``partitionable`` is the ``DRAPartitionableDevices`` gate."""
    unreachable: dict[DeviceID, str] = {}
    pools: list[Pool] = []
    for key, pool_slices in _relevant_slices(slices, node, partitionable, unreachable).items():
        generation = pool_slices[0].spec.pool.generation
        expected = pool_slices[0].spec.pool.resource_slice_count
        everything: list[ResourceSlice] | None = None
        if len(pool_slices) != expected:
            newer, everything = _check_slices_in_pool(slices, key, generation)
            if newer is not None:
                # The driver is replacing this generation and the new one has nothing for this node.
                _mark_outdated(pool_slices, newer.spec.pool.generation, unreachable)
                continue
        pool = _build_pool(key, generation, pool_slices, everything, partitionable)
        if everything is not None and len(everything) != expected:
            # upstream does not build (or judge) a pool it cannot see whole
            pool.incomplete, pool.invalid_reason = True, None
        pools.append(pool)
    pools.sort(key=lambda p: (p.has_binding_conditions, p.driver, p.name))
    return PoolView(node, pools, unreachable)


def _build_pool(
    key: PoolID,
    generation: int,
    pool_slices: list[ResourceSlice],
    everything: list[ResourceSlice] | None,
    partitionable: bool,
) -> Pool:
    """``buildPool``: device and counter slices apart, and the checks that make a pool invalid."""
    ordered = sorted(pool_slices, key=lambda s: s.name)
    counter_slices = [s for s in ordered if partitionable and s.spec.shared_counters]
    device_slices = [s for s in ordered if s not in counter_slices]
    refs = [DeviceRef(s, d) for s in device_slices for d in s.spec.devices]
    pool = Pool(key[0], key[1], generation, device_slices, refs=refs)
    pool.invalid_reason = _duplicate_device(refs)
    if pool.invalid_reason or not partitionable:
        return pool
    names = {s.name for s in pool_slices}
    others = sorted((s for s in everything or () if s.name not in names), key=lambda s: s.name)
    pool.other_refs = [DeviceRef(s, d) for s in others for d in s.spec.devices]
    pool.counter_sets, pool.invalid_reason = _counter_sets(counter_slices)
    if pool.invalid_reason is None:
        # every device of every slice: those of a combined (1.34) slice too, as upstream
        every = [DeviceRef(s, d) for s in [*ordered, *others] for d in s.spec.devices]
        pool.invalid_reason = _unknown_counter(every, pool.counter_sets)
    return pool


def _duplicate_device(refs: Sequence[DeviceRef]) -> str | None:
    seen: set[str] = set()
    for ref in refs:
        if ref.device.name in seen:
            return f"duplicate device name {ref.device.name}"
        seen.add(ref.device.name)
    return None


def _counter_sets(
    counter_slices: Sequence[ResourceSlice],
) -> tuple[dict[str, dict[str, Fraction]], str | None]:
    """``getAndValidateCounterSets``."""
    sets: dict[str, dict[str, Fraction]] = {}
    for slice_ in counter_slices:
        for counter_set in slice_.spec.shared_counters:
            if counter_set.name in sets:
                return {}, f"duplicate counter set name {counter_set.name}"
            sets[counter_set.name] = {name: q.value for name, q in counter_set.counters.items()}
    return sets, None


def _unknown_counter(refs: Sequence[DeviceRef], sets: dict[str, dict[str, Fraction]]) -> str | None:
    """``validateDeviceCounterConsumption``."""
    for ref in refs:
        for consumption in ref.device.consumes_counters:
            counters = sets.get(consumption.counter_set)
            if counters is None:
                return f"counter set {consumption.counter_set} not found"
            for name in consumption.counters:
                if name not in counters:
                    return f"counter {name} not found in counter set {consumption.counter_set}"
    return None
