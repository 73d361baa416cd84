"""One ConfigMap that holds one document of the manager's, replaced whole with its
``resourceVersion``: a deposed leader's write fails with :class:`Conflict` instead of overwriting
the new leader's (the optimistic concurrency of every Kubernetes update, as client-go's
``RetryOnConflict`` callers rely on). The drains and the usage record are kept this way."""

from __future__ import annotations

from typing import Any

from plumbing.kube.client import KubeClient, NotFound
from plumbing.kube.resources import CONFIGMAPS

__all__ = ["ConfigMapDocument"]

_LABELS = {"app.kubernetes.io/name": "fabric-dra", "app.kubernetes.io/component": "manager"}


class ConfigMapDocument:
    """Read and replace ConfigMap ``namespace/name``, remembering the version last read or written.

    API errors (:class:`plumbing.kube.client.ApiError`: a conflict, an API server away) reach the
    caller, which says what the document is."""

    def __init__(self, client: KubeClient, *, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self._version: str | None = None

    def describe(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    async def read(self) -> dict[str, Any] | None:
        """The ConfigMap as stored, or None when there is none."""
        try:
            obj = await self.client.get(CONFIGMAPS, self.name, self.namespace)
        except NotFound:
            self._version = None
            return None
        self._version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        return obj

    async def write(self, content: dict[str, Any]) -> None:
        """Store ``content`` (``data`` and/or ``binaryData``): created when none was read, else
        replaced at the version last seen."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace, "labels": dict(_LABELS)}
        if self._version is None:
            saved = await self.client.create(CONFIGMAPS, {"metadata": metadata, **content}, self.namespace)
        else:
            metadata["resourceVersion"] = self._version
            saved = await self.client.replace(CONFIGMAPS, {"metadata": metadata, **content})
        self._version = str((saved.get("metadata") or {}).get("resourceVersion") or "")
