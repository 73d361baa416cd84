"""Events (``events.k8s.io/v1``) for what the stand-in control plane does, so the demo can show
``kubectl describe pod``-style history. Recording never fails the caller."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from dra_driver.kube import ApiError, KubeClient
from dra_driver.kube.resources import EVENTS
from dra_driver.logs import get_logger

__all__ = ["EventRecorder"]

log = get_logger(__name__)


class EventRecorder:
    def __init__(self, kube: KubeClient, controller: str, instance: str) -> None:
        self.kube = kube
        self.controller = controller
        self.instance = instance

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
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC)
        event = {
            "metadata": {
                "name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action or reason,
            "reason": reason,
            "note": note[:1024],
            "type": type,
            "regarding": {
                "apiVersion": regarding.get("apiVersion", "v1"),
                "kind": regarding.get("kind", "Pod"),
                "namespace": namespace,
                "name": meta.get("name", ""),
                "uid": meta.get("uid", ""),
            },
        }
        try:
            await self.kube.create(EVENTS, event, namespace)
        except ApiError as err:
            log.warning("event not recorded", reason=reason, object=meta.get("name"), error=str(err))
