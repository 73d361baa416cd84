"""The manager's view of the fabric: devices, hosts → nodes, bindings, and a version that moves.

Discovery passes (:mod:`fabric.backends.watch`) load what they found (:meth:`Inventory.load`,
:meth:`Inventory.load_bindings`). The manager's own binds and unbinds update the view at once
(:meth:`Inventory.note_binding`); a pass that started before such a change does not undo it.

``version`` grows whenever the rendered inventory changes (a device, a binding, a health, a node);
it starts from the wall clock in milliseconds so it also grows across restarts and fail-overs,
which lets ``GET /api/v1/inventory?after=V`` long-polls resume safely. Each version also records
which devices it changed (:class:`~fabric.state.changes.ChangeHistory`, bounded), so
``GET /api/v1/inventory/changes?since=V`` answers only those (:meth:`Inventory.changes_json`);
that start is the ``epoch`` a change cursor counts in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from pydantic import TypeAdapter

from fabric.state.changes import ChangeHistory, NodeWaits
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord, FabricInfo, FabricSnapshot, HostRecord, MemoryDomainRecord
from fabric.state.names import pool_name
from manager_api import models as api
from manager_api.devices import DeviceAttributes
from manager_api.errors import FabricError, FabricUnavailable, ResyncRequired
from plumbing.logs import get_logger

__all__ = ["DeviceFacts", "Inventory", "changes_json", "wait_changes"]

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
        self, *, fabric_name: str = "fabric", history_versions: int = 1024, history_devices: int = 65536
    ) -> None:
        self.fabric_name = fabric_name
        self.version = time.time_ns() // 1_000_000
        #: which devices each version changed, for the change feed; its epoch is this start
        self.history = ChangeHistory(self.version, max_versions=history_versions, max_devices=history_devices)
        self.loaded = asyncio.Event()
        #: why the last discovery pass failed (None after a good one)
        self.last_error: FabricError | None = None
        self.last_refresh_at: float | None = None
        self.last_refresh_seconds: float | None = None
        #: ``time.monotonic()`` of the first good pass after failed ones (the fabric came back)
        self.recovered_at = 0.0
        #: the ledger entry of a device (the wiring sets it): claim, node and operation state
        self.overlay: Callable[[str], LedgerEntry | None] = lambda name: None
        #: what the drains make of a rendered device, and their version (:meth:`follow_drains`)
        self._drain_of: Callable[[api.Device], api.DeviceDrain | None] = lambda device: None
        self._drains_version: Callable[[], int] = lambda: 0
        #: the ledger entries of a memory pool's shares (the wiring sets it)
        self.shares_of: Callable[[str], list[LedgerEntry]] = lambda pool: []
        self._records: dict[str, DeviceRecord] = {}
        #: devices whose bound hosts changed since :meth:`binding_changes` (None: any may have)
        self._binding_changes: set[str] | None = None
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
        #: device name → its served JSON and what it was rendered from (no model: at 10,000
        #: devices their models held three times their JSON; :meth:`snapshot` reads them back)
        self._views: dict[str, _Served] = {}
        #: the device names in the order served, and the rest of the inventory, as of the last
        #: full flush (they change only with a discovery pass or a remap, which flush in full)
        self._order: list[str] = []
        self._pools: list[api.FabricPool] = []
        self._nodes: list[api.FabricNode] = []
        self._tail = ""
        #: built on demand from the views, once per version (:meth:`_built`, :meth:`snapshot`)
        self._rendered: api.Inventory | None = None
        empty = api.Inventory(version=self.version, pools=[], devices=[], nodes=[])
        self._rendered_json = empty.model_dump_json(by_alias=True).encode()
        self._built_version = self.version
        self._changed = asyncio.Condition()
        #: the per-node change feed's long polls waiting (:func:`wait_changes`)
        self.node_waits = NodeWaits()
        #: the nodes each served device concerns (:func:`_nodes_of`), as of its last change
        self._device_nodes: dict[str, frozenset[str]] = {}
        self._closing = False

    def follow(self, ledger: Ledger) -> None:
        """Show each device's claim, node and operation state from ``ledger``, and re-render a
        device whenever its entry is put or removed."""
        self.overlay = ledger.get
        self.shares_of = ledger.shares_of
        ledger.listeners.append(self.changed)

    def follow_drains(
        self, drain_of: Callable[[api.Device], api.DeviceDrain | None], version: Callable[[], int]
    ) -> None:
        """Show each device's drain (:mod:`fabric.state.drains`); every device is re-checked when
        ``version`` moves (call :meth:`changed` then)."""
        self._drain_of = drain_of
        self._drains_version = version

    # -- lookups ----------------------------------------------------------------------------------

    def device(self, name: str) -> DeviceRecord | None:
        return self._records.get(name)

    def devices(self) -> list[DeviceRecord]:
        return list(self._records.values())

    @property
    def hosts(self) -> Mapping[str, HostRecord]:
        """The hosts of the last full pass, by ComputerSystem Id."""
        return self._hosts

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

    # -- what discovery found ---------------------------------------------------------------------

    def pass_failed(self, err: FabricError) -> None:
        """A discovery pass could not read the service: the view stays as it was."""
        self.last_error = err

    def _pass_done(self, started: float) -> None:
        if self.last_error is not None:
            self.recovered_at = time.monotonic()
        self.last_error = None
        self.last_refresh_at = time.time()
        self.last_refresh_seconds = time.monotonic() - started

    def binding_changes(self) -> set[str] | None:
        """The devices whose bound hosts changed since this was last asked; None when any may have
        (a full pass since, or never asked)."""
        changes, self._binding_changes = self._binding_changes, set()
        return changes

    def _binding_changed(self, name: str) -> None:
        if self._binding_changes is not None:
            self._binding_changes.add(name)

    def load_bindings(self, bindings: Mapping[str, tuple[str, ...]], started: float) -> None:
        """A bindings-only pass that started at ``started`` (monotonic) found ``bindings`` (device
        key → bound hosts); a device the manager itself changed since keeps what it did."""
        self._pass_done(started)
        for name, record in list(self._records.items()):
            hosts = bindings.get(record.key)
            if hosts is None or hosts == record.bound_hosts or self._touched.get(name, 0.0) > started:
                continue
            self._records[name] = record.with_binding(hosts)
            self._binding_changed(name)
            self.changed(name)

    def load(self, snapshot: FabricSnapshot, host_nodes: Mapping[str, str], started: float) -> None:
        """A full pass that started at ``started`` (monotonic) found ``snapshot``, whose hosts are
        the nodes ``host_nodes`` names; a device the manager itself changed since the scan began
        keeps its binding."""
        self._pass_done(started)
        records: dict[str, DeviceRecord] = {}
        for record in snapshot.devices:
            current = self._records.get(record.name)
            if current is not None and self._touched.get(record.name, 0.0) > snapshot.started_at:
                record = record.with_binding(current.bound_hosts)
            records[record.name] = record
        self._records = records
        self._binding_changes = None  # every device's, as far as a reader of them knows
        self._hosts = snapshot.hosts
        self._fabrics = snapshot.fabrics
        self._reach = _reach_groups(records.values(), self._fabrics)
        self.notices = snapshot.notices
        self._host_nodes = dict(host_nodes)
        self._node_hosts = {node: host for host, node in self._host_nodes.items()}
        self.changed()
        self.loaded.set()

    def map_nodes(self, host_nodes: Mapping[str, str]) -> None:
        """The hosts are the nodes ``host_nodes`` names now (the cluster's Nodes changed)."""
        if dict(host_nodes) != self._host_nodes:
            log.info("hosts mapped to nodes again", nodes=sorted(host_nodes.values()))
            self._host_nodes = dict(host_nodes)
            self._node_hosts = {node: host for host, node in self._host_nodes.items()}
            self.changed()

    def note_binding(self, name: str, hosts: tuple[str, ...]) -> None:
        """The manager itself changed a binding: show it now, and keep it over older passes."""
        record = self._records.get(name)
        if record is not None:
            self._records[name] = record.with_binding(hosts)
            self._binding_changed(name)
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

    # -- rendering --------------------------------------------------------------------------------

    def render_device(self, record: DeviceRecord) -> api.Device:
        a = record.attributes
        entry = self.overlay(record.name)
        host = record.bound_hosts[0] if record.bound_hosts else None
        if entry is not None:
            state = _STATE_OF_ENTRY[entry.state]
            node: str | None = entry.node
            host = entry.host
            # a warm pool's entry has no claim, nor has a GPU serving partitions (its holders do)
            claim: str | None = None if entry.partition_held else (entry.claim_uid or None)
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
        device = api.Device(
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
            partition_table=a.partition_table,
            partitions=[
                api.PartitionHolder(partition=h.partition, claim_uid=h.claim_uid, node=entry.node)
                for h in entry.partitions
            ]
            if entry is not None
            else [],
            memory_pool=memory_pool_view(record, self.shares_of(record.name)),
        )
        device.drain = self._drain_of(device)
        return device

    def _view_changed(self, record: DeviceRecord) -> bool:
        """Bring the device's rendering up to date; whether what it serves changed. Re-rendered only
        when its record, its ledger entry, the node of its host, its attach failures or its reach
        group changed (a pass re-reads every device; most come back unchanged)."""
        entry = self.overlay(record.name)
        overlay: object = (
            (entry.state, entry.node, entry.host, entry.claim_uid, tuple(entry.partitions))
            if entry is not None
            else None
        )
        if record.memory_domain is not None:
            overlay = (overlay, _shares_key(self.shares_of(record.name)))
        bound_node = self._host_nodes.get(record.bound_hosts[0]) if record.bound_hosts else None
        key = (
            overlay,
            bound_node,
            self._attach_failures.get(record.name),
            self.reach_of(record),
            self._drains_version(),
        )
        cached = self._views.get(record.name)
        if cached is not None and cached.key == key and (cached.record is record or cached.record == record):
            return False
        device = self.render_device(record)
        text = device.model_dump_json(by_alias=True)
        self._views[record.name] = _Served(record, key, text, _nodes_of(device), DeviceFacts.of(device))
        return cached is None or cached.text != text

    def _refresh_all_views(self) -> tuple[set[str], bool]:
        """Every device, the pools and the nodes checked again: the devices whose served form
        changed (added and removed ones too), and whether the pools, nodes or notices did."""
        nodes, pools = fabric_view(
            self.fabric_name, self._hosts, self._fabrics, self._host_nodes, self._records, self._reach
        )
        order = sorted(self._records)
        # devices added or removed, then each whose rendering changed
        names = set(order).symmetric_difference(self._order) if order != self._order else set()
        for name in order:
            if self._view_changed(self._records[name]):
                names.add(name)
        if len(self._views) > len(self._records):
            self._views = {k: v for k, v in self._views.items() if k in self._records}
        tail = (
            f'"nodes":{_NODES.dump_json(nodes, by_alias=True).decode()},'
            f'"notices":{_NOTICES.dump_json(self.notices).decode()}}}'
        )
        rest = pools != self._pools or tail != self._tail
        self._order, self._pools, self._nodes, self._tail = order, pools, nodes, tail
        return names, rest

    def _built(self) -> None:
        """The served inventory's JSON for the current version, built once per version: at 10,000
        devices the join is megabytes, paid only when someone reads it."""
        if self._built_version == self.version:
            return
        pools = _POOLS.dump_json(self._pools, by_alias=True).decode()
        devices = ",".join(self._views[name].text for name in self._order)
        self._rendered_json = (
            f'{{"version":{self.version},"epoch":{self.history.epoch},"pools":{pools},'
            f'"devices":[{devices}],{self._tail}'.encode()
        )
        self._built_version = self.version

    def changed(self, device: str | None = None) -> None:
        """Something may have changed — about ``device`` only, or (None) anything: re-check soon
        (changes of one loop iteration coalesce). Naming the device keeps an attach at 10,000
        bindings from re-checking the other 9,999."""
        if device is None:
            self._dirty_all = True
        else:
            # a share's entry (``<pool>/<shareID>``) changes its pool's device
            self._dirty_names.add(device.split("/", 1)[0])
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
            changed, rest = self._refresh_all_views()
        else:
            rest = False
            # a device no pass has found is not served
            changed = {n for n in names if (r := self._records.get(n)) is not None and self._view_changed(r)}
        if not changed and not rest:
            return
        self.version += 1
        self._rendered = None  # the models of the last version, if any were asked for
        concerned = _concerned(changed, self._device_nodes, self._views, self._records)
        self.history.record(self.version, concerned)
        self.node_waits.wake(concerned)
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def snapshot(self) -> api.Inventory:
        """The inventory as models, read from each device's served JSON (:func:`_read_back`)."""
        self._flush()
        if self._rendered is None or self._rendered.version != self.version:
            self._rendered = _read_back(self, [self._views[name].text for name in self._order])
        return self._rendered

    def nodes(self) -> list[api.FabricNode]:
        """The nodes the inventory serves (:meth:`snapshot`'s, without its devices)."""
        self._flush()
        return self._nodes

    def facts(self) -> list[DeviceFacts]:
        """What gauges, usage and the foreign-binding log read of each served device, in order:
        kept beside its JSON, so that no scrape or pass builds every device's model."""
        self._flush()
        return [self._views[name].facts for name in self._order]

    def snapshot_json(self) -> bytes:
        """:meth:`snapshot` as the JSON the API serves (camelCase), encoded once per version: every
        long poll woken by a change gets the same bytes."""
        self._flush()
        self._built()
        return self._rendered_json

    async def wait_past(self, version: int, wait_seconds: float) -> None:
        """Return once the version differs from ``version``, or when ``wait_seconds`` pass (one of
        another incarnation, higher than ours, at once: never wait for one not reached)."""
        if not self.loaded.is_set():
            raise FabricUnavailable("the fabric inventory is not loaded yet", retry_after=1.0)
        self._flush()
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version != version or self._closing), wait_seconds
                )

    def flush(self) -> None:
        """Re-check what changed now, rather than at the loop's next turn."""
        self._flush()

    def served(self, names: set[str]) -> tuple[str, list[str], str]:
        """Of the devices ``names``: the served JSON of those present (comma-joined, by name), the
        names of those gone; and the pools, nodes and notices as JSON members (``"pools":…}``)."""
        present = sorted(n for n in names if n in self._records and n in self._views)
        removed = sorted(n for n in names if n not in self._records)
        pools = _POOLS.dump_json(self._pools, by_alias=True).decode()
        return ",".join(self._views[n].text for n in present), removed, f'"pools":{pools},{self._tail}'

    async def release_waiters(self) -> None:
        """Answer every long poll now, with the inventory as it is: the service is shutting down and
        must not hold its clients (or its own exit) until their timeouts pass."""
        self._closing = True
        self.node_waits.wake_all()
        await self._notify()


def fabric_view(
    fabric_name: str,
    hosts: Mapping[str, HostRecord],
    fabrics: Mapping[str, FabricInfo],
    host_nodes: Mapping[str, str],
    records: Mapping[str, DeviceRecord],
    reach: Mapping[str, str | None],
) -> tuple[list[api.FabricNode], list[api.FabricPool]]:
    """The nodes and the pools the inventory serves: which fabrics each node's host is on, and which
    nodes reach each pool and each of its reach groups."""

    def nodes_of(of: tuple[str, ...]) -> list[str]:
        return sorted(host_nodes[h] for h in of if h in host_nodes)

    nodes: list[api.FabricNode] = []
    for host_id, node in sorted(host_nodes.items(), key=lambda item: item[1]):
        host = hosts.get(host_id)
        on = sorted(f.id for f in fabrics.values() if host_id in f.hosts)
        nodes.append(
            api.FabricNode(
                name=node,
                host=host_id,
                system_uuid=host.uuid if host else None,
                fabrics=on,
                pools=[pool_name(fabric_name, f) for f in on],
            )
        )
    groups: dict[str, dict[str, tuple[str, ...]]] = {}
    for record in records.values():
        group = reach.get(record.name)
        if group is not None:
            groups.setdefault(record.fabric, {})[group] = record.reachable_hosts
    pools = [
        api.FabricPool(
            pool=pool_name(fabric_name, fabric.id),
            fabric=fabric.id,
            nodes=nodes_of(fabric.hosts),
            reach_groups=[
                api.ReachGroup(id=group, nodes=nodes_of(members))
                for group, members in sorted(groups.get(fabric.id, {}).items())
            ],
        )
        for fabric in sorted(fabrics.values(), key=lambda f: f.id)
    ]
    return nodes, pools


def changes_json(inventory: Inventory, epoch: int, since: int, node: str | None = None) -> bytes:
    """:class:`~manager_api.models.InventoryChanges` after version ``since`` of ``epoch``, as the
    API serves it (each changed device's JSON is the one it was rendered to once); with ``node``,
    only the devices concerning that node (:mod:`fabric.state.changes`), the answer naming it.
    Raises :class:`ResyncRequired` when the bounded history cannot say what changed."""
    history = inventory.history
    inventory.flush()
    names = history.since(epoch, since, node)
    if names is None:
        raise ResyncRequired(
            f"inventory changes since version {since} of epoch {epoch} are no longer known: the "
            f"manager holds versions {history.oldest}-{history.current} of epoch {history.epoch}; "
            "read GET /api/v1/inventory again"
        )
    devices, removed, rest = inventory.served(names)
    # a node name is a DNS subdomain (checked at the route): nothing in it needs escaping
    scope = f'"node":"{node}",' if node is not None else ""
    return (
        f'{{"epoch":{history.epoch},"since":{since},"version":{inventory.version},{scope}'
        f'"devices":[{devices}],"removed":{_NOTICES.dump_json(removed).decode()},{rest}'
    ).encode()


async def wait_changes(
    inventory: Inventory, epoch: int, since: int, wait_seconds: float, node: str | None = None
) -> bytes:
    """:func:`changes_json` once the version differs from ``since`` (with ``node``: once a version
    after it concerns that node), or when ``wait_seconds`` pass; a cursor the history cannot answer
    is refused at once, without waiting. The answer's version is the current one either way, so a
    reader never reads again what it was spared.

    A node's poll is woken by the versions that concern its node only
    (:class:`~fabric.state.changes.NodeWaits`): an idle node's poll costs another node's change
    nothing. A poll whose cursor the history drops meanwhile is answered 410 when it ends, as one
    that asks again would be."""
    if not inventory.loaded.is_set():
        await inventory.wait_past(since, 0)  # raises FabricUnavailable
    elif inventory.history.holds(epoch, since):
        if node is None:
            await inventory.wait_past(since, wait_seconds)
        else:
            inventory.flush()
            if not inventory.history.concerns(since, node):
                await inventory.node_waits.wait(node, wait_seconds)
    return changes_json(inventory, epoch, since, node)  # flushes what changed meanwhile


def memory_pool_view(record: DeviceRecord, entries: list[LedgerEntry]) -> api.MemoryPool | None:
    """A memory pool's limits and this manager's shares of it (``entries``: their ledger entries);
    None for a device that is no pool."""
    domain = record.memory_domain
    if domain is None:
        return None
    shares = [
        api.MemoryShare(
            share_id=share.share_id,
            claim_uid=entry.claim_uid,
            node=entry.node,
            memory_bytes=share.memory_bytes,
            state=_STATE_OF_ENTRY[entry.state],
            chunk=share.chunk,
            connection=share.connection,
        )
        for entry in entries
        if (share := entry.share) is not None
    ]
    return api.MemoryPool(
        size_bytes=domain.size_bytes,
        outside_bytes=domain.outside_bytes,
        min_chunk_bytes=domain.min_chunk_bytes,
        increment_bytes=domain.increment_bytes,
        max_chunks=domain.max_chunks,
        shares=shares,
        used_bytes=pool_used_bytes(domain, entries),
    )


def _read_back(inventory: Inventory, texts: list[str]) -> api.Inventory:
    """The inventory as models, read from the JSON each device is served as (the same devices,
    the same values), once per version and dropped when the version moves: the few readers that
    need models (operators' device and drain lists) pay for them; the long polls and the change
    feed, which serve the JSON, do not."""
    return api.Inventory.model_construct(
        version=inventory.version,
        pools=inventory._pools,
        devices=[api.Device.model_validate_json(text) for text in texts],
        nodes=inventory._nodes,
        notices=list(inventory.notices),
        epoch=inventory.history.epoch,
    )


@dataclass(frozen=True, slots=True)
class _Served:
    """A device as the inventory serves it, and what it was rendered from."""

    record: DeviceRecord
    #: what besides the record its rendering depends on (:meth:`Inventory._view_changed`)
    key: object
    #: its JSON, as served
    text: str
    #: the nodes it concerns (:func:`_nodes_of`)
    nodes: frozenset[str]
    facts: DeviceFacts


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """Of a served device, what the manager's gauges and logs count (:meth:`Inventory.facts`)."""

    name: str
    pool: str
    type: str
    model: str | None
    state: api.BindingState
    #: False: bound outside fabric-dra (no ledger entry explains it)
    managed: bool
    health: api.Health
    node: str | None
    host: str | None
    #: the effect of the drain on it, if drained
    drain_effect: str | None

    @classmethod
    def of(cls, device: api.Device) -> DeviceFacts:
        return cls(
            name=device.name,
            pool=device.pool,
            type=str(device.type),
            model=device.model,
            state=device.state,
            managed=device.managed,
            health=device.health,
            node=device.node,
            host=device.host,
            drain_effect=str(device.drain.effect) if device.drain is not None else None,
        )


def _concerned(
    changed: set[str],
    device_nodes: dict[str, frozenset[str]],
    views: Mapping[str, _Served],
    records: Mapping[str, DeviceRecord],
) -> dict[str, frozenset[str]]:
    """Each changed device with the nodes it concerned before the change and concerns now (a
    removed device: before), for the per-node change feed; ``device_nodes`` keeps the after."""
    concerned: dict[str, frozenset[str]] = {}
    for name in changed:
        before = device_nodes.pop(name, frozenset())
        view = views.get(name) if name in records else None
        after = view.nodes if view is not None else frozenset()
        if after:
            device_nodes[name] = after
        concerned[name] = before | after
    return concerned


def _nodes_of(device: api.Device) -> frozenset[str]:
    """The nodes a served device concerns — those whose plugin judges its health: the node it is
    bound or attached to, each node holding one of its partitions, each node one of its memory
    pool's shares is connected to."""
    nodes = {device.node} if device.node else set()
    nodes.update(h.node for h in device.partitions if h.node)
    if device.memory_pool is not None:
        nodes.update(s.node for s in device.memory_pool.shares if s.node)
    return frozenset(nodes)


def pool_used_bytes(domain: MemoryDomainRecord, entries: list[LedgerEntry]) -> int:
    """What a memory pool has carved: chunks fabric-dra did not make, and every share's chunk
    (``entries``: the pool's share entries, being made, made or being released)."""
    return domain.outside_bytes + sum(e.share.chunk_mib << 20 for e in entries if e.share is not None)


def _shares_key(entries: list[LedgerEntry]) -> tuple[object, ...]:
    """What of a pool's shares its rendered device shows: it is rendered again when this changes."""
    return tuple(
        (e.device, e.state, e.share.chunk if e.share else None, e.share.connection if e.share else None)
        for e in entries
    )


def _reach_groups(
    records: Iterable[DeviceRecord], fabrics: Mapping[str, FabricInfo]
) -> dict[str, str | None]:
    """Each device's reach group, once per discovery pass (reach changes with nothing else).

    Named after the reaching *hosts*, not nodes: a node joining, leaving or being renamed moves
    node labels only, while the group, and the slices published for it, stay as they are."""
    every = {f.id: set(f.hosts) for f in fabrics.values()}
    groups: dict[str, str | None] = {}
    for record in records:
        hosts = every.get(record.fabric)
        partial = hosts is not None and not hosts <= set(record.reachable_hosts)
        groups[record.name] = reach_group_id(record.reachable_hosts) if partial else None
    return groups


def reach_group_id(hosts: tuple[str, ...]) -> str:
    """A reach group's id: a short hash of the ComputerSystem Ids that reach its devices."""
    return "r" + hashlib.sha256("\n".join(sorted(hosts)).encode()).hexdigest()[:10]
