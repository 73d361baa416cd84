"""What the publisher rendered for an object, remembered by that object's identity.

The inventory feed keeps a device that did not change as the very same object from version to
version (:class:`~dra_driver.controller.inventory_feed.InventoryModel`), so a pass over an inventory
in which one device of 10,100 changed can take the other 10,099 published devices — and their
normalised forms for comparison — from the previous pass instead of building them again: the cost of
a pass follows what changed. Keys are identities, so nothing is hashed or compared deeply; each entry
holds its object, so an identity is never reused while it is remembered. Entries not used during a
whole pass are forgotten at the next (:meth:`IdentityMemo.turn`): the memory is that of two passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["IdentityMemo", "RenderMemo"]

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """``compute()`` once per object (by identity) and ``extra`` (by equality)."""

    def __init__(self) -> None:
        self._now: dict[int, tuple[object, object, V]] = {}
        self._before: dict[int, tuple[object, object, V]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, obj: object, compute: Callable[[], V], extra: object = None) -> V:
        key = id(obj)
        hit = self._now.get(key) or self._before.get(key)
        if hit is not None and hit[0] is obj and hit[1] == extra:
            self._now[key] = hit
            self.hits += 1
            return hit[2]
        value = compute()
        self._now[key] = (obj, extra, value)
        self.misses += 1
        return value

    def turn(self) -> None:
        """A new pass: what the last one did not use is forgotten after this one."""
        self._before, self._now = self._now, {}
        self.hits = self.misses = 0


class RenderMemo:
    """The publisher's memos: each device's conversion, each published device's normal form."""

    def __init__(self) -> None:
        self.conversions: IdentityMemo[Any] = IdentityMemo()
        self.normals: IdentityMemo[Any] = IdentityMemo()

    def turn(self) -> None:
        self.conversions.turn()
        self.normals.turn()
