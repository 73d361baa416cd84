"""Resource pools as one node sees them (``GatherPools`` in the allocator's pools.go).

A pool is the set of ResourceSlices with the same driver and pool name; only slices of the
newest generation count; a pool whose slice count does not match ``resourceSliceCount`` is
incomplete (being updated) and one with duplicate device names invalid. Pools are ordered by
driver and name, slices by name, and pools with binding conditions come last, so the
first-fit search prefers devices that need no attach before binding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.selection.celenv import AttributeValue, DeviceInput
from dra_driver.selection.model import Device, Node, ResourceSlice
from dra_driver.selection.nodes import describe_node_selector, node_matches
from dra_driver.selection.semver import SemverError, parse_semver

__all__ = ["DeviceID", "DeviceRef", "Pool", "PoolView", "gather_pools"]

#: (driver, pool, device): what ``status.allocation.devices.results`` name.
DeviceID = tuple[str, str, str]


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
    slices: list[ResourceSlice] = field(default_factory=list)
    incomplete: bool = False
    invalid_reason: str | None = None
    #: every device of the pool's slices, in search order
    refs: list[DeviceRef] = field(default_factory=list)

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


def gather_pools(slices: Sequence[ResourceSlice], node: Node) -> PoolView:
    unreachable: dict[DeviceID, str] = {}
    relevant: dict[tuple[str, str], list[ResourceSlice]] = {}
    for slice_ in slices:
        if slice_.spec.shared_counters and not slice_.spec.devices:
            continue  # counter-only slices carry no devices
        reachable, why = _slice_reach(slice_, node)
        if not reachable:
            for device in slice_.spec.devices:
                unreachable[(slice_.spec.driver, slice_.spec.pool.name, device.name)] = why
            continue
        key = (slice_.spec.driver, slice_.spec.pool.name)
        current = relevant.get(key)
        if current is None or slice_.spec.pool.generation > current[0].spec.pool.generation:
            if current is not None:
                _mark_outdated(current, slice_.spec.pool.generation, unreachable)
            relevant[key] = [slice_]
        elif slice_.spec.pool.generation < current[0].spec.pool.generation:
            _mark_outdated([slice_], current[0].spec.pool.generation, unreachable)
        else:
            current.append(slice_)

    pools: list[Pool] = []
    for (driver, name), pool_slices in relevant.items():
        generation = pool_slices[0].spec.pool.generation
        expected = pool_slices[0].spec.pool.resource_slice_count
        same_generation = [
            s
            for s in slices
            if s.spec.driver == driver and s.spec.pool.name == name and s.spec.pool.generation == generation
        ]
        newer = [
            s
            for s in slices
            if s.spec.driver == driver and s.spec.pool.name == name and s.spec.pool.generation > generation
        ]
        if newer:
            # The driver is replacing this generation and the new one has nothing for this node.
            _mark_outdated(pool_slices, newer[0].spec.pool.generation, unreachable)
            continue
        ordered = sorted(pool_slices, key=lambda s: s.name)
        refs = [DeviceRef(s, d) for s in ordered for d in s.spec.devices]
        pool = Pool(driver, name, generation, ordered, refs=refs)
        if len(same_generation) != expected:
            pool.incomplete = True
        seen: set[str] = set()
        for ref in refs:
            if ref.device.name in seen:
                pool.invalid_reason = f"duplicate device name {ref.device.name}"
                break
            seen.add(ref.device.name)
        pools.append(pool)
    pools.sort(key=lambda p: (p.has_binding_conditions, p.driver, p.name))
    return PoolView(node, pools, unreachable)


def _mark_outdated(
    slices: Sequence[ResourceSlice], generation: int, unreachable: dict[DeviceID, str]
) -> None:
    for slice_ in slices:
        for device in slice_.spec.devices:
            unreachable[(slice_.spec.driver, slice_.spec.pool.name, device.name)] = (
                f"slice {slice_.name} is outdated (pool generation {slice_.spec.pool.generation}, "
                f"current {generation})"
            )
