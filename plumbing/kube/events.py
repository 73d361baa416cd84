"""Kubernetes Events (``events.k8s.io/v1``) from fabric-dra's own roles.

An Event names what it is about (``regarding``), optionally a second object (``related``), who
reported it (``reportingController`` / ``reportingInstance``), what was done (``action``), why
(``reason``, CamelCase) and a human ``note``: at most 1024 bytes of UTF-8, the API server's
limit (``NoteLengthLimit`` in pkg/apis/core/validation/events.go, checked with Go's ``len``,
which counts bytes); a longer note is cut at a character boundary and ends with "…". Objects
without a namespace (Nodes) get their Events in ``default``, as the kubelet does. Recording never
fails the caller: an API error is logged once per reason and the work goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from plumbing.kube.client import ApiError, KubeClient
from plumbing.kube.resources import EVENTS
from plumbing.logs import get_logger

__all__ = ["NOTE_LIMIT_BYTES", "EventRecorder", "ObjectRef", "fit_note"]

log = get_logger(__name__)

#: The API server's limit on an Event's note, in bytes (pkg/apis/core/validation/events.go).
NOTE_LIMIT_BYTES = 1024
_ELLIPSIS = "…"


def fit_note(note: str, limit: int = NOTE_LIMIT_BYTES) -> str:
    """``note`` unchanged when its UTF-8 form fits in ``limit`` bytes; else its longest prefix
    that fits together with "…" (3 bytes), never splitting a character."""
    encoded = note.encode()
    if len(encoded) <= limit:
        return note
    room = limit - len(_ELLIPSIS.encode())
    # Dropping the bytes of a character cut in two leaves the longest whole-character prefix.
    return encoded[:room].decode("utf-8", errors="ignore") + _ELLIPSIS


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    name: str
    namespace: str = ""
    api_version: str = "v1"
    uid: str = ""

    def as_dict(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


class EventRecorder:
    def __init__(self, kube: KubeClient, *, controller: str, instance: str) -> None:
        self.kube = kube
        self.controller = controller
        self.instance = instance[:128]
        self._failed: set[str] = set()

    async def record(
        self,
        regarding: ObjectRef,
        *,
        reason: str,
        action: str,
        note: str,
        event_type: Literal["Normal", "Warning"] = "Normal",
        related: ObjectRef | None = None,
    ) -> bool:
        """Create one Event; False (logged) when the API server refused it."""
        namespace = regarding.namespace or "default"
        now = datetime.now(UTC)
        event: dict[str, object] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # client-go's recorder names an Event <object name>.<nanoseconds, hex>
            "metadata": {"name": f"{regarding.name}.{time.time_ns():x}", "namespace": namespace},
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "note": fit_note(note),
            "type": event_type,
            "regarding": regarding.as_dict(),
        }
        if related is not None:
            event["related"] = related.as_dict()
        try:
            await self.kube.create(EVENTS, event, namespace)
        except ApiError as err:
            if reason not in self._failed:
                self._failed.add(reason)
                log.warning(
                    "cannot record a Kubernetes Event (needs create on events.k8s.io events)",
                    reason=reason,
                    object=f"{regarding.kind}/{regarding.name}",
                    error=str(err).splitlines()[0] if str(err) else type(err).__name__,
                )
            return False
        return True
