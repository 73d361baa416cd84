"""Redfish Server-Sent Events: the inventory's fast path to fabric changes.

DSP0266 "Server-sent events": ``EventService.ServerSentEventUri`` streams ``text/event-stream``
(WHATWG HTML "Server-sent events") whose ``data:`` fields are Event payloads
(``{"Events": [{"MessageId": ..., "OriginOfCondition": {"@odata.id": ...}}]}``). The stream may end
at any time (service restart, idle proxies); the reader reconnects with backoff and tells its owner
so it can re-read everything it may have missed. A service without SSE is fine: the owner polls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import httpx

from fabric.redfish.client import RedfishClient
from fabric.redfish.links import ForeignLink, same_service
from manager_api.errors import FabricError
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["MAX_LINE", "EventStream", "bounded_lines", "parse_sse"]

_REGISTRIES = ("ResourceEvent", "TaskEvent", "Fabric", "Composition", "Base")

log = get_logger(__name__)

EventHandler = Callable[[list[dict[str, Any]]], Awaitable[None] | None]
ConnectHandler = Callable[[], Awaitable[None] | None]


#: the longest line of an event stream this reader keeps; a longer one ends the connection
MAX_LINE = 1 << 20


async def bounded_lines(chunks: AsyncIterator[str], max_line: int = MAX_LINE) -> AsyncIterator[str]:
    """The lines of a text stream (``\n``, ``\r\n`` or ``\r`` end one, as the event-stream
    format says); a line longer than ``max_line`` raises ValueError instead of growing for ever."""
    buffer = ""
    async for chunk in chunks:
        buffer += chunk
        while True:
            cut = min((i for i in (buffer.find("\n"), buffer.find("\r")) if i >= 0), default=-1)
            if cut < 0 or (cut == len(buffer) - 1 and buffer[cut] == "\r"):
                break  # no end yet, or a "\r" whose "\n" may still come
            line, rest = buffer[:cut], buffer[cut + 1 :]
            if buffer[cut] == "\r" and rest.startswith("\n"):
                rest = rest[1:]
            yield line
            buffer = rest
        if len(buffer) > max_line:
            raise ValueError(f"event stream line longer than {max_line} characters")
    if buffer:
        yield buffer.rstrip("\r")


async def parse_sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str]]:
    """(id, data) of each event in a ``text/event-stream``; comments and other fields are skipped."""
    data: list[str] = []
    event_id: str | None = None
    async for line in lines:
        if line == "":
            if data:
                yield event_id, "\n".join(data)
            data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "id":
            event_id = value
    if data:
        yield event_id, "\n".join(data)


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
                await asyncio.sleep(self.backoff_max * 6)
                continue
            self.supported = True
            try:
                await self._follow(uri)
                backoff.reset()  # a clean end: reconnect at once
                failures = 0
            except (httpx.HTTPError, FabricError, ValueError) as err:
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
        headers = await asyncio.to_thread(self.client.auth_headers)
        headers["Accept"] = "text/event-stream"
        if self._last_id:
            headers["Last-Event-ID"] = self._last_id
        timeout = httpx.Timeout(self.client.settings.connect_timeout, read=None)
        async with (
            httpx.AsyncClient(base_url=self.client.base_url, verify=self.client.ssl_context()) as http,
            http.stream("GET", uri, headers=headers, timeout=timeout) as response,
        ):
            if response.status_code == 401:
                await asyncio.to_thread(self.client.reauthenticate)
                raise httpx.HTTPError("event stream: session rejected (401), logged in again")
            if response.status_code == 400 and "$filter" in uri:
                self._filter = False  # the service advertises filters it then refuses: take everything
                raise httpx.HTTPError("event stream refused its $filter (HTTP 400); reconnecting without")
            if response.status_code >= 400:
                raise httpx.HTTPError(f"event stream answered HTTP {response.status_code}")
            self.connected = True
            log.info("following Redfish server-sent events", uri=uri)
            if self.on_connect is not None:
                result = self.on_connect()
                if result is not None:
                    await result
            async for event_id, data in parse_sse(bounded_lines(response.aiter_text())):
                if event_id and event_id.isprintable() and len(event_id) <= 256:
                    self._last_id = event_id  # sent back as Last-Event-ID: a header value
                try:
                    payload = json.loads(data)
                except (ValueError, RecursionError):
                    continue
                events = payload.get("Events") if isinstance(payload, dict) else None
                if not isinstance(events, list):
                    continue
                try:
                    result = self.on_events([e for e in events if isinstance(e, dict)])
                    if result is not None:
                        await result
                except Exception:
                    log.exception("handling a Redfish event failed")
