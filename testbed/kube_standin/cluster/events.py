"""Events (``events.k8s.io/v1``) for what the stand-in control plane does, so the demo can show
``kubectl describe pod``-style history. Recording never fails the caller.

The Events themselves are made by fabric-dra's own recorder (:mod:`plumbing.kube.events`);
the stand-in controllers hold the object at hand, so this one takes the object and names it."""

from __future__ import annotations

from typing import Any, Literal

from plumbing.kube import KubeClient
from plumbing.kube import events as kube_events

__all__ = ["EventRecorder"]


class EventRecorder:
    def __init__(self, kube: KubeClient, controller: str, instance: str) -> None:
        self._recorder = kube_events.EventRecorder(kube, controller=controller, instance=instance)

    async def record(
        self,
        regarding: dict[str, Any],
        reason: str,
        note: str,
        *,
        type: Literal["Normal", "Warning"] = "Normal",
        action: str | None = None,
    ) -> None:
        meta = regarding.get("metadata") or {}
        ref = kube_events.ObjectRef(
            kind=regarding.get("kind", "Pod"),
            name=meta.get("name", ""),
            namespace=meta.get("namespace") or "default",
            api_version=regarding.get("apiVersion", "v1"),
            uid=meta.get("uid", ""),
        )
        await self._recorder.record(ref, reason=reason, action=action or reason, note=note, event_type=type)
