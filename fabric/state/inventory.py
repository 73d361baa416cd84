"""The manager's view of the fabric: devices, hosts → nodes, bindings, and a version that moves.

Discovery passes (:class:`fabric.backends.Discovery`) run at start, whenever the Redfish service
sends an event (debounced; binding events cause at most one pass per ``bindings_interval``), after
the event stream reconnects (it may have missed events, or the service restarted), and every
``resync`` seconds — more often while no event stream is up. The manager's own binds and unbinds
update the view at once (:meth:`Inventory.note_binding`); a pass that started before such a change
does not undo it.

``version`` grows whenever the rendered inventory changes (a device, a binding, a health, a node);
it starts from the wall clock in milliseconds so it also grows across restarts and fail-overs,
which lets ``GET /api/v1/inventory?after=V`` long-polls resume safely.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable

from pydantic import TypeAdapter

from fabric.backends.discovery import Discovery
from fabric.redfish.error_mapping import message_key
from fabric.redfish.events import EventStream
from fabric.redfish.tasks import FINAL_TASK_EVENTS
from fabric.state.ledger import LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord, FabricInfo, HostRecord
from fabric.state.names import pool_name
from fabric.state.nodes import NodeResolver
from manager_api import models as api
from manager_api.devices import DeviceAttributes
from manager_api.errors import FabricError, FabricUnavailable
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["Inventory"]

#: the table of device attributes: what discovery found of a device is what the API shows of it
_ATTRIBUTE_FIELDS = tuple(DeviceAttributes.model_fields)
_POOLS = TypeAdapter(list[api.FabricPool])
_NODES = TypeAdapter(list[api.FabricNode])
_NOTICES = TypeAdapter(list[str])

log = get_logger(__name__)

_STATE_OF_ENTRY = {
    LedgerState.ATTACHING: api.BindingState.ATTACHING,
    LedgerState.BOUND: api.BindingState.BOUND,
    LedgerState.DETACHING: api.BindingState.DETACHING,
    LedgerState.WARM: api.BindingState.WARM,
}


class Inventory:
    def __init__(
        self,
        discovery: Discovery,
        resolver: NodeResolver,
        *,
        fabric_name: str = "fabric",
        resync_seconds: float = 60.0,
        poll_seconds: float = 10.0,
        use_events: bool = True,
        event_debounce: float = 0.2,
        bindings_interval: float = 1.0,
    ) -> None:
        self.discovery = discovery
        self.resolver = resolver
        self.fabric_name = fabric_name
        self.resync_seconds = resync_seconds
        self.poll_seconds = poll_seconds
        self.use_events = use_events
        self.event_debounce = event_debounce
        #: at least this long between the starts of two bindings-only passes (events come with
        #: every bind; under load one pass a second reads them all)
        self.bindings_interval = bindings_interval
        self.version = time.time_ns() // 1_000_000
        self.loaded = asyncio.Event()
        #: why the last discovery pass failed (None after a good one)
        self.last_error: FabricError | None = None
        self.last_refresh_at: float | None = None
        self.last_refresh_seconds: float | None = None
        #: ``time.monotonic()`` of the first good pass after failed ones (the fabric came back)
        self.recovered_at = 0.0
        #: the ledger entry of a device, set by the binder: claim, node and operation state
        self.overlay: Callable[[str], LedgerEntry | None] = lambda name: None
        #: called after each discovery pass (the binder reconciles its ledger with it)
        self.after_refresh: list[Callable[[], Awaitable[None]]] = []
        self.stream: EventStream | None = None
        self._records: dict[str, DeviceRecord] = {}
        self._hosts: dict[str, HostRecord] = {}
        self._fabrics: dict[str, FabricInfo] = {}
        #: device name → its reach group (:meth:`reach_of`)
        self._reach: dict[str, str | None] = {}
        #: what the last full pass found and cannot offer (FabricSnapshot.notices)
        self.notices: list[str] = []
        self._host_nodes: dict[str, str] = {}
        self._node_hosts: dict[str, str] = {}
        self._touched: dict[str, float] = {}
        #: device → (attaches failed in a row, the latest one's error code); shown in the inventory
        self._attach_failures: dict[str, tuple[int, str]] = {}
        self._dirty = False
        #: a change anything may depend on (a discovery pass, nodes remapped): the next flush
        #: re-checks every device; otherwise only the devices named here are re-checked
        self._dirty_all = True
        self._dirty_names: set[str] = set()
        #: device name → (record, overlay key, rendered device, its JSON)
        self._views: dict[str, tuple[DeviceRecord, object, api.Device, str]] = {}
        #: the device names in the order served, and the rest of the inventory, as of the last
        #: full flush (they change only with a discovery pass or a remap, which flush in full)
        self._order: list[str] = []
        self._pools: list[api.FabricPool] = []
        self._nodes: list[api.FabricNode] = []
        self._tail = ""
        #: built on demand from the views, once per version (:meth:`_built`)
        self._rendered = api.Inventory(version=self.version, pools=[], devices=[], nodes=[])
        self._rendered_json = self._rendered.model_dump_json(by_alias=True).encode()
        self._built_version = self.version
        self._changed = asyncio.Condition()
        self._closing = False
        self._refresh_lock = asyncio.Lock()
        self._refresh_wanted = asyncio.Event()
        self._full_wanted = True

    # -- lookups ----------------------------------------------------------------------------------

    def device(self, name: str) -> DeviceRecord | None:
        return self._records.get(name)

    def devices(self) -> list[DeviceRecord]:
        return list(self._records.values())

    def host(self, host_id: str) -> HostRecord | None:
        return self._hosts.get(host_id)

    def host_for_node(self, node: str) -> HostRecord | None:
        host_id = self._node_hosts.get(node)
        return self._hosts.get(host_id) if host_id else None

    def node_for_host(self, host_id: str) -> str | None:
        return self._host_nodes.get(host_id)

    def pool_of(self, record: DeviceRecord) -> str:
        return pool_name(self.fabric_name, record.fabric)

    def reach_of(self, record: DeviceRecord) -> str | None:
        """The reach group of a device that only some hosts of its fabric reach (None: all do)."""
        return self._reach.get(record.name)

    def _reach_groups(self) -> dict[str, str | None]:
        """Each device's reach group, once per discovery pass (reach changes with nothing else).

        Named after the reaching *hosts*, not nodes: a node joining, leaving or being renamed moves
        node labels only, while the group, and the slices published for it, stay as they are."""
        every = {f.id: set(f.hosts) for f in self._fabrics.values()}
        groups: dict[str, str | None] = {}
        for record in self._records.values():
            hosts = every.get(record.fabric)
            partial = hosts is not None and not hosts <= set(record.reachable_hosts)
            groups[record.name] = reach_group_id(record.reachable_hosts) if partial else None
        return groups

    # -- discovery ----------------------------------------------------------------------------------

    async def refresh(self, *, bindings_only: bool = False) -> None:
        """One discovery pass; raises :class:`FabricError` when the service cannot be read.

        ``bindings_only`` re-reads just who is bound (zones, connections, resource blocks) — the
        cheap pass that follows binding events — once a full pass has run.
        """
        async with self._refresh_lock:
            if bindings_only and self.loaded.is_set():
                await self._refresh_bindings()
            else:
                await self._refresh_all()
        for hook in self.after_refresh:
            await hook()

    def _refreshed(self, started: float) -> None:
        if self.last_error is not None:
            self.recovered_at = time.monotonic()
        self.last_error = None
        self.last_refresh_at = time.time()
        self.last_refresh_seconds = time.monotonic() - started

    async def _refresh_bindings(self) -> None:
        try:
            bindings, gets, started = await self.discovery.scan_bindings()
        except FabricError as err:
            self.last_error = err
            raise
        self._refreshed(started)
        for name, record in list(self._records.items()):
            hosts = bindings.get(record.key)
            if hosts is None or hosts == record.bound_hosts or self._touched.get(name, 0.0) > started:
                continue
            self._records[name] = record.with_binding(hosts)
            self.changed(name)
        log.debug("fabric bindings read", gets=gets, seconds=round(time.monotonic() - started, 3))

    async def _refresh_all(self) -> None:
        started = time.monotonic()
        try:
            await self.resolver.refresh()
            snapshot = await self.discovery.scan()
        except FabricError as err:
            self.last_error = err
            raise
        self._refreshed(started)
        records: dict[str, DeviceRecord] = {}
        for record in snapshot.devices:
            current = self._records.get(record.name)
            if current is not None and self._touched.get(record.name, 0.0) > snapshot.started_at:
                record = record.with_binding(current.bound_hosts)
            records[record.name] = record
        self._records = records
        self._hosts = snapshot.hosts
        self._fabrics = snapshot.fabrics
        self._reach = self._reach_groups()
        self.notices = snapshot.notices
        self._host_nodes = self.resolver.resolve(snapshot.hosts)
        self._node_hosts = {node: host for host, node in self._host_nodes.items()}
        log.debug(
            "fabric discovered",
            devices=len(records),
            hosts=len(snapshot.hosts),
            gets=snapshot.gets,
            seconds=round(time.monotonic() - started, 3),
        )
        self.changed()
        self.loaded.set()

    def remap_nodes(self) -> None:
        """The cluster's Nodes changed: map the known hosts to nodes again (no fabric re-read)."""
        if not self.loaded.is_set():
            return
        host_nodes = self.resolver.resolve(self._hosts)
        if host_nodes != self._host_nodes:
            log.info("hosts mapped to nodes again", nodes=sorted(host_nodes.values()))
            self._host_nodes = host_nodes
            self._node_hosts = {node: host for host, node in host_nodes.items()}
            self.changed()

    def request_refresh(self, *, bindings_only: bool = False) -> None:
        """Ask the run loop for a pass soon; any request for a full pass wins."""
        if not bindings_only:
            self._full_wanted = True
        self._refresh_wanted.set()

    def note_binding(self, name: str, hosts: tuple[str, ...]) -> None:
        """The manager itself changed a binding: show it now, and keep it over older passes."""
        record = self._records.get(name)
        if record is not None:
            self._records[name] = record.with_binding(hosts)
        self._touched[name] = time.monotonic()
        self.changed(name)

    def note_attach(self, name: str, error: str | None) -> None:
        """An attach of ``name`` ended: failed with ``error`` (a code), or succeeded (None)."""
        if error is None:
            if self._attach_failures.pop(name, None) is None:
                return
        else:
            failures = self._attach_failures.get(name, (0, ""))[0]
            self._attach_failures[name] = (failures + 1, error)
        self.changed(name)

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
        finally:
            if stream_task is not None:
                stream_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream_task

    def _stream_connected(self) -> None:
        self.discovery.client.tasks.stream_changed()
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

    # -- rendering --------------------------------------------------------------------------------

    def render_device(self, record: DeviceRecord) -> api.Device:
        a = record.attributes
        entry = self.overlay(record.name)
        host = record.bound_hosts[0] if record.bound_hosts else None
        if entry is not None:
            state = _STATE_OF_ENTRY[entry.state]
            node: str | None = entry.node
            host = entry.host
            claim: str | None = entry.claim_uid or None  # a warm pool's entry has no claim
            managed = True
        elif record.bound_hosts:
            state = api.BindingState.BOUND
            node = self._host_nodes.get(record.bound_hosts[0])
            claim = None
            managed = False
        else:
            state = api.BindingState.FREE if a.available else api.BindingState.UNAVAILABLE
            node = claim = None
            managed = True
        return api.Device(
            name=record.name,
            pool=self.pool_of(record),
            fabric=record.fabric,
            **{field: getattr(a, field) for field in _ATTRIBUTE_FIELDS},
            state=state,
            node=node,
            host=host,
            holders=list(record.bound_hosts),
            claim_uid=claim,
            managed=managed,
            binding_style=record.style,
            redfish_uri=record.key,
            attach_failures=self._attach_failures.get(record.name, (0, None))[0],
            attach_error=self._attach_failures.get(record.name, (0, None))[1],
            reach=self.reach_of(record),
        )

    def _view_changed(self, record: DeviceRecord) -> bool:
        """Bring the device's rendering up to date; whether what it serves changed. Re-rendered only
        when its record, its ledger entry, the node of its host, its attach failures or its reach
        group changed (a pass re-reads every device; most come back unchanged)."""
        entry = self.overlay(record.name)
        overlay = (entry.state, entry.node, entry.host, entry.claim_uid) if entry is not None else None
        bound_node = self._host_nodes.get(record.bound_hosts[0]) if record.bound_hosts else None
        key = (overlay, bound_node, self._attach_failures.get(record.name), self.reach_of(record))
        cached = self._views.get(record.name)
        if cached is not None and cached[1] == key and (cached[0] is record or cached[0] == record):
            return False
        device = self.render_device(record)
        text = device.model_dump_json(by_alias=True)
        self._views[record.name] = (record, key, device, text)
        return cached is None or cached[3] != text

    def _refresh_all_views(self) -> bool:
        """Every device, the pools and the nodes checked again; whether anything served changed."""
        nodes: list[api.FabricNode] = []
        for host_id, node in sorted(self._host_nodes.items(), key=lambda item: item[1]):
            host = self._hosts.get(host_id)
            fabrics = sorted(f.id for f in self._fabrics.values() if host_id in f.hosts)
            nodes.append(
                api.FabricNode(
                    name=node,
                    host=host_id,
                    system_uuid=host.uuid if host else None,
                    fabrics=fabrics,
                    pools=[pool_name(self.fabric_name, f) for f in fabrics],
                )
            )
        groups: dict[str, dict[str, tuple[str, ...]]] = {}
        for record in self._records.values():
            group = self._reach.get(record.name)
            if group is not None:
                groups.setdefault(record.fabric, {})[group] = record.reachable_hosts
        pools = [
            api.FabricPool(
                pool=pool_name(self.fabric_name, fabric.id),
                fabric=fabric.id,
                nodes=self._nodes_of(fabric.hosts),
                reach_groups=[
                    api.ReachGroup(id=group, nodes=self._nodes_of(hosts))
                    for group, hosts in sorted(groups.get(fabric.id, {}).items())
                ],
            )
            for fabric in sorted(self._fabrics.values(), key=lambda f: f.id)
        ]
        order = sorted(self._records)
        changed = order != self._order
        for name in order:
            changed |= self._view_changed(self._records[name])
        if len(self._views) > len(self._records):
            self._views = {k: v for k, v in self._views.items() if k in self._records}
        tail = (
            f'"nodes":{_NODES.dump_json(nodes, by_alias=True).decode()},'
            f'"notices":{_NOTICES.dump_json(self.notices).decode()}}}'
        )
        changed |= pools != self._pools or tail != self._tail
        self._order, self._pools, self._nodes, self._tail = order, pools, nodes, tail
        return changed

    def _built(self) -> None:
        """The served inventory and its JSON for the current version, built once per version: at
        10,000 devices the join is megabytes, paid only when someone reads it."""
        if self._built_version == self.version:
            return
        views = [self._views[name] for name in self._order]
        pools = _POOLS.dump_json(self._pools, by_alias=True).decode()
        devices = ",".join(text for _, _, _, text in views)
        self._rendered = api.Inventory.model_construct(
            version=self.version,
            pools=self._pools,
            devices=[device for _, _, device, _ in views],
            nodes=self._nodes,
            notices=list(self.notices),
        )
        self._rendered_json = (
            f'{{"version":{self.version},"pools":{pools},"devices":[{devices}],{self._tail}'.encode()
        )
        self._built_version = self.version

    def _nodes_of(self, hosts: tuple[str, ...]) -> list[str]:
        return sorted(self._host_nodes[h] for h in hosts if h in self._host_nodes)

    def changed(self, device: str | None = None) -> None:
        """Something may have changed — about ``device`` only, or (None) anything: re-check soon
        (changes of one loop iteration coalesce). Naming the device keeps an attach at 10,000
        bindings from re-checking the other 9,999."""
        if device is None:
            self._dirty_all = True
        else:
            self._dirty_names.add(device)
        if not self._dirty:
            self._dirty = True
            with contextlib.suppress(RuntimeError):  # no loop running: the next read flushes
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Re-check what changed; bump the version and wake long-polls when anything served did."""
        if not self._dirty:
            return
        self._dirty = False
        names, self._dirty_names = self._dirty_names, set()
        if self._dirty_all:
            self._dirty_all = False
            changed = self._refresh_all_views()
        else:
            changed = False
            for name in names:
                record = self._records.get(name)
                if record is not None:  # a device no pass has found is not served
                    changed |= self._view_changed(record)
        if not changed:
            return
        self.version += 1
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def snapshot(self) -> api.Inventory:
        self._flush()
        self._built()
        return self._rendered

    def snapshot_json(self) -> bytes:
        """:meth:`snapshot` as the JSON the API serves (camelCase), encoded once per version: every
        long poll woken by a change gets the same bytes."""
        self._flush()
        self._built()
        return self._rendered_json

    async def wait_newer(self, after: int, wait_seconds: float) -> api.Inventory:
        """The inventory once its version differs from ``after``, or as it is when ``wait_seconds`` pass.

        A version from another manager incarnation (higher than ours) returns at once, so a client
        never waits for a number this replica will not reach.
        """
        if not self.loaded.is_set():
            raise FabricUnavailable("the fabric inventory is not loaded yet", retry_after=1.0)
        self._flush()
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version != after or self._closing), wait_seconds
                )
        self._built()
        return self._rendered

    async def release_waiters(self) -> None:
        """Answer every long poll now, with the inventory as it is: the service is shutting down and
        must not hold its clients (or its own exit) until their timeouts pass."""
        self._closing = True
        async with self._changed:
            self._changed.notify_all()


def reach_group_id(hosts: tuple[str, ...]) -> str:
    """A reach group's id: a short hash of the ComputerSystem Ids that reach its devices."""
    return "r" + hashlib.sha256("\n".join(sorted(hosts)).encode()).hexdigest()[:10]


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
