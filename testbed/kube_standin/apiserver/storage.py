"""The storage behind the API test server: etcd's model, in memory.

* One global ``resourceVersion`` counter; every change gets the next value (deletes too).
* A bounded history of changes serves watches from a past resourceVersion and consistent
  paginated lists (the state at the list's resourceVersion is rebuilt by undoing later
  changes). Anything older than the history is "compacted": 410 Gone.
* Watchers get every change of their storage key as it is committed.
* Every method runs synchronously on the server's event loop, so each one is atomic: a
  compare-and-swap needs no lock.

What a write means — server fields, preconditions, the status subresource, finalizers, the
namespace lifecycle — is the store's (:mod:`kube_standin.apiserver.store`), which commits here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from kube_standin.apiserver.registry import RESOURCES, ResourceType
from kube_standin.apiserver.status import StatusError, gone, not_found

__all__ = [
    "MAX_OBJECT_BYTES",
    "Change",
    "ChangeType",
    "ListPage",
    "ObjKey",
    "Storage",
    "StoreState",
    "Watcher",
    "check_object_size",
    "now_rfc3339",
    "own",
]

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace or "", name)
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]

#: etcd's request limit (``--max-request-bytes``, default 1.5 MiB): a write of a larger object
#: fails in etcd and the API server answers 500 ``etcdserver: request is too large``. Measured
#: here on compact JSON, which is larger than the protobuf a real server stores, so the
#: stand-in refuses a little earlier than a real server, never later.
MAX_OBJECT_BYTES = 1536 * 1024


def check_object_size(obj: Obj) -> None:
    if len(json.dumps(obj, separators=(",", ":"))) > MAX_OBJECT_BYTES:
        # ErrorToAPIStatus of a plain (non-Status) error: code 500, reason Unknown (empty).
        raise StatusError(500, "", "etcdserver: request is too large")


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def own(obj: Obj) -> Obj:
    """A copy of ``obj``'s top level and metadata, the parts a write changes; deeper parts are
    shared, which is safe because stored objects are never modified."""
    out = dict(obj)
    meta = out.get("metadata")
    out["metadata"] = dict(meta) if isinstance(meta, dict) else {}
    return out


@dataclass(frozen=True, slots=True)
class Change:
    rv: int
    type: ChangeType
    storage_key: str
    key: ObjKey
    obj: Obj
    prev: Obj | None


@dataclass(eq=False)
class Watcher:
    """One watch stream's inbox. The storage pushes every change of its storage key; the
    HTTP layer filters (selectors see both the old and the new object) and converts."""

    storage_key: str
    namespace: str | None
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)
    max_backlog: int = 100_000
    overflowed: bool = False

    def offer(self, change: Change) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.max_backlog:
            # The real server drops watchers that fall this far behind; the client re-watches.
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(change)

    def close(self) -> None:
        self.overflowed = True
        self.queue.put_nowait(None)


@dataclass
class ListPage:
    items: list[Obj]
    resource_version: int
    continue_key: ObjKey | None
    remaining: int


class StoreState(BaseModel):
    """The ``--state-file`` format: every object and the resourceVersion counter."""

    format_version: Literal[1] = 1
    resource_version: int = Field(ge=0)
    objects: dict[str, list[dict[str, Any]]]


class Storage:
    """Objects by storage key and (namespace, name), the resourceVersion counter, the history of
    changes and the watchers (see the module doc)."""

    def __init__(self, *, history: int = 20_000) -> None:
        self.rv = 0
        self.compacted_rv = 0
        self.history: deque[Change] = deque()
        self.history_limit = history
        # Custom resources (kube_standin.apiserver.customresources) get their bucket on first use.
        self._objects: defaultdict[str, dict[ObjKey, Obj]] = defaultdict(
            dict, {res.storage_key: {} for res in RESOURCES}
        )
        self._watchers: dict[str, set[Watcher]] = {}
        #: set once the server shuts down: a new watch ends at once (:meth:`shut_down_watches`)
        self._shutting_down = False
        self.on_commit: Callable[[Change], None] | None = None

    # -- persistence ---------------------------------------------------------------------------

    def dump(self) -> StoreState:
        return StoreState(
            resource_version=self.rv,
            objects={key: list(objs.values()) for key, objs in self._objects.items() if objs},
        )

    def load(self, state: StoreState) -> None:
        """Replace everything with ``state``; history starts empty (older watches get 410)."""
        for key in self._objects:
            self._objects[key] = {}
        for key, objs in state.objects.items():
            bucket = self._objects.setdefault(key, {})
            for obj in objs:
                meta = obj.get("metadata") or {}
                bucket[(meta.get("namespace") or "", meta.get("name") or "")] = obj
        self.rv = state.resource_version
        self.history.clear()
        self.compacted_rv = self.rv

    # -- reads ---------------------------------------------------------------------------------

    def get(self, res: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._objects[res.storage_key].get((namespace or "", name))
        if obj is None:
            raise not_found(res, name)
        return obj

    def find(self, res: ResourceType, namespace: str | None, name: str) -> Obj | None:
        return self._objects[res.storage_key].get((namespace or "", name))

    def holds(self, res: ResourceType, key: ObjKey) -> bool:
        """Whether an object of ``res`` is stored under ``key``."""
        return key in self._objects[res.storage_key]

    def objects(self, res: ResourceType, namespace: str | None = None) -> Iterator[Obj]:
        for (ns, _), obj in self._objects[res.storage_key].items():
            if namespace is None or ns == namespace:
                yield obj

    def list_objects(
        self,
        res: ResourceType,
        namespace: str | None,
        *,
        match: Callable[[Obj], bool],
        limit: int | None = None,
        after: ObjKey | None = None,
        at_rv: int | None = None,
    ) -> ListPage:
        """Objects ordered by (namespace, name); ``after``/``at_rv`` continue an earlier page."""
        rv = self.rv if at_rv is None else at_rv
        source = self._objects[res.storage_key] if at_rv is None else self._state_at(res.storage_key, at_rv)
        keys = sorted(
            k for k in source if (namespace is None or k[0] == namespace) and (after is None or k > after)
        )
        items: list[Obj] = []
        continue_key: ObjKey | None = None
        remaining = 0
        for index, key in enumerate(keys):
            obj = source[key]
            if not match(obj):
                continue
            if limit and len(items) >= limit:
                continue_key = keys[index - 1] if index else after
                remaining = sum(1 for k in keys[index:] if match(source[k]))
                break
            items.append(obj)
        return ListPage(items, rv, continue_key, remaining)

    def _state_at(self, storage_key: str, rv: int) -> dict[ObjKey, Obj]:
        if rv < self.compacted_rv:
            raise gone(
                f"The provided continue parameter is too old to display a consistent list result "
                f"(resourceVersion {rv} is compacted, oldest kept is {self.compacted_rv}). "
                "Start a new list without the continue parameter."
            )
        if rv > self.rv:
            raise StatusError(504, "Timeout", f"Too large resource version: {rv}, current: {self.rv}")
        state = dict(self._objects[storage_key])
        for change in reversed(self.history):
            if change.rv <= rv:
                break
            if change.storage_key != storage_key:
                continue
            if change.type == "ADDED":
                state.pop(change.key, None)
            elif change.prev is not None:
                state[change.key] = change.prev
        return state

    def changes_since(self, storage_key: str, rv: int) -> list[Change]:
        """Every change of ``storage_key`` after ``rv``; 410 Gone when history no longer has them."""
        if rv < self.compacted_rv:
            raise gone(f"too old resource version: {rv} ({self.compacted_rv})")
        out: list[Change] = []
        for change in reversed(self.history):
            if change.rv <= rv:
                break
            if change.storage_key == storage_key:
                out.append(change)
        out.reverse()
        return out

    # -- watches -------------------------------------------------------------------------------

    def subscribe(self, res: ResourceType, namespace: str | None) -> Watcher:
        watcher = Watcher(res.storage_key, namespace)
        if self._shutting_down:
            watcher.close()  # the stream sends what it has and ends, as a closed one does
            return watcher
        self._watchers.setdefault(res.storage_key, set()).add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.get(watcher.storage_key, set()).discard(watcher)

    def close_watchers(self) -> int:
        count = 0
        for watchers in self._watchers.values():
            for watcher in list(watchers):
                watcher.close()
                count += 1
            watchers.clear()
        return count

    def shut_down_watches(self) -> int:
        """Close every watch, and from now on end each new one at once. An informer watches
        again as soon as its watch ends, on a keep-alive connection the server still serves while
        it shuts down: without this, that new watch held the graceful shutdown until its timeout
        (5 s for every API test server stopped before its clients)."""
        self._shutting_down = True
        return self.close_watchers()

    # -- changes -------------------------------------------------------------------------------

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to ``rv`` (default: all of it), as etcd compaction does."""
        target = self.rv if rv is None else min(rv, self.rv)
        while self.history and self.history[0].rv <= target:
            self.history.popleft()
        self.compacted_rv = max(self.compacted_rv, target)
        return self.compacted_rv

    def next_rv(self) -> str:
        """The resourceVersion of the change about to be committed."""
        self.rv += 1
        return str(self.rv)

    def commit(
        self, res: ResourceType, change_type: ChangeType, key: ObjKey, obj: Obj, prev: Obj | None
    ) -> Change:
        """Keep ``obj`` under ``key`` (or drop it: DELETED) at the current resourceVersion, record
        the change in the history and hand it to the watchers."""
        change = Change(self.rv, change_type, res.storage_key, key, obj, prev)
        bucket = self._objects[res.storage_key]
        if change_type == "DELETED":
            bucket.pop(key, None)
        else:
            bucket[key] = obj
        self.history.append(change)
        while len(self.history) > self.history_limit:
            self.compacted_rv = self.history.popleft().rv
        for watcher in self._watchers.get(res.storage_key, ()):
            if watcher.namespace is None or watcher.namespace == key[0]:
                watcher.offer(change)
        if self.on_commit is not None:
            self.on_commit(change)
        return change
