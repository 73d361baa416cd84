"""Keeping the inventory current: discovery passes, and the Redfish event stream that asks for them.

Passes (:class:`fabric.backends.discovery.Discovery`) run at start, whenever the Redfish service
sends an event (debounced; binding events cause at most one pass per ``bindings_interval``), after
the event stream reconnects (it may have missed events, or the service restarted), and every
``resync`` seconds — more often while no event stream is up. A binding event asks only for the
cheap pass that re-reads who is bound; anything else, and every resync, for a full one. Each pass
lands in the :class:`fabric.state.inventory.Inventory`, whose own record of the manager's binds and
unbinds wins over a pass that started before them; then the hooks of :attr:`after_refresh` run (the
reconciler compares the ledger with what was found).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from fabric.backends.discovery import Discovery
from fabric.redfish.error_mapping import message_key
from fabric.redfish.events import EventStream
from fabric.redfish.tasks import FINAL_TASK_EVENTS
from fabric.state.inventory import Inventory
from fabric.state.nodes import NodeResolver
from manager_api.errors import FabricError
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["InventoryWatch"]

log = get_logger(__name__)


class InventoryWatch:
    def __init__(
        self,
        discovery: Discovery,
        inventory: Inventory,
        resolver: NodeResolver,
        *,
        resync_seconds: float = 60.0,
        poll_seconds: float = 10.0,
        use_events: bool = True,
        event_debounce: float = 0.2,
        bindings_interval: float = 1.0,
    ) -> None:
        self.discovery = discovery
        self.inventory = inventory
        self.resolver = resolver
        self.resync_seconds = resync_seconds
        self.poll_seconds = poll_seconds
        self.use_events = use_events
        self.event_debounce = event_debounce
        #: at least this long between the starts of two bindings-only passes (events come with
        #: every bind; under load one pass a second reads them all)
        self.bindings_interval = bindings_interval
        #: called after each discovery pass (the reconciler compares the ledger with it)
        self.after_refresh: list[Callable[[], Awaitable[None]]] = []
        self.stream: EventStream | None = None
        self._refresh_lock = asyncio.Lock()
        self._refresh_wanted = asyncio.Event()
        self._full_wanted = True
        #: the event stream is connected (set once, on its first connection)
        self._stream_up = asyncio.Event()
        #: a full pass has begun: a connection after it may have missed events of that pass
        self._full_begun = False

    async def refresh(self, *, bindings_only: bool = False) -> None:
        """One discovery pass; raises :class:`FabricError` when the service cannot be read.

        ``bindings_only`` re-reads just who is bound (zones, connections, resource blocks) — the
        cheap pass that follows binding events — once a full pass has run.
        """
        async with self._refresh_lock:
            if bindings_only and self.inventory.loaded.is_set():
                await self._refresh_bindings()
            else:
                await self._refresh_all()
        for hook in self.after_refresh:
            await hook()

    async def _refresh_bindings(self) -> None:
        try:
            bindings, gets, started = await self.discovery.scan_bindings()
        except FabricError as err:
            self.inventory.pass_failed(err)
            raise
        self.inventory.load_bindings(bindings, started)
        log.debug("fabric bindings read", gets=gets, seconds=round(time.monotonic() - started, 3))

    async def _refresh_all(self) -> None:
        self._full_begun = True
        started = time.monotonic()
        try:
            await self.resolver.refresh()
            snapshot = await self.discovery.scan()
        except FabricError as err:
            self.inventory.pass_failed(err)
            raise
        self.inventory.load(snapshot, self.resolver.resolve(snapshot.hosts), started)
        log.info(
            "fabric discovered",
            devices=len(snapshot.devices),
            hosts=len(snapshot.hosts),
            gets=snapshot.gets,
            not_modified=snapshot.not_modified,
            seconds=round(time.monotonic() - started, 3),
        )

    def remap_nodes(self) -> None:
        """The cluster's Nodes changed: map the known hosts to nodes again (no fabric re-read)."""
        if self.inventory.loaded.is_set():
            self.inventory.map_nodes(self.resolver.resolve(self.inventory.hosts))

    def request_refresh(self, *, bindings_only: bool = False) -> None:
        """Ask the run loop for a pass soon; any request for a full pass wins."""
        if not bindings_only:
            self._full_wanted = True
        self._refresh_wanted.set()

    async def run(self) -> None:
        """Keep the view current until cancelled: events first, polling as the fallback."""
        stream_task: asyncio.Task[None] | None = None
        if self.use_events:
            # A (re)connected stream may have missed events, or the service restarted: read everything.
            self.stream = EventStream(
                self.discovery.client,
                self._on_events,
                on_connect=self._stream_connected,
                on_disconnect=self.discovery.client.tasks.stream_changed,
            )
            stream_task = asyncio.create_task(self.stream.run(), name="redfish-events")
            # The first pass after the stream is up, not before: a pass that began before the
            # connection may have missed events, and the connection asks for another full pass —
            # at 10,100 devices a second pass right after start, whose CPU the first attaches
            # waited for. A stream that takes longer than this is not waited for.
            # (nor a service that offers none)
            waits = [
                asyncio.ensure_future(self._stream_up.wait()),
                asyncio.ensure_future(self.stream.unsupported.wait()),
            ]
            await asyncio.wait(waits, timeout=_FIRST_CONNECT_WAIT, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
        backoff = Backoff(initial=0.5, maximum=self.poll_seconds)
        try:
            while True:
                bindings_only, self._full_wanted = not self._full_wanted, False
                started = time.monotonic()
                try:
                    await self.refresh(bindings_only=bindings_only)
                    backoff.reset()
                except FabricError as err:
                    log.warning("fabric discovery failed, retrying", error=err.message)
                    self._full_wanted = True  # the service may have restarted: read everything
                    await backoff.sleep()
                    continue
                await self._until_wanted(started)
        finally:
            if stream_task is not None:
                stream_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream_task

    async def _until_wanted(self, started: float) -> None:
        """Wait until the next pass is due: asked for (after a debounce, and for a bindings-only
        pass at most one per ``bindings_interval``), or the resync (sooner without events)."""
        streaming = self.stream is not None and self.stream.connected
        interval = self.resync_seconds if streaming else self.poll_seconds
        try:
            await asyncio.wait_for(self._refresh_wanted.wait(), interval)
        except TimeoutError:
            self._full_wanted = True  # the periodic resync reads everything
        else:
            await asyncio.sleep(self.event_debounce)  # let a burst of events arrive
            pause = self.bindings_interval - (time.monotonic() - started)
            if not self._full_wanted and pause > 0:
                # The manager's own binds are in the view already; events of others'
                # changes wait for the next pass, at most this interval away.
                await asyncio.sleep(pause)
        self._refresh_wanted.clear()

    def _stream_connected(self) -> None:
        self.discovery.client.tasks.stream_changed()
        self._stream_up.set()
        if self._full_begun:  # a pass already ran or runs: it may have missed events
            self.request_refresh()

    def _on_events(self, events: list[dict[str, object]]) -> None:
        for event in events:
            registry, name = message_key(str(event.get("MessageId") or ""))
            if registry == "TaskEvent":
                origin = event.get("OriginOfCondition")
                uri = origin.get("@odata.id") if isinstance(origin, dict) else None
                final = name in FINAL_TASK_EVENTS
                self.discovery.client.tasks.changed(str(uri) if uri else None, final=final)
        if events:
            self.request_refresh(bindings_only=all(_is_binding_event(e) for e in events))


#: how long the first pass waits for the event stream to connect (seconds)
_FIRST_CONNECT_WAIT = 5.0

#: resources whose changes are bindings, not device attributes or health
_BINDING_COLLECTIONS = ("Endpoints", "Zones", "Connections", "Systems", "TaskService")


def _is_binding_event(event: dict[str, object]) -> bool:
    """Whether an event only says who is bound to what (a bindings-only pass covers it)."""
    prefix, key = message_key(str(event.get("MessageId") or ""))
    if prefix == "TaskEvent":
        return True
    if prefix == "Fabric":
        return key.startswith(("Connection", "Zone"))
    if prefix == "Composition":
        return key == "ResourceBlockCompositionStateChanged"
    if prefix == "ResourceEvent" and key in ("ResourceChanged", "ResourceCreated", "ResourceRemoved"):
        origin = event.get("OriginOfCondition")
        uri = str(origin.get("@odata.id") or "") if isinstance(origin, dict) else ""
        return any(f"/{c}/" in uri or uri.endswith(f"/{c}") for c in _BINDING_COLLECTIONS)
    return False
