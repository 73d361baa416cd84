"""Which nodes can prepare fabric devices: those where a pod of the kubelet plugin is Ready.

A pool's node label lets the scheduler allocate the pool's devices on a node; a pod that gets one
can only start where a kubelet plugin registered and prepares it. The plugin DaemonSet may not
run everywhere the fabric reaches — a taint it does not tolerate, a node selector
(deploy/components/plugin-scheduling), a crash loop — so the controller labels a node only while
a plugin pod is Ready on it. Ready is exactly "registered with the kubelet and checkpoint loaded"
(the plugin's readiness probe, dra_driver/plugin/probes.py), so the signal is node-scoped, comes
from the kubelet, and needs nothing more than list and watch on the plugin's pods in its own
namespace. A pod that is being deleted no longer counts: its node is losing its plugin.

Why pods rather than another signal: the plugin's claims report reaches only the fabric manager;
a node annotation or Lease kept by the plugin would give every plugin write access to nodes or
Leases. The pod's Ready condition is written by the kubelet itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from plumbing.kube import KubeClient
from plumbing.kube.informer import Change, Informer, Origin
from plumbing.kube.resources import PODS

__all__ = ["PluginNodes", "ready_node"]


def ready_node(pod: dict[str, Any]) -> str | None:
    """The node of a pod that is Ready and not being deleted, else None."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return str(node) if node and ready else None


class PluginNodes:
    """The nodes with a Ready plugin pod, from an informer on the plugin's pods in its namespace."""

    def __init__(self, kube: KubeClient, *, namespace: str, selector: str) -> None:
        self.namespace = namespace
        self.selector = selector
        self._informer = Informer(
            kube, PODS, namespace=namespace, label_selector=selector, on_changes=self._on_changes
        )
        self._nodes: frozenset[str] = frozenset()
        #: set whenever the node set changes (and after the first list); the caller clears it
        self.changed = asyncio.Event()

    @property
    def synced(self) -> asyncio.Event:
        return self._informer.synced

    def nodes(self) -> frozenset[str]:
        return self._nodes

    def _on_changes(self, changes: Sequence[Change], origin: Origin) -> None:
        nodes = frozenset(node for pod in self._informer.values() if (node := ready_node(pod)))
        if nodes != self._nodes or origin == "list":
            self._nodes = nodes
            self.changed.set()

    async def run(self) -> None:
        await self._informer.run()
