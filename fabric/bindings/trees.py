"""Agent trees: which tree of workloads a ResourceClaim belongs to (docs/budgets.md, "Trees").

Orchestrators of agents spawn work in trees: a root (a Job, an orchestrator's own custom resource,
a Pod) owns workers, which own more workers and their claims. A DeviceBudget caps a whole tree, and
the orphan check reports claims whose tree's root is gone. A tree is named one of two ways:

* **By label** (:func:`label_tree`; cheap, the recommended way). The orchestrator sets one label on
  everything it spawns (``agents.example.com/tree: task-847``), including the ResourceClaimTemplates
  its pods name: Kubernetes copies a template's labels into the claim it makes. The manager reads
  claims only (its informer), so the label must be on the *claim*; a pod's own labels are not seen.
  Limit: a claim made without the label belongs to no tree, and nothing stops a workload from
  setting another tree's value (a label is a name, not a proof — RBAC on who may create claims in
  the namespace is the fence).
* **By owner chain** (:class:`OwnerChains`). From the claim, follow ``metadata.ownerReferences``
  (the ``controller: true`` reference first, else the first) up to an object with no owner: the
  root. A claim made from a template is owned by its Pod, the Pod by its ReplicaSet or Job, and so
  on. Each hop is a GET of that kind (the manager needs ``get`` on every kind in the chains it
  walks), cached by UID for ``ttl`` seconds, at most ``max_depth`` hops. Limits: owner references
  never cross namespaces (Kubernetes' garbage collector forbids it), so a tree spanning namespaces
  is cut at the namespace; a reference whose object is gone — or was replaced by one of the same
  name and another UID — ends the walk with ``gone=True``: the root as far as it can be known is
  gone. A kind the API server does not serve ends it too (``unknown=True``), never guessed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plumbing.kube.client import ApiError, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.logs import get_logger
from plumbing.names import is_qualified_name

__all__ = [
    "Fetch",
    "KindPaths",
    "OwnerChains",
    "Root",
    "RootLookup",
    "TreeRootLabel",
    "label_tree",
    "parent_reference",
]

log = get_logger(__name__)

#: the longest chain walked: Deployment → ReplicaSet → Pod → claim is 3; an orchestrator adds a few
DEFAULT_MAX_DEPTH = 8
#: how long a looked-up owner is trusted before it is read again
DEFAULT_TTL_SECONDS = 30.0


def label_tree(claim: ResourceClaim, key: str) -> str | None:
    """The tree ``claim`` belongs to by its label ``key``; None when it has none (or an empty one)."""
    value = claim.metadata.labels.get(key)
    return value or None


def parent_reference(owner_references: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The reference a walk follows: the controller's, else the first (as ``kubectl tree`` does)."""
    for ref in owner_references:
        if ref.get("controller") is True:
            return ref
    return owner_references[0] if owner_references else None


@dataclass(frozen=True)
class TreeRootLabel:
    """``KEY=apiVersion/Kind``: claims labelled ``KEY`` belong to the tree whose root is the object
    of that kind named by the label's value, in the claim's namespace."""

    key: str
    api_version: str
    kind: str

    @classmethod
    def parse(cls, text: str) -> TreeRootLabel:
        key, sep, target = text.partition("=")
        api_version, _, kind = target.rpartition("/")
        if not sep or not is_qualified_name(key) or not api_version or not kind.isalnum():
            raise ValueError(
                f"'{text[:80]}' is not KEY=apiVersion/Kind (e.g. agents.example.com/tree=batch/v1/Job)"
            )
        return cls(key, api_version, kind)


@dataclass(frozen=True)
class Root:
    """An object at the top of an owner chain (or the last one that could be read)."""

    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def kind_key(self) -> str:
        """``apiVersion/kind`` without the version: how a budget names a root's kind."""
        group = self.api_version.rpartition("/")[0]
        return f"{group}/{self.kind}" if group else self.kind


@dataclass(frozen=True)
class RootLookup:
    """Where a walk up the owner chain ended.

    ``root`` is the topmost object that exists; when ``gone`` the walk met a reference to an object
    that no longer exists (``missing`` names it), so the real root is gone and ``root`` is only as
    high as could be read. ``unknown`` means a kind the API server does not serve (or the walk hit
    ``max_depth``): the tree cannot be told, and callers must not act as if the root were gone.
    """

    root: Root | None
    gone: bool = False
    unknown: bool = False
    missing: Root | None = None
    hops: int = 0


#: reads one object by apiVersion, kind, namespace and name; None when it does not exist
Fetch = Callable[[str, str, str, str], Awaitable[Mapping[str, Any] | None]]


class KindPaths:
    """apiVersion + kind → the REST path of a namespaced object, from the API server's discovery
    (``GET /api/v1``, ``GET /apis/<group>/<version>``), read once per group version."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._plurals: dict[str, dict[str, tuple[str, bool]]] = {}

    async def _resources(self, api_version: str) -> dict[str, tuple[str, bool]]:
        known = self._plurals.get(api_version)
        if known is not None:
            return known
        prefix = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            listing = await self.kube.request("GET", prefix)
        except NotFound:
            listing = {}
        found = {
            str(r.get("kind")): (str(r.get("name")), bool(r.get("namespaced")))
            for r in listing.get("resources") or []
            if isinstance(r, dict) and "/" not in str(r.get("name"))  # subresources are not kinds
        }
        self._plurals[api_version] = found
        return found

    async def fetch(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The object, None when it does not exist; :class:`LookupError` when the kind is not served."""
        plural, namespaced = (await self._resources(api_version)).get(kind, ("", False))
        if not plural:
            raise LookupError(f"the API server serves no kind {kind} in {api_version}")
        prefix = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        path = (
            f"{prefix}/namespaces/{namespace}/{plural}/{name}" if namespaced else f"{prefix}/{plural}/{name}"
        )
        try:
            return await self.kube.request("GET", path)
        except NotFound:
            return None


@dataclass
class _Cached:
    obj: Mapping[str, Any] | None
    read_at: float


@dataclass
class OwnerChains:
    """Walks owner references up to a tree's root, caching each object read for ``ttl`` seconds."""

    fetch: Fetch
    ttl: float = DEFAULT_TTL_SECONDS
    max_depth: int = DEFAULT_MAX_DEPTH
    clock: Callable[[], float] = time.monotonic
    _cache: dict[tuple[str, str, str, str], _Cached] = field(default_factory=dict)
    #: objects read from the API server (not from the cache), for tests and the debug log
    reads: int = 0

    async def _get(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        key = (api_version, kind, namespace, name)
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None and now - cached.read_at < self.ttl:
            return cached.obj
        obj = await self.fetch(api_version, kind, namespace, name)
        self.reads += 1
        if len(self._cache) > 10_000:  # bounded: a fleet's chains are re-read, never piled up
            self._cache.clear()
        self._cache[key] = _Cached(obj, now)
        return obj

    async def root_of(self, namespace: str, owner_references: Sequence[Mapping[str, Any]]) -> RootLookup:
        """Where the chain starting at ``owner_references`` (a claim's) ends, in ``namespace``."""
        refs = owner_references
        top: Root | None = None
        for hop in range(self.max_depth + 1):
            ref = parent_reference(refs)
            if ref is None:
                return RootLookup(top, hops=hop)
            if hop == self.max_depth:
                return RootLookup(top, unknown=True, hops=hop)
            wanted = Root(
                str(ref.get("apiVersion") or ""),
                str(ref.get("kind") or ""),
                str(ref.get("name") or ""),
                str(ref.get("uid") or ""),
            )
            try:
                obj = await self._get(wanted.api_version, wanted.kind, namespace, wanted.name)
            except LookupError as err:
                log.warning("owner chain ends at a kind not served", kind=wanted.kind, error=str(err))
                return RootLookup(top, unknown=True, hops=hop)
            except ApiError as err:
                # Forbidden or unavailable: the tree cannot be told right now; never "gone".
                log.warning(
                    "cannot read an owner", kind=wanted.kind, name=wanted.name, error=str(err).splitlines()[0]
                )
                return RootLookup(top, unknown=True, hops=hop)
            meta = (obj or {}).get("metadata") or {}
            if obj is None or (wanted.uid and meta.get("uid") != wanted.uid):
                return RootLookup(top, gone=True, missing=wanted, hops=hop)
            top = wanted
            refs = meta.get("ownerReferences") or []
        return RootLookup(top, unknown=True, hops=self.max_depth)
