"""Redfish Server-Sent Events: the inventory's fast path to fabric changes.

DSP0266 "Server-sent events": ``EventService.ServerSentEventUri`` streams ``text/event-stream``
(WHATWG HTML "Server-sent events") whose ``data:`` fields are Event payloads
(``{"Events": [{"MessageId": ..., "OriginOfCondition": {"@odata.id": ...}}]}``). The stream may end
at any time (service restart, idle proxies); the reader reconnects with backoff and tells its owner
so it can re-read everything it may have missed. A service without SSE is fine: the owner polls.

The stream is read through the client's transport (:meth:`fabric.redfish.transport.Transport.stream`:
the same origin, TLS and proxy as every request, no read timeout: a quiet stream is no dead one)
and its body, raw, handed to :class:`fabric.redfish.reader.EventReader`, the bounded reader
answers go through too: it undoes the ``Content-Encoding`` a bounded piece at a time, ends the
connection at a line or an event of more than 1 MiB or a stream that decodes to more than 100 times
what arrived, and parses each event within its JSON budget. Whatever is refused, the stream
reconnects after a growing pause.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from fabric.errors import ManagerError
from fabric.redfish.client import RedfishClient
from fabric.redfish.links import ForeignLink, same_service
from fabric.redfish.reader import EventReader, Refused
from fabric.redfish.transport import TransportError
from manager_api.errors import FabricError
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["EventStream"]

_REGISTRIES = ("ResourceEvent", "TaskEvent", "Fabric", "Composition", "Base")

log = get_logger(__name__)

EventHandler = Callable[[list[dict[str, Any]]], Awaitable[None] | None]
ConnectHandler = Callable[[], Awaitable[None] | None]


class _StreamRefused(ManagerError):
    """The service answered the stream's request with something other than a stream."""


class EventStream:
    """Follows the service's SSE stream until cancelled."""

    def __init__(
        self,
        client: RedfishClient,
        on_events: EventHandler,
        *,
        on_connect: ConnectHandler | None = None,
        on_disconnect: Callable[[], None] | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
    ) -> None:
        self.client = client
        self.on_events = on_events
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connected = False
        self.supported: bool | None = None  # None until the EventService was read
        #: set once the EventService says it has no server-sent events
        self.unsupported = asyncio.Event()
        self._last_id: str | None = None
        self._filter = True

    async def _stream_uri(self) -> str | None:
        root = await self.client.get_json("/redfish/v1/")
        link = root.get("EventService")
        service_uri = self._same_service(
            link.get("@odata.id") if isinstance(link, dict) else None, "EventService"
        )
        if service_uri is None:
            return None
        service = await self.client.get_json(service_uri)
        if service.get("ServiceEnabled") is False:
            return None
        uri = self._same_service(service.get("ServerSentEventUri"), "ServerSentEventUri")
        if uri is None:
            return None
        supported = service.get("SSEFilterPropertiesSupported") or {}
        if self._filter and isinstance(supported, dict) and supported.get("RegistryPrefix"):
            # Only the registries that speak of bindings, health and tasks (DSP0266 "Server-sent
            # events" $filter); Base stays in for EventBufferExceeded (events were lost).
            terms = " or ".join(f"RegistryPrefix eq '{p}'" for p in _REGISTRIES)
            return f"{uri}?$filter={quote(terms)}"
        return uri

    def _same_service(self, uri: object, link: str) -> str | None:
        """The path of ``uri`` on this service (:func:`fabric.redfish.links.resolve`); None for
        anything else — the request carries the session token, which must not go to another host."""
        try:
            return same_service(self.client.base_url, uri, link=link)
        except ForeignLink as err:
            if self.supported is not False:
                log.warning("not following the event stream", error=err.message)
            return None

    async def run(self) -> None:
        backoff = Backoff(self.backoff_initial, self.backoff_max)
        failures = 0
        followed = 0.0
        while True:
            try:
                uri = await self._stream_uri()
            except FabricError as err:
                log.debug("event service unreachable", error=err.message)
                await asyncio.sleep(backoff.next())
                continue
            except Exception as err:  # whatever the service sent, the stream must not die
                log.warning("cannot read the event service", error=f"{type(err).__name__}: {err}"[:300])
                await asyncio.sleep(self.backoff_max)
                continue
            if uri is None:
                if self.supported is not False:
                    log.info("the Redfish service offers no server-sent events; polling only")
                self.supported = False
                self.unsupported.set()
                await asyncio.sleep(self.backoff_max * 6)
                continue
            self.supported = True
            try:
                followed = time.monotonic()
                await self._follow(uri)
                if time.monotonic() - followed >= self.backoff_max:
                    # A clean end of a stream that lasted: reconnect at once. One that ends as soon
                    # as it begins (each start asks the owner to read everything) keeps backing off.
                    backoff.reset()
                failures = 0
            except (TransportError, _StreamRefused, FabricError, Refused, ValueError) as err:
                failures += 1
                # Say it once; a stream that keeps failing is polled around, not logged every 10 s.
                report = log.info if failures == 1 else log.debug
                report("event stream interrupted, reconnecting", error=(str(err) or type(err).__name__)[:300])
            except Exception as err:  # whatever the service sent, the stream must not die
                failures += 1
                log.warning("event stream failed, reconnecting", error=f"{type(err).__name__}: {err}"[:300])
            finally:
                was_connected, self.connected = self.connected, False
                if was_connected and self.on_disconnect is not None:
                    self.on_disconnect()
            await asyncio.sleep(backoff.next())

    async def _follow(self, uri: str) -> None:
        headers = {"Accept": "text/event-stream"}
        if self._last_id:
            headers["Last-Event-ID"] = self._last_id
        # The client's own transport: the same origin check, TLS settings and proxy as every
        # request, and shutdown's abort cuts the stream too. Read raw: the reader decodes.
        answer = await self.client.stream(uri, headers)
        try:
            if answer.status == 401:
                await self.client.reauthenticate()
                raise _StreamRefused("event stream: session rejected (401), logged in again")
            if answer.status == 400 and "$filter" in uri:
                self._filter = False  # the service advertises filters it then refuses: take everything
                raise _StreamRefused("event stream refused its $filter (HTTP 400); reconnecting without")
            if answer.status >= 300:
                raise _StreamRefused(f"event stream answered HTTP {answer.status}")
            self.connected = True
            log.info("following Redfish server-sent events", uri=uri)
            if self.on_connect is not None:
                result = self.on_connect()
                if result is not None:
                    await result
            reader = EventReader(answer.headers.get("content-encoding"))
            while wire := await answer.read():
                for event in reader.feed(wire):
                    await self._deliver(event.id, event.payload)
            reader.finish()
        finally:
            answer.close()

    async def _deliver(self, event_id: str | None, payload: object) -> None:
        if event_id and event_id.isprintable() and len(event_id) <= 256:
            self._last_id = event_id  # sent back as Last-Event-ID: a header value
        events = payload.get("Events") if isinstance(payload, dict) else None
        if not isinstance(events, list):
            return
        try:
            result = self.on_events([e for e in events if isinstance(e, dict)])
            if result is not None:
                await result
        except Exception:
            log.exception("handling a Redfish event failed")
