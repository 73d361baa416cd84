"""Keeps the pool labels on nodes right:
``pool.<driver>.node-restriction.kubernetes.io/<pool>=true`` exactly on the nodes that pool's fabric
reaches, and ``…/<pool>.<group>=true`` exactly on the nodes that reach a reach group of the pool
(devices behind a switch cabled to some hosts only), so each slice's node selector
(:func:`.slices.node_selector`) matches exactly those nodes.

The node set comes from the manager's inventory (``FabricPool.nodes``); nodes come and go in
Kubernetes, so nodes are watched too and a new node gets its labels as soon as it registers.
Only the label keys of pools this controller owns are touched — pools of its inventory, and
pools of the slices it published (a pool that left the inventory) — so the controllers of
several fabric managers under one driver never undo each other's labels.

It also keeps ``warm.<driver>.node-restriction.kubernetes.io/<device type>=<count>`` on each node
where the manager keeps devices of that type warm (:func:`.slices.desired_warm_labels`, kept from the
devices each inventory version changed rather than a pass over every device; the key of a
non-default ``--publisher`` names it), and removes the key when the count drops to 0: pods prefer
those nodes through a preferred node affinity (docs/manager.md, "What the scheduler guarantees about
picking a warm device"). These keys are owned by publisher, one per device type, whatever the pools.
A warm device already allocated to a ResourceClaim is not counted (claims are watched): the
manager's inventory shows it warm until the claim's prepare, seconds later, and meanwhile the next
pod should not be sent to a node whose warm device is taken. The labels describe the inventory the
publisher has *written* (``SlicePublisher.published``), not the newest one read: a count must never
run ahead of the node-local slice it promises, or the pod it steers finds only shared devices there.

The keys are under NodeRestriction's label namespace (:data:`.resourcenames.NODE_LABEL_NAMESPACE`),
so no kubelet can set them on its own Node. The keys earlier releases wrote for the same pools and
warm counts (``pool.<driver>/…``, ``warm.<driver>/…``: :func:`.resourcenames.legacy_node_label_key`)
count as this controller's and are never wanted: the first pass after an upgrade removes them, in
the same patch of each node that adds the new keys.

With :class:`.pluginpods.PluginNodes` (``--plugin-pod-selector``), a node the fabric reaches is
labelled only while a plugin pod is Ready on it, and loses the labels when it has none: the
scheduler never allocates a device to a node whose kubelet could not prepare it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from dra_driver.controller.delta import KeptDevices
from dra_driver.controller.metrics import NODE_LABEL_PATCHES
from dra_driver.controller.pluginpods import PluginNodes
from dra_driver.controller.reconciler import Reconciler
from dra_driver.controller.resourcenames import (
    legacy_node_label_key,
    pool_label_key,
    pool_label_prefix,
    warm_label_key,
)
from dra_driver.controller.slices import (
    desired_node_labels,
    reaching_nodes,
    slice_selector,
    warm_labels_of,
)
from manager_api.feed import InventorySource
from manager_api.models import BindingState, DeviceType, Inventory
from plumbing.backoff import Backoff
from plumbing.kube import ApiError, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.informer import Change, Informer, Origin
from plumbing.kube.resources import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from plumbing.logs import get_logger

__all__ = ["NodeLabeler", "desired_node_labels"]

log = get_logger(__name__)


def _with_legacy(keys: Iterable[str]) -> frozenset[str]:
    """``keys`` and, for each, the key an earlier release wrote for the same thing."""
    out: set[str] = set()
    for key in keys:
        out.add(key)
        legacy = legacy_node_label_key(key)
        if legacy is not None:
            out.add(legacy)
    return frozenset(out)


class NodeLabeler:
    def __init__(
        self,
        kube: KubeClient,
        driver: str,
        *,
        publisher: str = "default",
        debounce: float = 0.05,
        plugin_nodes: PluginNodes | None = None,
    ) -> None:
        self._kube = kube
        self._plugin_nodes = plugin_nodes
        self._warned_no_plugin: set[str] = set()
        self._driver = driver
        self._publisher = publisher
        #: the pool-label prefixes: this release's, and the one before NodeRestriction's namespace
        self._prefixes = tuple(_with_legacy([pool_label_prefix(driver) + "/"]))
        #: the warm-count keys of this publisher: one per device type, known from the start
        self._warm_keys = _with_legacy(warm_label_key(driver, t.value, publisher) for t in DeviceType)
        #: label keys of every pool this controller owns or owned, and its warm keys (module
        #: docstring); each with the key an earlier release wrote for it
        self._owned: set[str] = set(self._warm_keys)
        self._owned_listed = False
        #: node name → its labels, kept by list + watch
        self._nodes: dict[str, dict[str, str]] = {}
        self._informer = Informer(kube, NODES, on_changes=self._on_changes)
        #: claim (namespace/name) → the (pool, device) of this driver it is allocated
        self._allocated: dict[str, frozenset[tuple[str, str]]] = {}
        self._claims = Informer(kube, RESOURCE_CLAIMS, on_changes=self._on_claims)
        self._loop = Reconciler(
            self.sync,
            retried=(ApiError,),
            on_failure=self._failed,
            debounce=debounce,
            backoff=Backoff(initial=0.2, maximum=30.0),
        )
        self._warned_missing: set[str] = set()
        #: the warm devices, kept from the devices each inventory changed
        self._warm = KeptDevices(lambda device: device.state is BindingState.WARM)

    async def run(self, feed: InventorySource) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._informer.run())
            tasks.create_task(self._claims.run())
            tasks.create_task(self._loop.follow(feed))
            tasks.create_task(self._reconcile_when_synced(feed))
            if self._plugin_nodes is not None:
                tasks.create_task(self._plugin_nodes.run())
                tasks.create_task(self._follow_plugins(self._plugin_nodes))

    async def _follow_plugins(self, plugins: PluginNodes) -> None:
        while True:
            await plugins.changed.wait()
            plugins.changed.clear()
            self._loop.trigger()

    async def _reconcile_when_synced(self, feed: InventorySource) -> None:
        """Passes once the nodes, the claims (and the plugin pods) are listed: before that, a
        node would seem to lack labels it has, or a warm device to be free that a claim holds."""
        await self._informer.synced.wait()
        await self._claims.synced.wait()
        if self._plugin_nodes is not None:
            await self._plugin_nodes.synced.wait()
        await self._loop.run(feed)

    @staticmethod
    def _failed(err: Exception, retry_in: float) -> None:
        log.warning("labelling nodes failed; retrying", error=str(err), retry_in=round(retry_in, 2))

    def _on_changes(self, changes: Sequence[Change], origin: Origin) -> None:
        for change in changes:
            name = self._name(change.object)
            if change.type == "DELETED":
                self._nodes.pop(name, None)
                continue
            labels = self._labels(change.object)
            if name not in self._nodes or self._ours(self._nodes[name]) != self._ours(labels):
                self._loop.trigger()
            self._nodes[name] = labels
        if origin != "watch":
            self._loop.trigger()  # a (re)list: reconcile everything once

    def _on_claims(self, changes: Sequence[Change], origin: Origin) -> None:
        for change in changes:
            meta = change.object.get("metadata") or {}
            key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
            claim = ResourceClaim.read(change.object) if change.type != "DELETED" else None
            results = claim.results if claim is not None else ()
            held = frozenset((r.pool, r.device) for r in results if r.driver == self._driver)
            if held != self._allocated.get(key, frozenset()):
                self._loop.trigger()
            if held:
                self._allocated[key] = held
            else:
                self._allocated.pop(key, None)

    @staticmethod
    def _name(node: dict[str, Any]) -> str:
        return str((node.get("metadata") or {}).get("name") or "")

    @staticmethod
    def _labels(node: dict[str, Any]) -> dict[str, str]:
        return dict((node.get("metadata") or {}).get("labels") or {})

    def _ours(self, labels: dict[str, str] | None) -> dict[str, str]:
        return {
            k: v for k, v in (labels or {}).items() if k.startswith(self._prefixes) or k in self._warm_keys
        }

    async def _learn_owned(self, inventory: Inventory) -> None:
        if not self._owned_listed:
            items, _ = await self._kube.list_all(
                RESOURCE_SLICES,
                label_selector=slice_selector(self._driver, self._publisher),
                field_selector=f"spec.driver={self._driver}",
            )
            for obj in items:
                spec = obj.get("spec") or {}
                pool = (spec.get("pool") or {}).get("name")
                if pool:
                    self._owned |= _with_legacy([pool_label_key(self._driver, str(pool))])
                # the reach-group labels its slices select on (a group may be gone since; a slice
                # an earlier release wrote selects on the earlier key)
                for term in (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
                    for expression in term.get("matchExpressions") or []:
                        if str(expression.get("key") or "").startswith(self._prefixes):
                            self._owned |= _with_legacy([str(expression["key"])])
            self._owned_listed = True
        self._owned |= _with_legacy(pool_label_key(self._driver, p.pool) for p in inventory.pools)
        self._owned |= _with_legacy(
            k for keys in desired_node_labels(inventory, self._driver).values() for k in keys
        )

    async def sync(self, inventory: Inventory) -> int:
        """Patch every node whose pool or warm labels differ; returns the number of patches."""
        await self._learn_owned(inventory)
        pools = desired_node_labels(inventory, self._driver)
        wanted = {name: dict.fromkeys(keys, "true") for name, keys in pools.items()}
        allocated = frozenset().union(*self._allocated.values())
        warm = warm_labels_of(
            self._warm.update(inventory).values(),
            reaching_nodes(inventory),
            self._driver,
            self._publisher,
            allocated,
        )
        for name, counts in warm.items():
            wanted.setdefault(name, {}).update(counts)
        if self._plugin_nodes is not None:
            with_plugin = self._plugin_nodes.nodes()
            for name in sorted(set(wanted) - with_plugin - self._warned_no_plugin):
                log.warning("the fabric reaches a node without a Ready plugin pod; not labelled", node=name)
            self._warned_no_plugin = set(wanted) - with_plugin
            wanted = {name: keys for name, keys in wanted.items() if name in with_plugin}
        for name in sorted(set(wanted) - set(self._nodes) - self._warned_missing):
            self._warned_missing.add(name)
            log.warning("the fabric reaches a node Kubernetes does not know (yet)", node=name)
        patches = 0
        for name, labels in sorted(self._nodes.items()):
            have = {k: v for k, v in self._ours(labels).items() if k in self._owned}
            want = wanted.get(name, {})
            change: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
            change.update({k: None for k in have if k not in want})
            if not change:
                continue
            try:
                updated = await self._kube.patch(NODES, name, {"metadata": {"labels": change}})
            except NotFound:
                self._nodes.pop(name, None)
                continue
            except ApiError:
                NODE_LABEL_PATCHES.labels(outcome="error").inc()
                raise
            NODE_LABEL_PATCHES.labels(outcome="ok").inc()
            self._nodes[name] = self._labels(updated)
            patches += 1
            log.info(
                "node labels updated",
                node=name,
                added=",".join(sorted(f"{k}={v}" for k, v in change.items() if v)) or None,
                removed=",".join(sorted(k for k, v in change.items() if v is None)) or None,
            )
        return patches
