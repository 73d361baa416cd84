"""The one informer: a list-then-watch cache of one resource, after client-go's reflector and
shared informer (``k8s.io/client-go/tools/cache``: ``reflector.go`` ``ListAndWatch``,
``delta_fifo.go`` ``Replace``, ``shared_informer.go`` ``HandleDeltas``).

``run()`` lists (every page), then watches from the list's resourceVersion with bookmarks; a
watch that ends is resumed from the last resourceVersion it delivered, a bookmark's included.
``410 Gone`` (the version was compacted away) means list again at once; any other API error —
a lost connection included — lists again after a :class:`~plumbing.backoff.Backoff` pause.

Users see changes three ways:

* ``on_changes(changes, origin)``: called inline with what changed. A watch event is a batch of
  one (``origin="watch"``); a list is one batch of everything it found (``"list"`` the first
  time, ``"relist"`` after): as client-go's ``Replace``, every listed object is reported —
  ``MODIFIED`` even when unchanged, so a handler compares ``old`` and ``object`` when it cares —
  and every cached object the list no longer has is ``DELETED``. An object whose UID changed
  under the same name was deleted and re-created: ``DELETED`` then ``ADDED``.
* ``listen()``: an :class:`asyncio.Event` set after every change, for level-triggered loops that
  reconcile from the cache (:func:`reconcile_passes`, or :func:`wait_any` for loops of their own).
* ``synced``: set once the first list is in the cache (client-go's ``HasSynced``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from plumbing.backoff import Backoff
from plumbing.kube.client import ApiError, Gone, KubeClient
from plumbing.kube.resources import Resource
from plumbing.logs import get_logger

__all__ = [
    "Change",
    "ChangeHandler",
    "Informer",
    "Origin",
    "object_key",
    "object_uid",
    "reconcile_passes",
    "wait_any",
]

log = get_logger(__name__)

Origin = Literal["list", "relist", "watch"]


@dataclass(frozen=True, slots=True)
class Change:
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    #: the object now; for ``DELETED`` its last state (the watch's, or the cache's after a relist)
    object: dict[str, Any]
    #: the cached object before this change, if there was one
    old: dict[str, Any] | None = None


ChangeHandler = Callable[[Sequence[Change], Origin], None]


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` (``/name`` for a cluster-scoped object): the cache key."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def object_uid(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _resource_version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _rv(obj: dict[str, Any]) -> int:
    with contextlib.suppress(TypeError, ValueError):
        return int(_resource_version(obj) or 0)
    return 0


class Informer:
    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        on_changes: ChangeHandler | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.on_changes = on_changes
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        #: the last resourceVersion listed or watched; where the next watch resumes
        self.resource_version: str | None = None
        self._listeners: list[asyncio.Event] = []

    # -- the cache ------------------------------------------------------------------------------

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

    # -- list and watch ---------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled."""
        listed_once = False
        while True:
            try:
                items, version = await self.kube.list_all(
                    self.resource,
                    self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                )
            except ApiError as err:
                # Without a list there is no cache to serve: worth a warning.
                await self._pause("cannot list; retrying", err, loud=True)
                continue
            self.backoff.reset()
            self._replace(items, "relist" if listed_once else "list")
            listed_once = True
            self.resource_version = version or None
            self.synced.set()
            try:
                await self._watch()
            except Gone:
                log.debug("watch expired; listing again", resource=self.resource.plural)
            except ApiError as err:
                await self._pause("watch interrupted; listing again", err, loud=False)

    async def _pause(self, message: str, err: ApiError, *, loud: bool) -> None:
        delay = self.backoff.next()
        (log.warning if loud else log.debug)(
            message, resource=self.resource.plural, error=str(err).splitlines()[0], retry_in=round(delay, 2)
        )
        await asyncio.sleep(delay)

    async def _watch(self) -> None:
        """Watch from ``resource_version``, resuming each stream the server ends, until an error."""
        while True:
            async for event in self.kube.watch(
                self.resource,
                self.namespace,
                resource_version=self.resource_version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
            ):
                self.resource_version = _resource_version(event.object) or self.resource_version
                if event.type == "BOOKMARK":
                    continue
                self.backoff.reset()
                key = object_key(event.object)
                old = self.items.get(key)
                if event.type == "DELETED":
                    self.items.pop(key, None)
                    change = Change("DELETED", event.object, old)
                else:
                    self.items[key] = event.object
                    change = Change("ADDED" if old is None else "MODIFIED", event.object, old)
                self._notify()
                self._deliver([change], "watch")

    def _replace(self, items: list[dict[str, Any]], origin: Origin) -> None:
        """Take a full list as the cache, reporting what it added, kept and dropped."""
        fresh = {object_key(obj): obj for obj in items}
        changes: list[Change] = []
        for key, cached in self.items.items():
            now = fresh.get(key)
            if now is None or object_uid(now) != object_uid(cached):
                changes.append(Change("DELETED", cached, cached))
        for key, obj in fresh.items():
            before = self.items.get(key)
            if before is not None and object_uid(before) == object_uid(obj):
                changes.append(Change("MODIFIED", obj, before))
            else:
                changes.append(Change("ADDED", obj))
        self.items = fresh
        self._notify()
        self._deliver(changes, origin)

    def _deliver(self, changes: list[Change], origin: Origin) -> None:
        if self.on_changes is not None:
            self.on_changes(changes, origin)


async def wait_any(*events: asyncio.Event, resync: float = 5.0) -> None:
    """Wait until one of the events is set, or a resync period passes."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=resync, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def reconcile_passes(
    what: str,
    informers: Sequence[Informer],
    one_pass: Callable[[], Awaitable[None]],
    *,
    resync: float = 5.0,
) -> None:
    """A level-triggered controller loop: once every informer has its first list, run ``one_pass``
    (which reads the caches) after every change and at least every ``resync`` seconds, for ever.
    A pass that fails with an API error is tried again after 0.3 s; any other error is logged and
    the loop goes on (a bug in one pass must not stop the loop)."""
    wakes = [informer.listen() for informer in informers]
    for informer in informers:
        await informer.synced.wait()
    while True:
        await wait_any(*wakes, resync=resync)
        for wake in wakes:
            wake.clear()
        try:
            await one_pass()
        except ApiError as err:
            log.warning(f"{what} failed; retrying", error=str(err))
            wakes[0].set()
            await asyncio.sleep(0.3)
        except Exception:
            log.exception(f"{what}: unexpected error; continuing")
            await asyncio.sleep(1.0)
