"""The EventService's event stream: a bounded history plus live Server-Sent Event subscribers.

Each event carries one Redfish message (ResourceEvent, TaskEvent, Fabric, Composition or Base
registry) and an ``OriginOfCondition``. Event Ids increase across restarts (the high-water
mark is part of the durable state), so a client reconnecting with ``Last-Event-ID`` gets what
it missed, or — when that fell out of the history — a Base ``EventBufferExceeded`` event
telling it to re-read the resources it cares about.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from emulator.redfish.model.registries import message, message_def
from emulator.redfish.model.resources import Event, EventRecord, ref
from emulator.redfish.model.state import utcnow

__all__ = ["EventBus", "EventFilter", "FabricEvent", "Subscription"]

_HISTORY = 2048
_QUEUE = 4096


@dataclass(frozen=True)
class FabricEvent:
    seq: int
    prefix: str
    key: str
    args: tuple[str, ...]
    origin: str | None
    timestamp: str

    @property
    def resource_type(self) -> str | None:
        """The Redfish resource type of the origin, guessed from its collection segment."""
        if not self.origin:
            return None
        parts = self.origin.rstrip("/").split("/")
        collection = parts[-2] if len(parts) >= 2 else ""
        return _TYPE_OF_COLLECTION.get(collection)

    def payload(self) -> dict[str, Any]:
        msg = message(self.key, *self.args, prefix=self.prefix)
        record = EventRecord(
            MemberId="0",
            EventId=str(self.seq),
            EventTimestamp=self.timestamp,
            MessageId=msg["MessageId"],
            Message=msg["Message"],
            MessageArgs=list(self.args),
            MessageSeverity=msg["MessageSeverity"],
            OriginOfCondition=ref(self.origin) if self.origin else None,
        )
        return Event(Id=str(self.seq), Name="Fabric event", Events=[record]).payload()


_TYPE_OF_COLLECTION = {
    "Endpoints": "Endpoint",
    "Zones": "Zone",
    "Connections": "Connection",
    "Systems": "ComputerSystem",
    "ResourceBlocks": "ResourceBlock",
    "Tasks": "Task",
    "Ports": "Port",
    "PCIeDevices": "PCIeDevice",
    "Processors": "Processor",
    "Drives": "Drive",
    "NetworkAdapters": "NetworkAdapter",
    "MemoryChunks": "MemoryChunks",
    "Switches": "Switch",
}


@dataclass(frozen=True)
class EventFilter:
    """The ``$filter`` of an SSE request: terms joined by ``or`` (DSP0266 "Server-sent events")."""

    terms: tuple[tuple[str, str], ...] = ()

    def matches(self, event: FabricEvent) -> bool:
        if not self.terms:
            return True
        message_id = message_def(event.prefix, event.key).message_id
        for prop, value in self.terms:
            if (
                (prop == "RegistryPrefix" and value == event.prefix)
                or (prop == "MessageId" and (value == message_id or message_id.endswith("." + value)))
                or (
                    prop == "OriginResource"
                    and event.origin is not None
                    and event.origin == value.rstrip("/")
                )
                or (prop == "ResourceType" and value == event.resource_type)
            ):
                return True
        return False

    @classmethod
    def parse(cls, text: str) -> EventFilter:
        """Parse ``Prop eq 'value' [or Prop eq 'value' ...]``; raises ValueError naming the problem."""
        terms: list[tuple[str, str]] = []
        if not text.strip():
            return cls()
        for clause in _split_or(text):
            parts = clause.strip().split(None, 2)
            if len(parts) != 3 or parts[1] != "eq":
                raise ValueError(f"expected \"Property eq 'value'\", got {clause.strip()!r}")
            prop, _, raw = parts
            if prop not in ("RegistryPrefix", "MessageId", "OriginResource", "ResourceType"):
                raise ValueError(f"cannot filter on {prop!r}")
            value = raw.strip()
            if len(value) < 2 or value[0] != "'" or value[-1] != "'":
                raise ValueError(f"the value of {prop} must be in single quotes")
            terms.append((prop, value[1:-1]))
        return cls(tuple(terms))


def _split_or(text: str) -> Iterable[str]:
    # ' or ' never occurs inside the quoted values we accept (URIs, registry names, Ids)
    return text.split(" or ")


class Subscription:
    def __init__(self, bus: EventBus, event_filter: EventFilter) -> None:
        self.bus = bus
        self.filter = event_filter
        self.queue: asyncio.Queue[FabricEvent | None] = asyncio.Queue(_QUEUE)
        self.overflowed = False

    def offer(self, event: FabricEvent) -> None:
        if not self.filter.matches(event):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True

    def close(self) -> None:
        self.bus.unsubscribe(self)


class EventBus:
    def __init__(self, last_seq: int = 0) -> None:
        self.seq = last_seq
        self.history: deque[FabricEvent] = deque(maxlen=_HISTORY)
        self._subscribers: set[Subscription] = set()
        self._closed = False

    def make(self, key: str, *args: object, prefix: str, origin: str | None) -> FabricEvent:
        """Number an event; :meth:`publish` sends it once the change behind it is durable."""
        self.seq += 1
        stamp = utcnow().isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return FabricEvent(self.seq, prefix, key, tuple(str(a) for a in args), origin, stamp)

    def publish(self, events: Iterable[FabricEvent]) -> None:
        for event in events:
            self.history.append(event)
            for sub in list(self._subscribers):
                sub.offer(event)

    def subscribe(
        self, event_filter: EventFilter, last_event_id: int | None = None
    ) -> tuple[Subscription, bool]:
        """A live subscription, pre-filled with events after ``last_event_id``.

        The boolean is False when events after ``last_event_id`` are no longer in the history.
        """
        sub = Subscription(self, event_filter)
        complete = True
        if last_event_id is not None:
            oldest = self.history[0].seq if self.history else self.seq + 1
            complete = last_event_id >= oldest - 1
            for event in self.history:
                if event.seq > last_event_id:
                    sub.offer(event)
        if self._closed:
            sub.queue.put_nowait(None)
        else:
            self._subscribers.add(sub)
        return sub, complete

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    def close(self) -> None:
        """End every stream (service shutdown): subscribers receive ``None``."""
        self._closed = True
        for sub in list(self._subscribers):
            try:
                sub.queue.put_nowait(None)
            except asyncio.QueueFull:
                sub.overflowed = True
        self._subscribers.clear()
