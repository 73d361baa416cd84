"""The object store behind the API test server: what a write means, on etcd's model
(:class:`~kube_standin.apiserver.storage.Storage`).

* A create fills in the server's fields (uid, creationTimestamp, generation, a generated name);
  an update keeps them, honours ``resourceVersion``/``uid`` preconditions and changes only what
  the request may (the main resource or ``/status``); a no-op update changes nothing (no new
  resourceVersion, no watch event).
* Finalizers hold a deletion (``deletionTimestamp`` set) until the last one is removed; a
  namespace being deleted takes its contents with it and refuses new ones.
* ``admit`` callbacks (the kinds' strategies and the server's own rules,
  :mod:`kube_standin.apiserver.strategy`) see the final object before it is kept.

Per-kind write semantics (status subresource, generation, finalizers, namespace lifecycle)
follow ``k8s.io/apiserver/pkg/registry/generic/registry/store.go`` and the kinds'
strategies; see :mod:`kube_standin.apiserver.registry`.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from typing import Any

from kube_standin.apiserver.registry import RESOURCES, ResourceType
from kube_standin.apiserver.status import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    internal_error,
)
from kube_standin.apiserver.storage import (
    MAX_OBJECT_BYTES,
    Change,
    ChangeType,
    ListPage,
    ObjKey,
    Storage,
    StoreState,
    Watcher,
    check_object_size,
    now_rfc3339,
    own,
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

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAMESPACES = next(r for r in RESOURCES if r.plural == "namespaces")
# apimachinery's generateName alphabet: no vowels, no confusable digits.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SERVER_METADATA = ("uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _uid_mismatch(wanted: str, actual: str) -> str:
    return f"Precondition failed: UID in precondition: {wanted}, UID in object meta: {actual}"


def _check_uid(res: ResourceType, name: str, wanted: str | None, old_meta: Obj) -> None:
    if wanted and wanted != old_meta["uid"]:
        raise conflict(res, name, _uid_mismatch(wanted, old_meta["uid"]))


class Store(Storage):
    """Storage with the generic registry's write semantics (see the module doc)."""

    def __init__(self, *, history: int = 20_000) -> None:
        super().__init__(history=history)
        #: the custom resources served now (set by the server): a namespace's deletion takes them too.
        self.custom_resources: Callable[[], list[ResourceType]] = list
        for name in SYSTEM_NAMESPACES:
            self.create(_NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- create --------------------------------------------------------------------------------

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
        new = own(obj)
        meta = new["metadata"]
        namespace = meta.get("namespace") or "" if res.namespaced else ""
        if not res.namespaced:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise internal_error("resourceVersion should not be set on objects to be created")
        if res.namespaced:
            self._check_namespace_open(res, namespace, meta.get("name") or meta.get("generateName") or "")
        name = self._name_new(res, namespace, meta)
        self._fill_server_fields(res, new)
        if admit is not None:
            admit(new)
        if dry_run:
            meta["resourceVersion"] = str(self.rv)
            return new
        check_object_size(new)
        meta["resourceVersion"] = self.next_rv()
        self.commit(res, "ADDED", (namespace, name), new, None)
        return new

    def _name_new(self, res: ResourceType, namespace: str, meta: Obj) -> str:
        """The new object's name: its own, or one made from its ``generateName`` that no object
        of its kind has (409 when its own is taken)."""
        if not meta.get("name"):
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise bad_request("metadata.name or metadata.generateName is required")
            for _ in range(8):
                candidate = prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
                if not self.holds(res, (namespace, candidate)):
                    meta["name"] = candidate
                    break
            else:
                raise StatusError(
                    500, "AlreadyExists", f"could not generate a free name with prefix {prefix!r}"
                )
        name: str = meta["name"]
        if self.holds(res, (namespace, name)):
            raise already_exists(res, name)
        return name

    @staticmethod
    def _fill_server_fields(res: ResourceType, new: Obj) -> None:
        """What the server sets on a new object and a client cannot: uid, creationTimestamp,
        generation, the status a kind starts with, a namespace's finalizer."""
        meta = new["metadata"]
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

    # -- update --------------------------------------------------------------------------------

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
        self._check_update_preconditions(res, name, meta_in, old["metadata"])
        new = self._status_written(old, obj) if subresource == "status" else self._main_written(res, old, obj)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old
        if admit is not None:
            admit(new, old)
        if dry_run:
            return new
        return self._commit_update(res, (namespace, name), new, old)

    @staticmethod
    def _check_update_preconditions(res: ResourceType, name: str, meta_in: Obj, old_meta: Obj) -> None:
        """409 when the request's ``resourceVersion`` or ``uid`` is not the stored object's."""
        want_rv = meta_in.get("resourceVersion")
        if want_rv and str(want_rv) != old_meta["resourceVersion"]:
            raise conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        _check_uid(res, name, meta_in.get("uid"), old_meta)

    @staticmethod
    def _status_written(old: Obj, obj: Obj) -> Obj:
        """A write to ``/status``: the stored object with the request's status, nothing else."""
        new = own(old)
        if "status" in obj:
            new["status"] = obj["status"]
        else:
            new.pop("status", None)
        return new

    @staticmethod
    def _main_written(res: ResourceType, old: Obj, obj: Obj) -> Obj:
        """A write to the main resource: the request's object, with the stored status (where the
        kind has a status subresource) and server fields; no finalizer may be added to an object
        being deleted, and a change of the spec moves the generation on."""
        new = own(obj)
        meta, old_meta = new["metadata"], old["metadata"]
        if res.status_subresource:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        for key in (*_SERVER_METADATA, "deletionGracePeriodSeconds"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        for key in ("managedFields", "selfLink"):
            meta.pop(key, None)
        if not res.namespaced:
            meta.pop("namespace", None)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise forbidden(
                    res,
                    meta.get("name") or "",
                    "no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {sorted(added)}",
                )
        if res.tracks_generation and _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old_meta.get("generation") or 0) + 1
        return new

    def _commit_update(self, res: ResourceType, key: ObjKey, new: Obj, old: Obj) -> Obj:
        meta = new["metadata"]
        if old["metadata"].get("deletionTimestamp") and not meta.get("finalizers"):
            # The last finalizer is gone: the update completes the deletion (one DELETED event).
            meta["resourceVersion"] = self.next_rv()
            self.commit(res, "DELETED", key, new, old)
            self._after_delete(res, key[0])
            return new
        check_object_size(new)
        meta["resourceVersion"] = self.next_rv()
        self.commit(res, "MODIFIED", key, new, old)
        return new

    # -- delete --------------------------------------------------------------------------------

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
        _check_uid(res, name, uid, old_meta)
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
            return self._mark_deleted(res, obj_key, old, dry_run=dry_run), False
        if dry_run:
            return old, True
        gone_obj = own(old)
        # etcd reports a deleted object at the revision of the delete.
        gone_obj["metadata"]["resourceVersion"] = self.next_rv()
        self.commit(res, "DELETED", obj_key, gone_obj, old)
        self._after_delete(res, ns)
        return gone_obj, True

    def _mark_deleted(self, res: ResourceType, key: ObjKey, old: Obj, *, dry_run: bool) -> Obj:
        """An object its finalizers hold: marked with a ``deletionTimestamp`` until they are gone."""
        new = own(old)
        meta = new["metadata"]
        meta["deletionTimestamp"] = now_rfc3339()
        meta["deletionGracePeriodSeconds"] = 0
        if meta.get("generation"):
            meta["generation"] = int(meta["generation"]) + 1
        if dry_run:
            return new
        meta["resourceVersion"] = self.next_rv()
        self.commit(res, "MODIFIED", key, new, old)
        return new

    # -- namespaces ----------------------------------------------------------------------------

    def _check_namespace_open(self, res: ResourceType, namespace: str, name: str) -> None:
        ns = self.find(_NAMESPACES, None, namespace)
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
        for res in (*RESOURCES, *self.custom_resources()):
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
            new = own(current)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["status"] = {**(current.get("status") or {}), "phase": "Terminating"}
            new["metadata"]["resourceVersion"] = self.next_rv()
            self.commit(_NAMESPACES, "MODIFIED", ("", name), new, current)
            current = new
        finished = self._finish_namespace(name)
        return (finished, True) if finished is not None else (current, False)

    def _finish_namespace(self, name: str) -> Obj | None:
        """Delete a Terminating namespace once it is empty; returns the deleted object."""
        current = self.find(_NAMESPACES, None, name)
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return None
        for res in self._namespaced_resources():
            if any(True for _ in self.objects(res, name)):
                return None
        if current["metadata"].get("finalizers"):
            return None  # someone else's finalizer on the namespace itself
        gone_obj = own(current)
        gone_obj["spec"] = {**(current.get("spec") or {}), "finalizers": []}
        gone_obj["metadata"]["resourceVersion"] = self.next_rv()
        self.commit(_NAMESPACES, "DELETED", ("", name), gone_obj, current)
        return gone_obj

    def _after_delete(self, res: ResourceType, namespace: str) -> None:
        if res.namespaced and namespace:
            self._finish_namespace(namespace)
