"""The desired pools of the last pass, patched with the devices one change brought.

A whole build (:func:`.slices.desired_pools`) walks every device of the inventory: its conversion
taken from the memo, its unit, the layout of its node selection — tens of milliseconds at 10,000
devices for a change of one. :func:`patch_pools` does what that build would do for the devices of a
:class:`~.delta.DeviceDelta` only, and builds exactly what the whole build would from the same last
layout (:mod:`.layout`): a changed device is rendered again into the slice it is in, a removed one is
taken out of it, an added one (or one published again after being withheld) goes into the first
slice of its node selection with room. Only the slices that changed get a new normal form; the
others stay the very objects they were, and the publisher compares and writes only the changed
ones (:func:`.slices.plan_pool`, ``only``).

What it does not patch it leaves to the whole build (None): a device warm on a node, a GPU with
partitions or one whose partitions a node holds, 1.34's combined counter layout, a device whose
node selection has no slice yet, a slice that would empty or run out of room, a device added to a
selection with no slice with room (a new slice is a new generation of the pool anyway) — rare, and
each changes more than one slice.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.controller.delta import DeviceDelta
from dra_driver.controller.devices import CounterLayout, PublishPolicy, WithheldReason
from dra_driver.controller.layout import device_name, has_room, placement_key, slice_limit
from dra_driver.controller.render_memo import RenderMemo
from dra_driver.controller.slices import (
    DesiredPool,
    DeviceMarks,
    convert_device,
    node_selector,
    partition_node,
    reaching_nodes,
    warm_node,
)
from dra_driver.errors import ControllerError
from manager_api.models import Device, Inventory

__all__ = ["Patched", "patch_pools"]

Key = tuple[str, str]


@dataclass
class Patched:
    """The pools after a patch, and per pool the indices of the slices it changed."""

    pools: dict[str, DesiredPool]
    changed: dict[str, set[int]] = field(default_factory=dict)


class _Unpatchable(ControllerError):
    """This change is the whole build's to make."""


@dataclass
class _PoolEdit:
    """One pool's chunks, withheld devices and placements as a patch changes them."""

    pool: DesiredPool
    chunks: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    withheld: dict[str, WithheldReason] | None = None
    where: dict[str, int | None] = field(default_factory=dict)
    #: (device name, its rendered form) to place in a slice with room, by node selection
    pending: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    #: the slice each device taken out was in
    was: dict[str, int] = field(default_factory=dict)

    def chunk(self, index: int) -> list[dict[str, Any]]:
        if index not in self.chunks:
            self.chunks[index] = list(self.pool.chunks[index])
        return self.chunks[index]

    def index_of(self, name: str) -> int | None:
        return self.where[name] if name in self.where else self.pool.where().get(name)

    def set_withheld(self, name: str, reason: WithheldReason | None) -> None:
        if self.pool.withheld.get(name) == reason and (self.withheld is None or name not in self.withheld):
            return
        if self.withheld is None:
            self.withheld = dict(self.pool.withheld)
        if reason is None:
            self.withheld.pop(name, None)
        else:
            self.withheld[name] = reason

    def take_out(self, name: str, memo: RenderMemo | None) -> None:
        index = self.index_of(name)
        if index is None:
            return
        chunk = self.chunk(index)
        for device in chunk:
            if device_name(device) == name and memo is not None:
                memo.normals.forget(device)
        chunk[:] = [d for d in chunk if device_name(d) != name]
        self.where[name] = None
        self.was.setdefault(name, index)

    def put(self, group: str | None, device: dict[str, Any]) -> None:
        """A device rendered anew: back into the slice it was in, else to be placed."""
        name = device_name(device)
        index = self.was.get(name)
        if index is None:
            self.pending.append((group, device))
            return
        self.chunk(index).append(device)
        self.where[name] = index

    def selection(self, driver: str, group: str | None) -> list[int]:
        """The indices of the slices of ``group``'s node selection, in order."""
        key = placement_key({"nodeSelector": node_selector(driver, self.pool.name, group)})
        return [
            i for i, p in enumerate(self.pool.placements) if "nodeSelector" in p and placement_key(p) == key
        ]

    def place(self, driver: str, taintable: bool) -> None:
        for group, device in sorted(self.pending, key=lambda item: device_name(item[1])):
            target = next(
                (i for i in self.selection(driver, group) if has_room(self.chunk(i), device, taintable)), None
            )
            if target is None:
                raise _Unpatchable("no slice of its selection has room")
            self.chunk(target).append(device)
            self.where[device_name(device)] = target

    def result(self, memo: RenderMemo | None, taintable: bool) -> tuple[DesiredPool, set[int]]:
        for index, chunk in self.chunks.items():
            if not chunk or len(chunk) > slice_limit(chunk, taintable):
                raise _Unpatchable("a slice empties or runs past its limit")
            chunk.sort(key=device_name)
            if memo is not None:
                memo.forget_chunk(self.pool.chunks[index])
        withheld = self.pool.withheld if self.withheld is None else self.withheld
        return self.pool.patched(self.chunks, withheld, self.where), set(self.chunks)


def _simple(
    device: Device, policy: PublishPolicy, reaching: Mapping[tuple[str, str | None], frozenset[str]]
) -> bool:
    """A device whose place is one slice of its reach group's selection, alone (no partitions, not
    in a node-local slice)."""
    if device.partition_table is not None and policy.counters is not CounterLayout.OFF:
        return False
    return warm_node(device, reaching) is None and partition_node(device, reaching) is None


def patch_pools(
    pools: Mapping[str, DesiredPool],
    after: Inventory,
    delta: DeviceDelta,
    policy: PublishPolicy,
    marks: DeviceMarks,
    memo: RenderMemo | None,
) -> Patched | None:
    """``pools`` (built or patched from the inventory before ``after``, with the same policy, marks,
    pools and reach groups) patched with ``delta``; None when the change is the whole build's
    (module docstring)."""
    try:
        return _patch(pools, after, delta, policy, marks, memo)
    except _Unpatchable:
        return None


def _patch(
    pools: Mapping[str, DesiredPool],
    after: Inventory,
    delta: DeviceDelta,
    policy: PublishPolicy,
    marks: DeviceMarks,
    memo: RenderMemo | None,
) -> Patched:
    if policy.counters is CounterLayout.COMBINED:
        raise _Unpatchable("1.34's layout is packed afresh")
    reaching = reaching_nodes(after)
    edits: dict[str, _PoolEdit] = {}

    def edit(device: Device) -> _PoolEdit:
        if not _simple(device, policy, reaching) or device.pool not in pools:
            raise _Unpatchable(f"device {device.name}")
        if device.pool not in edits:
            edits[device.pool] = _PoolEdit(pools[device.pool])
        return edits[device.pool]

    new_keys = [(d.pool, d.name) for d in delta.new]
    if len(set(new_keys)) != len(new_keys):
        raise _Unpatchable("a device name twice")
    for device in delta.old:
        edit(device).take_out(device.name, memo)
        if memo is not None:
            memo.conversions.forget(device)
    for device in delta.new:
        change = edit(device)
        key = (device.pool, device.name)
        reason, link_fault = marks.quarantined.get(key), marks.link_faults.get(key)
        convert = functools.partial(convert_device, device, policy, reason, link_fault)
        if memo is None:
            whole, _, _, unit = convert()
        else:
            whole, _, _, unit = memo.conversions.get(device, convert, (policy, reason, link_fault))
        change.set_withheld(device.name, whole.withheld)
        if unit is not None:
            change.put(device.reach, unit.devices[0])
    changed: dict[str, set[int]] = {}
    out = dict(pools)
    for name, change in edits.items():
        change.place(policy.driver, policy.device_taints)
        out[name], changed[name] = change.result(memo, policy.device_taints)
    return Patched(out, changed)
