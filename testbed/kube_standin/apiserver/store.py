"""The object store behind the API test server: etcd's model, in memory.

* One global ``resourceVersion`` counter; every change gets the next value (deletes too),
  and a no-op update changes nothing (no new resourceVersion, no watch event).
* A bounded history of changes serves watches from a past resourceVersion and consistent
  paginated lists (the state at the list's resourceVersion is rebuilt by undoing later
  changes). Anything older than the history is "compacted": 410 Gone.
* Every method runs synchronously on the server's event loop, so each one is atomic: a
  compare-and-swap needs no lock.

Per-kind write semantics (status subresource, generation, finalizers, namespace lifecycle)
follow ``k8s.io/apiserver/pkg/registry/generic/registry/store.go`` and the kinds'
strategies; see :mod:`kube_standin.apiserver.registry`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from kube_standin.apiserver.registry import RESOURCES, ResourceType
from kube_standin.apiserver.status import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    gone,
    internal_error,
    not_found,
)

__all__ = [
    "MAX_OBJECT_BYTES",
    "Change",
    "ChangeType",
    "ListPage",
    "Store",
    "StoreState",
    "Watcher",
    "now_rfc3339",
]

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace or "", name)
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAMESPACES = next(r for r in RESOURCES if r.plural == "namespaces")
# apimachinery's generateName alphabet: no vowels, no confusable digits.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SERVER_METADATA = ("uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp")
#: etcd's request limit (``--max-request-bytes``, default 1.5 MiB): a write of a larger object
#: fails in etcd and the API server answers 500 ``etcdserver: request is too large``. Measured
#: here on compact JSON, which is larger than the protobuf a real server stores, so the
#: stand-in refuses a little earlier than a real server, never later.
MAX_OBJECT_BYTES = 1536 * 1024


def _check_object_size(obj: Obj) -> None:
    if len(json.dumps(obj, separators=(",", ":"))) > MAX_OBJECT_BYTES:
        # ErrorToAPIStatus of a plain (non-Status) error: code 500, reason Unknown (empty).
        raise StatusError(500, "", "etcdserver: request is too large")


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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
    """One watch stream's inbox. The store pushes every change of its storage key; the
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


def _own(obj: Obj) -> Obj:
    """A copy of ``obj``'s top level and metadata, the parts a write changes; deeper parts are
    shared, which is safe because stored objects are never modified."""
    out = dict(obj)
    meta = out.get("metadata")
    out["metadata"] = dict(meta) if isinstance(meta, dict) else {}
    return out


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _uid_mismatch(wanted: str, actual: str) -> str:
    return f"Precondition failed: UID in precondition: {wanted}, UID in object meta: {actual}"


class Store:
    def __init__(self, *, history: int = 20_000) -> None:
        self.rv = 0
        self.compacted_rv = 0
        self.history: deque[Change] = deque()
        self.history_limit = history
        self._objects: dict[str, dict[ObjKey, Obj]] = {res.storage_key: {} for res in RESOURCES}
        self._watchers: dict[str, set[Watcher]] = {}
        #: set once the server shuts down: a new watch ends at once (:meth:`shut_down_watches`)
        self._shutting_down = False
        self.on_commit: Callable[[Change], None] | None = None
        for name in SYSTEM_NAMESPACES:
            self.create(_NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

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

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to ``rv`` (default: all of it), as etcd compaction does."""
        target = self.rv if rv is None else min(rv, self.rv)
        while self.history and self.history[0].rv <= target:
            self.history.popleft()
        self.compacted_rv = max(self.compacted_rv, target)
        return self.compacted_rv

    def _commit(
        self, res: ResourceType, change_type: ChangeType, key: ObjKey, obj: Obj, prev: Obj | None
    ) -> Change:
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

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # -- writes --------------------------------------------------------------------------------

    def create(
        self,
        res: ResourceType,
        obj: Obj,
        *,
        dry_run: bool = False,
        admit: Callable[[Obj], None] | None = None,
    ) -> Obj:
        """Store a new object (storage version); server fields are filled in here. ``obj`` must not
        be modified by the caller afterwards: the store keeps (parts of) it."""
        new = _own(obj)
        meta = new["metadata"]
        namespace = meta.get("namespace") or "" if res.namespaced else ""
        if not res.namespaced:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise internal_error("resourceVersion should not be set on objects to be created")
        if res.namespaced:
            self._check_namespace_open(res, namespace, meta.get("name") or meta.get("generateName") or "")
        bucket = self._objects[res.storage_key]
        if not meta.get("name"):
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise bad_request("metadata.name or metadata.generateName is required")
            for _ in range(8):
                candidate = prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
                if (namespace, candidate) not in bucket:
                    meta["name"] = candidate
                    break
            else:
                raise StatusError(
                    500, "AlreadyExists", f"could not generate a free name with prefix {prefix!r}"
                )
        name = meta["name"]
        if (namespace, name) in bucket:
            raise already_exists(res, name)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if res.tracks_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if res.status_subresource:
            status = res.create_status(new) if res.create_status else None
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        if res.plural == "namespaces":
            spec = new.get("spec") or {}
            if isinstance(spec, dict) and "finalizers" not in spec:
                new["spec"] = {**spec, "finalizers": ["kubernetes"]}
        if admit is not None:
            admit(new)
        if dry_run:
            meta["resourceVersion"] = str(self.rv)
            return new
        _check_object_size(new)
        meta["resourceVersion"] = self._next_rv()
        self._commit(res, "ADDED", (namespace, name), new, None)
        return new

    def update(
        self,
        res: ResourceType,
        obj: Obj,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        admit: Callable[[Obj, Obj], None] | None = None,
    ) -> Obj:
        """Replace an object (storage version). ``metadata.resourceVersion``/``uid``, when set,
        are preconditions; ``admit(new, old)`` may reject the final object by raising.
        Returns the stored object (unchanged on a no-op). As with :meth:`create`, the store
        keeps parts of ``obj``."""
        meta_in = obj.get("metadata") or {}
        namespace = (meta_in.get("namespace") or "") if res.namespaced else ""
        name = meta_in.get("name") or ""
        old = self.get(res, namespace, name)
        old_meta = old["metadata"]
        want_rv = meta_in.get("resourceVersion")
        if want_rv and str(want_rv) != old_meta["resourceVersion"]:
            raise conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        want_uid = meta_in.get("uid")
        if want_uid and want_uid != old_meta["uid"]:
            raise conflict(
                res,
                name,
                _uid_mismatch(want_uid, old_meta["uid"]),
            )
        if subresource == "status":
            new = _own(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = _own(obj)
            meta = new["metadata"]
            if res.status_subresource:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            for key in _SERVER_METADATA:
                if key in old_meta:
                    meta[key] = old_meta[key]
                else:
                    meta.pop(key, None)
            if "deletionGracePeriodSeconds" in old_meta:
                meta["deletionGracePeriodSeconds"] = old_meta["deletionGracePeriodSeconds"]
            else:
                meta.pop("deletionGracePeriodSeconds", None)
            for key in ("managedFields", "selfLink"):
                meta.pop(key, None)
            if not res.namespaced:
                meta.pop("namespace", None)
            if old_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
                if added:
                    raise forbidden(
                        res,
                        name,
                        "no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers {sorted(added)}",
                    )
            if res.tracks_generation and _spec_part(new) != _spec_part(old):
                meta["generation"] = int(old_meta.get("generation") or 0) + 1
        meta = new["metadata"]
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if new == old:
            return old
        if admit is not None:
            admit(new, old)
        if dry_run:
            return new
        obj_key = (namespace, name)
        if old_meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # The last finalizer is gone: the update completes the deletion (one DELETED event).
            meta["resourceVersion"] = self._next_rv()
            self._commit(res, "DELETED", obj_key, new, old)
            self._after_delete(res, namespace)
            return new
        _check_object_size(new)
        meta["resourceVersion"] = self._next_rv()
        self._commit(res, "MODIFIED", obj_key, new, old)
        return new

    def delete(
        self,
        res: ResourceType,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Delete now, or mark for deletion while finalizers remain; returns (object, deleted_now)."""
        ns = (namespace or "") if res.namespaced else ""
        old = self.get(res, ns, name)
        old_meta = old["metadata"]
        if uid and uid != old_meta["uid"]:
            raise conflict(
                res,
                name,
                _uid_mismatch(uid, old_meta["uid"]),
            )
        if resource_version and resource_version != old_meta["resourceVersion"]:
            raise conflict(
                res,
                name,
                f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                f"ResourceVersion in object meta: {old_meta['resourceVersion']}",
            )
        obj_key = (ns, name)
        if res.plural == "namespaces":
            return self._delete_namespace(name, old, dry_run=dry_run)
        if old_meta.get("finalizers"):
            if old_meta.get("deletionTimestamp"):
                return old, False
            new = _own(old)
            meta = new["metadata"]
            meta["deletionTimestamp"] = now_rfc3339()
            meta["deletionGracePeriodSeconds"] = 0
            if meta.get("generation"):
                meta["generation"] = int(meta["generation"]) + 1
            if dry_run:
                return new, False
            meta["resourceVersion"] = self._next_rv()
            self._commit(res, "MODIFIED", obj_key, new, old)
            return new, False
        if dry_run:
            return old, True
        gone_obj = _own(old)
        # etcd reports a deleted object at the revision of the delete.
        gone_obj["metadata"]["resourceVersion"] = self._next_rv()
        self._commit(res, "DELETED", obj_key, gone_obj, old)
        self._after_delete(res, ns)
        return gone_obj, True

    # -- namespaces ----------------------------------------------------------------------------

    def _check_namespace_open(self, res: ResourceType, namespace: str, name: str) -> None:
        ns = self._objects[_NAMESPACES.storage_key].get(("", namespace))
        if ns is None:
            raise StatusError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        if ns["metadata"].get("deletionTimestamp"):
            raise forbidden(
                res,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )

    def _namespaced_resources(self) -> list[ResourceType]:
        seen: set[str] = set()
        out = []
        for res in RESOURCES:
            if res.namespaced and res.storage_key not in seen and "delete" in res.verbs:
                seen.add(res.storage_key)
                out.append(res)
        return out

    def _delete_namespace(self, name: str, old: Obj, *, dry_run: bool) -> tuple[Obj, bool]:
        # The namespace controller's job, done inline: delete the contents, then the namespace
        # once nothing is left (objects held by finalizers keep it Terminating).
        if dry_run:
            return old, False
        for res in self._namespaced_resources():
            for obj in list(self.objects(res, name)):
                meta = obj["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                self.delete(res, name, meta["name"])
        current = self.get(_NAMESPACES, None, name)
        if not current["metadata"].get("deletionTimestamp"):
            new = _own(current)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["status"] = {**(current.get("status") or {}), "phase": "Terminating"}
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._commit(_NAMESPACES, "MODIFIED", ("", name), new, current)
            current = new
        finished = self._finish_namespace(name)
        return (finished, True) if finished is not None else (current, False)

    def _finish_namespace(self, name: str) -> Obj | None:
        """Delete a Terminating namespace once it is empty; returns the deleted object."""
        current = self._objects[_NAMESPACES.storage_key].get(("", name))
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return None
        for res in self._namespaced_resources():
            if any(True for _ in self.objects(res, name)):
                return None
        if current["metadata"].get("finalizers"):
            return None  # someone else's finalizer on the namespace itself
        gone_obj = _own(current)
        gone_obj["spec"] = {**(current.get("spec") or {}), "finalizers": []}
        gone_obj["metadata"]["resourceVersion"] = self._next_rv()
        self._commit(_NAMESPACES, "DELETED", ("", name), gone_obj, current)
        return gone_obj

    def _after_delete(self, res: ResourceType, namespace: str) -> None:
        if res.namespaced and namespace:
            self._finish_namespace(namespace)
