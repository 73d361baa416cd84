"""Which devices one inventory changed against the one before it.

The inventory feed keeps a device that did not change as the very same object from version to
version (:class:`~manager_api.feed.InventoryModel`), in name order. So the devices a change brought
are found by comparing the two device lists a run at a time, as list comparisons (C loops that take
an object identical to itself as equal without looking into it): the common head and tail are cut
off by halving, and what is left between them is halved again until the runs that differ are a few
devices long (:func:`device_delta`). A change of one device of 10,000 costs some twenty
comparisons of list runs — about a millisecond on this project's bench machine, where a pass in
Python over every device costs tens. What follows from the delta — the slice layout, the node
labeller's warm counts, the quarantine's failure counts — then costs what changed.

Two lists compare element by element by identity first and by equality only where the objects
differ, so a device replaced by an equal one may count as unchanged: what is rendered from it is the
same. A whole read (the first, a resync, ``--inventory-feed full``) makes every device a new object:
its delta is every device, and each consumer does what it did on a whole inventory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from manager_api.models import Device, Inventory

__all__ = ["DeviceDelta", "KeptDevices", "device_delta", "first_of"]

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class DeviceDelta:
    """The devices of ``after`` not in ``before`` (changed or added) and those of ``before`` not in
    ``after`` (the old objects of devices changed, and of devices removed)."""

    new: list[Device]
    old: list[Device]

    def __len__(self) -> int:
        return len(self.new) + len(self.old)


#: the last deltas found: the publisher, the node labeller, the link judgement and the quarantine
#: each ask for the same pair of inventories, and the first one's answer serves the others
_RECENT: list[tuple[Inventory, Inventory, DeviceDelta]] = []
_RECENT_MAX = 4


def device_delta(before: Inventory, after: Inventory) -> DeviceDelta:
    """What ``after`` changed against ``before`` (module docstring)."""
    for was, now, delta in _RECENT:
        if was is before and now is after:
            return delta
    delta = _delta(before, after)
    _RECENT.append((before, after, delta))
    del _RECENT[:-_RECENT_MAX]
    return delta


def _delta(before: Inventory, after: Inventory) -> DeviceDelta:
    a, b = before.devices, after.devices
    if a is b:
        return DeviceDelta([], [])
    head = _common_head(a, b)
    tail = _common_tail(a, b, min(len(a), len(b)) - head)
    rest_a, rest_b = a[head : len(a) - tail], b[head : len(b) - tail]
    if len(rest_a) == len(rest_b):
        places = _differing(rest_a, rest_b, 0, len(rest_a), [])
        rest_a, rest_b = [rest_a[i] for i in places], [rest_b[i] for i in places]
    # what only moved (a device added or removed before it in an equal-length run) is no change
    was, now = set(map(id, rest_a)), set(map(id, rest_b))
    return DeviceDelta([d for d in rest_b if id(d) not in was], [d for d in rest_a if id(d) not in now])


def _common_head(a: Sequence[Device], b: Sequence[Device]) -> int:
    """How many devices ``a`` and ``b`` share at their start."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # the first lo are the same; the first hi are not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_tail(a: Sequence[Device], b: Sequence[Device], most: int) -> int:
    """How many devices (at most ``most``) ``a`` and ``b`` share at their end."""
    end_a, end_b = len(a), len(b)
    if a[end_a - most :] == b[end_b - most :]:
        return most
    lo, hi = 0, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[end_a - mid : end_a - lo] == b[end_b - mid : end_b - lo]:
            lo = mid
        else:
            hi = mid
    return lo


#: runs this short are compared device by device
_RUN = 16


def _differing(a: Sequence[Device], b: Sequence[Device], lo: int, hi: int, out: list[int]) -> list[int]:
    """The places in ``lo:hi`` where equally long ``a`` and ``b`` hold different objects."""
    if a[lo:hi] == b[lo:hi]:
        return out
    if hi - lo <= _RUN:
        out.extend(i for i in range(lo, hi) if a[i] is not b[i])
        return out
    mid = (lo + hi) // 2
    _differing(a, b, lo, mid, out)
    return _differing(a, b, mid, hi, out)


def first_of(devices: Iterable[Device], wanted: Callable[[Device], bool]) -> dict[Key, Device]:
    """The devices that are ``wanted``, by (pool, name); of a name twice, the first, as the
    publisher takes it."""
    seen: set[Key] = set()
    out: dict[Key, Device] = {}
    for device in devices:
        key = (device.pool, device.name)
        if key in seen:
            continue
        seen.add(key)
        if wanted(device):
            out[key] = device
    return out


class KeptDevices:
    """The ``wanted`` devices of the latest inventory (warm ones, drained ones), by (pool, name),
    kept from the devices each version changed; found whole on a whole read."""

    def __init__(self, wanted: Callable[[Device], bool]) -> None:
        self._wanted = wanted
        self._last: Inventory | None = None
        self._kept: dict[Key, Device] = {}

    def update(self, inventory: Inventory) -> dict[Key, Device]:
        last, self._last = self._last, inventory
        delta = device_delta(last, inventory) if last is not None else None
        if delta is None or len(delta) > max(64, len(inventory.devices) // 16):
            self._kept = first_of(inventory.devices, self._wanted)
            return self._kept
        for device in delta.old:
            self._kept.pop((device.pool, device.name), None)
        for device in delta.new:
            if self._wanted(device):
                self._kept[(device.pool, device.name)] = device
        return self._kept
