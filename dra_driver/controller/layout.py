"""Where each device of a pool sits among its slices, and where a device that needs a place goes.

A fresh pool is cut in name order (:func:`cut`: ≤ 128 devices a slice, ≤ 64 where taints are
published or a device consumes counters). After that, a device *stays* in the slice it is in
(:func:`sticky_chunks`): a device changed is rendered again into its own slice, a device removed is
taken out of its slice, and a device added (or published again after being withheld) goes into the
first slice of its node selection with room, in slice order, or into a new slice when none has
room. Cutting the pool again in name order instead would move every device after an added or
removed one into the next slice — a write of every one of those slices for a change of one device.

So the layout depends on the order of changes, not only on the inventory: two controllers that saw
the same devices come and go in different steps may place them differently, both valid (each
device in exactly one slice of its node selection, no slice past its limit). What makes it
reproducible is that the layout is *read back*: a controller that starts over stored slices takes
their placement as its starting point (:func:`stored_layout`), so a restart over an unchanged
inventory writes nothing, and only a pool without stored slices is cut afresh.

A slice that empties is dropped, and one that a change puts past its limit gives up its last
devices by name to be placed again; either changes the number of the pool's slices, which is a new
generation of every slice anyway (:mod:`.slices`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dra_driver.controller.resourcenames import SLICE_MAX_DEVICES, SLICE_MAX_DEVICES_WITH_TAINTS

__all__ = [
    "Layout",
    "cut",
    "device_name",
    "halves_limit",
    "has_room",
    "placement_key",
    "slice_limit",
    "sticky_chunks",
    "stored_layout",
    "stored_layouts",
]

#: placement key (:func:`placement_key`) → the device names of each of its slices, in slice order
Layout = dict[str, list[list[str]]]


def device_name(device: Mapping[str, Any]) -> str:
    return str(device["name"])


def halves_limit(device: Mapping[str, Any]) -> bool:
    """A device that halves its slice's limit: tainted, or consuming counters (1.35+)."""
    return bool(device.get("taints") or device.get("consumesCounters"))


def slice_limit(devices: Iterable[Mapping[str, Any]], taintable: bool) -> int:
    """The most devices a slice holding ``devices`` may have (``ResourceSliceMaxDevices``, or
    ``…WithTaintsOrConsumesCounters`` where any is tainted or consumes counters, or where taints are
    published at all: ``taintable``)."""
    if taintable or any(halves_limit(d) for d in devices):
        return SLICE_MAX_DEVICES_WITH_TAINTS
    return SLICE_MAX_DEVICES


def has_room(chunk: Sequence[Mapping[str, Any]], device: Mapping[str, Any], taintable: bool) -> bool:
    """Whether ``device`` fits in the slice holding ``chunk``."""
    return len(chunk) < slice_limit([*chunk, device], taintable)


def cut(devices: Sequence[dict[str, Any]], *, taintable: bool = False) -> list[list[dict[str, Any]]]:
    """Split (sorted) devices into slices: ≤ 128 each, ≤ 64 in a slice where any device is tainted
    or consumes counters (``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters``).

    ``taintable``: any device may carry a taint tomorrow (the policy publishes taints), so every
    slice is cut at 64 — a device turning unhealthy, drained or quarantined then changes its own
    slice only, instead of halving that slice's limit."""
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    tainted = False
    for device in devices:
        has_taints = taintable or halves_limit(device)
        if has_taints and not tainted and len(current) >= SLICE_MAX_DEVICES_WITH_TAINTS:
            chunks.append(current)
            current, tainted = [], False
        current.append(device)
        tainted = tainted or has_taints
        if len(current) >= (SLICE_MAX_DEVICES_WITH_TAINTS if tainted else SLICE_MAX_DEVICES):
            chunks.append(current)
            current, tainted = [], False
    if current or not chunks:
        chunks.append(current)  # an empty pool still has one (empty) slice
    return chunks


def sticky_chunks(
    devices: Sequence[dict[str, Any]], before: Sequence[Sequence[str]] | None, *, taintable: bool
) -> list[list[dict[str, Any]]]:
    """The slices of one node selection: each device of ``before`` (its slices' device names) that
    is still here stays in its slice, the others go to the first slice with room, then to new
    slices (module docstring); without ``before``, :func:`cut` in name order."""
    if not before:
        return cut(sorted(devices, key=device_name), taintable=taintable)
    by_name = {device_name(d): d for d in devices}
    chunks: list[list[dict[str, Any]]] = []
    for names in before:
        chunk = [by_name.pop(n) for n in names if n in by_name]
        if not chunk:
            continue  # emptied: dropped
        chunk.sort(key=device_name)
        limit = slice_limit(chunk, taintable)
        for device in chunk[limit:]:
            by_name[device_name(device)] = device  # past the limit now: placed again below
        chunks.append(chunk[:limit])
    leftover: list[dict[str, Any]] = []
    for device in sorted(by_name.values(), key=device_name):
        target = next((c for c in chunks if has_room(c, device, taintable)), None)
        if target is None:
            leftover.append(device)
        else:
            target.append(device)
            target.sort(key=device_name)
    if leftover or not chunks:
        chunks += cut(leftover, taintable=taintable)
    return chunks


def placement_key(placement: Mapping[str, Any]) -> str:
    """A node selection (``{"nodeName": …}`` or ``{"nodeSelector": …}``) as one comparable string,
    the same for what this role renders and what the API server stores of it."""
    return json.dumps(_pruned(dict(placement)), sort_keys=True)


def _pruned(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _pruned(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def stored_layout(
    stored: Mapping[str, Mapping[str, Any]], sort_key: Callable[[str], Any] = lambda name: name
) -> Layout:
    """The placement of one pool's stored slices (by name): per node selection, the device names of
    each slice holding devices, in name order of the slices (the order they were written in)."""
    layout: Layout = {}
    for name in sorted(stored, key=sort_key):
        spec = stored[name].get("spec") or {}
        names = [str(d.get("name")) for d in spec.get("devices") or [] if isinstance(d, Mapping)]
        if not names:
            continue
        selection = {k: spec[k] for k in ("nodeName", "nodeSelector") if spec.get(k)}
        layout.setdefault(placement_key(selection), []).append(names)
    return layout


def stored_layouts(slices: Mapping[str, Mapping[str, Any]]) -> dict[str, Layout]:
    """:func:`stored_layout` of every pool of ``slices`` (stored slices by name): a controller
    that starts over them keeps them as they are."""
    by_pool: dict[str, dict[str, Mapping[str, Any]]] = {}
    for name, obj in slices.items():
        pool = str(((obj.get("spec") or {}).get("pool") or {}).get("name") or "")
        by_pool.setdefault(pool, {})[name] = obj
    return {pool: stored_layout(of_pool) for pool, of_pool in by_pool.items()}
