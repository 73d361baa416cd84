"""What the publisher rendered for an object, remembered by that object's identity.

The inventory feed keeps a device that did not change as the very same object from version to
version (:class:`~manager_api.feed.InventoryModel`), so a pass over an inventory
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

    def forget(self, obj: object) -> None:
        """``obj`` is gone (a device replaced or removed): a pass patched in place, which never
        :meth:`turn`, keeps the memory that of the devices that are."""
        key = id(obj)
        for entries in (self._now, self._before):
            hit = entries.get(key)
            if hit is not None and hit[0] is obj:
                del entries[key]

    def turn(self) -> None:
        """A new pass: what the last one did not use is forgotten after this one."""
        self._before, self._now = self._now, {}
        self.hits = self.misses = 0


class RenderMemo:
    """The publisher's memos: each device's conversion, each published device's normal form, and
    each slice's devices in normal form (by the identities of its devices, in order)."""

    def __init__(self) -> None:
        self.conversions: IdentityMemo[Any] = IdentityMemo()
        self.normals: IdentityMemo[Any] = IdentityMemo()
        self._chunks_now: dict[tuple[int, ...], tuple[list[Any], dict[str, Any]]] = {}
        self._chunks_before: dict[tuple[int, ...], tuple[list[Any], dict[str, Any]]] = {}

    def chunk_normal(self, chunk: list[Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The normal form of a slice's devices ``chunk``, the same dict as last pass when its
        devices are the same objects in the same order — so comparing it with a stored slice found
        equal before is an identity check. (The remembered chunk holds its devices: their
        identities are not reused meanwhile.)"""
        key = tuple(map(id, chunk))
        hit = self._chunks_now.get(key) or self._chunks_before.get(key)
        if hit is None:
            hit = (list(chunk), compute())
        self._chunks_now[key] = hit
        return hit[1]

    def forget_chunk(self, chunk: list[Any]) -> None:
        """A slice's devices ``chunk`` were replaced by a patch (:meth:`IdentityMemo.forget`)."""
        key = tuple(map(id, chunk))
        self._chunks_now.pop(key, None)
        self._chunks_before.pop(key, None)

    def turn(self) -> None:
        self.conversions.turn()
        self.normals.turn()
        self._chunks_before, self._chunks_now = self._chunks_now, {}
