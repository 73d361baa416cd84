"""A list-then-watch cache of one resource, the stand-in's version of a client-go informer.

Controllers here are level-triggered: they wait until some informer they follow changed,
then reconcile everything from the caches. A watch that ends is resumed from the last
resourceVersion (bookmarks included); ``410 Gone`` or a lost connection means list again.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any

from plumbing.kube import ApiError, Gone, KubeClient
from plumbing.kube.resources import Resource
from plumbing.logs import get_logger

__all__ = ["Informer", "object_key", "wait_any"]

log = get_logger(__name__)


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class Informer:
    def __init__(self, kube: KubeClient, resource: Resource, *, field_selector: str | None = None) -> None:
        self.kube = kube
        self.resource = resource
        self.field_selector = field_selector
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self._listeners: list[asyncio.Event] = []

    def listen(self) -> asyncio.Event:
        """An event set after every change (and after each full list); the caller clears it."""
        event = asyncio.Event()
        event.set()
        self._listeners.append(event)
        return event

    def _notify(self) -> None:
        for event in self._listeners:
            event.set()

    def get(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        found = self.items.get(f"{namespace or ''}/{name}")
        return copy.deepcopy(found) if found is not None else None

    def values(self) -> list[dict[str, Any]]:
        return list(self.items.values())

    def apply(self, obj: dict[str, Any]) -> None:
        """Take our own write's answer into the cache at once (the watch confirms it later)."""
        key = object_key(obj)
        current = self.items.get(key)
        if current is None or _rv(obj) >= _rv(current):
            self.items[key] = obj
            self._notify()

    def forget(self, obj: dict[str, Any]) -> None:
        if self.items.pop(object_key(obj), None) is not None:
            self._notify()

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                items, version = await self.kube.list_all(self.resource, field_selector=self.field_selector)
                self.items = {object_key(i): i for i in items}
                self.synced.set()
                self._notify()
                delay = 0.2
                while True:
                    async for event in self.kube.watch(
                        self.resource, resource_version=version, field_selector=self.field_selector
                    ):
                        version = str((event.object.get("metadata") or {}).get("resourceVersion") or version)
                        if event.type == "BOOKMARK":
                            continue
                        if event.type == "DELETED":
                            self.items.pop(object_key(event.object), None)
                        else:
                            self.items[object_key(event.object)] = event.object
                        self._notify()
            except asyncio.CancelledError:
                raise
            except Gone:
                continue
            except ApiError as err:
                log.warning("watch failed; listing again", resource=self.resource.plural, error=str(err))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def _rv(obj: dict[str, Any]) -> int:
    with contextlib.suppress(TypeError, ValueError):
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    return 0


async def wait_any(*events: asyncio.Event, resync: float = 5.0) -> None:
    """Wait until one of the events is set, or a resync period passes."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=resync, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
