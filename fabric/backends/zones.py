"""PCIe (and CXL) binding through fabric Zones of Endpoints.

A target endpoint is bound to a host when it shares a zone of type ``ZoneOfEndpoints`` with one of
the host's initiator endpoints (Zone schema 1.6: "the endpoints in a zone can communicate"). To bind:

* if the host already has its own zone that offers ``#Zone.AddEndpoint`` (Zone 1.5), add the target
  to it, passing ``EndpointETag`` and ``ZoneETag`` so a concurrent change fails with 412/428
  instead of being overwritten;
* otherwise create a zone with the host's initiator and the target (POST to the Zones collection),
  named ``fabric-dra <device> on <host>``.

Unbinding reverses that: ``#Zone.RemoveEndpoint`` on a shared zone, DELETE (with ``If-Match``) of a
zone fabric-dra created for this one binding. A zone that also binds other devices and cannot remove
just one endpoint is never deleted: that would unbind devices fabric-dra does not own.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabric.backends.base import (
    Backend,
    BindContext,
    DiscoveryResult,
    EndpointView,
    authoritative_members,
    classify_endpoint,
    host_initiators,
    linked_initiators,
    read_endpoints,
)
from fabric.backends.stream import describe_by_switch
from fabric.backends.views import JSON, Endpoint, EndpointLinks, Fabric, ServiceRoot, Zone, odata_id
from fabric.backends.walk import Walk
from fabric.backends.zone_reads import ZoneReads, get_or_none
from fabric.redfish.client import SERVICE_ROOT, RedfishClient, RedfishResponse
from fabric.redfish.error_mapping import PreconditionFailed
from fabric.state.model import DeviceRecord, HostRecord
from manager_api.devices import BindingStyle
from manager_api.errors import BindFailed

__all__ = ["ZONE_NAME_PREFIX", "ZoneBackend"]

ZONE_NAME_PREFIX = "fabric-dra "
_BINDING_ZONE_TYPES = (None, "ZoneOfEndpoints")
#: how long the read before a bind or unbind may stand in for the read the action needs
_SNAPSHOT_SECONDS = 2.0
#: a host zone's ETag refused (412) and read again: sent again at most this often in one turn
_ZONE_ETAG_RETRIES = 3


@dataclass(slots=True)
class _Zone:
    uri: str
    zone: Zone
    endpoints: set[str]

    @classmethod
    def of(cls, uri: str, zone: Zone) -> _Zone:
        """The zone at ``uri`` as ``zone`` describes it, with the endpoints it links."""
        return cls(uri, zone, set(zone.links.endpoints))

    @property
    def ours(self) -> bool:
        return (self.zone.name or "").startswith(ZONE_NAME_PREFIX)

    def action(self, action: str) -> str | None:
        return self.zone.actions.target(action)


@dataclass(slots=True)
class _Snapshot:
    """What :meth:`ZoneBackend.read_binding` just read of one device: its endpoint and the zones
    that hold it, each with its ETag. The bind or unbind that follows the read acts on these
    (the ETags make the service refuse with 412 if anything changed since) instead of reading
    them again."""

    at: float
    endpoint: RedfishResponse
    #: each zone with its ETag and how many of our own actions had changed it when it was read
    zones: list[tuple[_Zone, str | None, int]]
    #: zones only the endpoint's links name (the fabric's Zones collection does not list them)
    linked_only: frozenset[str] = frozenset()


@dataclass(slots=True)
class _HostZoneRead:
    """A host's own zone as last read, with its ETag; it stands for a read now while
    :class:`_Turns` counts no change of ours to the zone since (``seen``) and it is at most
    :data:`_SNAPSHOT_SECONDS` old. Not used up by one bind: an action the service answers with a
    task (202) does not change the zone before the task ends, so the binds of a burst to one host
    send their ``Zone.AddEndpoint`` one after another on the same read. A foreign change since only
    makes the service refuse the ETag (412), and the zone is read again."""

    zone: _Zone
    etag: str | None
    seen: int
    at: float

    def current(self, turns: _Turns) -> bool:
        return turns.changes(self.zone.uri) == self.seen and time.monotonic() - self.at <= _SNAPSHOT_SECONDS


class _Roles:
    """Who each endpoint of the fabric is: a host's initiator (and whose), or a device target —
    as the last discovery found them, else read and remembered."""

    def __init__(self) -> None:
        self.initiator_hosts: dict[str, str] = {}
        self.targets: frozenset[str] = frozenset()
        #: changes with every initiator learned (what a zone's hosts are computed from)
        self.generation = 0

    def learn(self, initiators: Mapping[str, tuple[str, ...]], endpoints: list[EndpointView]) -> None:
        """What a discovery pass found: each host's initiators, and the device targets."""
        self.initiator_hosts = {uri: host for host, uris in initiators.items() for uri in uris}
        self.targets = frozenset(v.uri for v in endpoints if v.is_target)
        self.generation += 1

    def known_hosts(self, zone: _Zone) -> set[str]:
        """The hosts whose initiators (as discovered) ``zone`` holds."""
        return {self.initiator_hosts[e] for e in zone.endpoints if e in self.initiator_hosts}

    def own_zones(self, zones: list[_Zone]) -> dict[str, str]:
        """host → a zone whose initiators are that host's alone and that offers AddEndpoint."""
        own: dict[str, str] = {}
        for zone in sorted(zones, key=lambda z: z.uri):
            hosts = self.known_hosts(zone)
            if len(hosts) == 1 and zone.action("Zone.AddEndpoint"):
                own.setdefault(hosts.pop(), zone.uri)
        return own

    def bound_by(self, zones: list[_Zone]) -> dict[str, set[str]]:
        """Endpoint → the hosts whose initiators share a zone with it: one pass over every zone's
        members, instead of every zone per device (10,000 devices times the zones was the bindings
        pass's cost)."""
        bound: dict[str, set[str]] = {}
        for zone in zones:
            hosts = self.known_hosts(zone)
            if hosts:
                for e in zone.endpoints:
                    bound.setdefault(e, set()).update(hosts)
        return bound

    async def host_of(self, walk: Walk, endpoint_uri: str) -> str | None:
        if endpoint_uri in self.initiator_hosts:
            return self.initiator_hosts[endpoint_uri]
        if endpoint_uri in self.targets:
            return None  # a device target of the last discovery, no host's initiator
        view = classify_endpoint(await walk.read(endpoint_uri, Endpoint))
        if view is not None and view.host:
            self.initiator_hosts[endpoint_uri] = view.host
            self.generation += 1
            return view.host
        return None

    async def hosts_of(self, walk: Walk, zone: _Zone) -> set[str]:
        """The hosts whose initiators ``zone`` holds, those not discovered read now (a host's
        zone holds a hundred endpoints at 10,000 bindings: the known ones are looked up without
        an await each)."""
        hosts: set[str] = set()
        unknown: list[str] = []
        for uri in zone.endpoints:
            if uri in self.initiator_hosts:
                known = self.initiator_hosts[uri]
                if known:
                    hosts.add(known)
            elif uri not in self.targets:
                unknown.append(uri)
        for uri in unknown:
            host = await self.host_of(walk, uri)
            if host:
                hosts.add(host)
        return hosts

    async def is_device(self, walk: Walk, endpoint_uri: str) -> bool:
        if endpoint_uri in self.targets:
            return True
        view = classify_endpoint(await walk.read(endpoint_uri, Endpoint))
        return bool(view and view.is_target)


@dataclass(slots=True)
class _BoundMemo:
    """Who is bound, over the shared zone reads (:func:`bound_over`), kept with what
    each zone contributed: a zone is worked out again only when its JSON is another object (a
    version not seen before). A bindings pass at 10,000 bindings walked every zone's members and
    every target — a seventh of the manager's CPU during attaches, each pass holding the loop."""

    #: the discovery's targets (the list itself) and the initiators' generation it was made with
    key: tuple[list[str], int]
    #: listed zone URI → (its JSON as read, the hosts it binds, the endpoints it binds them to)
    zones: dict[str, tuple[JSON, frozenset[str], frozenset[str]]]
    #: endpoint → host → how many zones bind it to that host
    counts: dict[str, dict[str, int]]
    #: target → the hosts it is bound to, sorted
    answer: dict[str, tuple[str, ...]]

    @classmethod
    def for_targets(cls, targets: list[str], generation: int) -> _BoundMemo:
        return cls((targets, generation), {}, {}, dict.fromkeys(targets, ()))

    def update(
        self, current: Mapping[str, JSON], reads: ZoneReads, initiators: Mapping[str, str]
    ) -> dict[str, tuple[str, ...]]:
        """The answer for the zones ``current`` lists, as the shared read gave them (a copy)."""
        touched: set[str] = set()
        for uri in [u for u in self.zones if u not in current]:
            self.drop(uri, touched)
        for uri, body in current.items():
            kept = self.zones.get(uri)
            if kept is not None and kept[0] is body:
                continue
            self.drop(uri, touched)
            _, view, endpoints = reads.view(uri, body)
            hosts: frozenset[str] = frozenset()
            if view.uri is not None and view.zone_type in _BINDING_ZONE_TYPES:
                hosts = frozenset(initiators[e] for e in endpoints if e in initiators)
            self.add(uri, body, hosts, endpoints if hosts else frozenset(), touched)
        for endpoint in touched:
            if endpoint in self.answer:
                held = self.counts.get(endpoint)
                self.answer[endpoint] = tuple(sorted(held)) if held else ()
        return dict(self.answer)

    def drop(self, uri: str, touched: set[str]) -> None:
        kept = self.zones.pop(uri, None)
        if kept is None:
            return
        _, hosts, endpoints = kept
        for endpoint in endpoints:
            held = self.counts[endpoint]
            for host in hosts:
                held[host] -= 1
                if not held[host]:
                    del held[host]
            if not held:
                del self.counts[endpoint]
            touched.add(endpoint)

    def add(
        self, uri: str, body: JSON, hosts: frozenset[str], endpoints: frozenset[str], touched: set[str]
    ) -> None:
        self.zones[uri] = (body, hosts, endpoints)
        for endpoint in endpoints:
            held = self.counts.setdefault(endpoint, {})
            for host in hosts:
                held[host] = held.get(host, 0) + 1
            touched.add(endpoint)


class _Turns:
    """Our own actions on each shared zone go one at a time from reading its ETag to sending the
    action (not while a task runs): each reads the ETag the last one left, instead of failing with
    412 against a concurrent action of our own on the same zone. How many of them changed a zone
    says whether a read of it is stale."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._changes: dict[str, int] = {}

    def lock(self, zone_uri: str | None) -> asyncio.Lock:
        if zone_uri is None:
            return asyncio.Lock()  # no shared zone known: nothing to take turns on
        lock = self._locks.get(zone_uri)
        if lock is None:
            lock = self._locks[zone_uri] = asyncio.Lock()
        return lock

    def changed(self, zone_uri: str) -> None:
        self._changes[zone_uri] = self._changes.get(zone_uri, 0) + 1

    def changes(self, zone_uri: str) -> int:
        return self._changes.get(zone_uri, 0)


class _HostZoneActions:
    """Each host's own zone as last read (:class:`_HostZoneRead`) and the ``#Zone.AddEndpoint``
    that binds a device in it, sent in the zone's turn (:class:`_Turns`)."""

    def __init__(self, client: RedfishClient, turns: _Turns) -> None:
        self.client = client
        self.turns = turns
        #: host → its own zone as last read (by prepare_bind, the read before a bind, or a bind)
        self.reads: dict[str, _HostZoneRead] = {}
        #: device key → the zone its last bind added it to (:meth:`ZoneBackend.witnessed` reads it)
        self.bind_changed: dict[str, str] = {}

    def last(self, host: str) -> _HostZoneRead | None:
        """The host's zone as last read, while that stands for a read now."""
        read = self.reads.get(host)
        return read if read is not None and read.current(self.turns) else None

    def remember(self, host: str, zone: _Zone, etag: str | None, seen: int) -> None:
        self.reads[host] = _HostZoneRead(zone, etag, seen, time.monotonic())

    def keep(self, own: Mapping[str, tuple[str, int]], listed: Mapping[str, JSON], reads: ZoneReads) -> None:
        """Keep each host's own zone as the ETag listing just gave it (:meth:`ZoneReads.current`,
        read now): the bind that follows takes it instead of a GET of its own (the one
        :meth:`ZoneBackend.prepare_bind` makes where the service lists no ETags). ``own``: host →
        its zone and our changes to it before the listing was read."""
        for host, (uri, seen) in own.items():
            body = listed.get(uri)
            if body is not None:
                self.remember(host, _Zone.of(uri, reads.view(uri, body)[1]), reads.etag(uri, body), seen)

    async def add_endpoint(
        self,
        device: DeviceRecord,
        target_etag: str | None,
        own: tuple[_Zone, str | None],
        read_again: Callable[[], Awaitable[tuple[_Zone, str | None] | None]],
    ) -> tuple[tuple[_Zone, str | None], RedfishResponse]:
        """``#Zone.AddEndpoint`` of ``device`` on the host's own zone ``own`` (the caller holds the
        zone's turn), with both ETags. A refusal of the ETags (412/428) whose zone, read again
        (``read_again``: checked to be the host's own zone still), has another ETag now was the
        zone's (a task of ours that ended, or a foreign change): sent again at once with the new
        one. One whose zone still has the ETag sent was the endpoint's: the device changed, the
        caller reads it again. The zone and the answer."""
        attempt = 0
        while True:
            attempt += 1
            zone, zone_etag = own
            self.bind_changed[device.key] = zone.uri
            try:
                response = await self.client.post(
                    str(zone.action("Zone.AddEndpoint")), _endpoint_action(device, target_etag, zone_etag)
                )
            except PreconditionFailed:
                self.turns.changed(zone.uri)  # the read is stale: the next bind reads again too
                again = await read_again()
                if again is None or again[1] == zone_etag or attempt >= _ZONE_ETAG_RETRIES:
                    raise
                own = again
                continue
            except BaseException:
                self.turns.changed(zone.uri)  # what the service did is not known: read again
                raise
            if response.status != 202:
                # Applied at once: the zone's ETag moved. A task (202) changes it only when it
                # ends (ZoneBackend.bind counts that), so the next bind keeps the read until then.
                self.turns.changed(zone.uri)
            return own, response


class ZoneBackend(Backend):
    style = BindingStyle.ZONE
    authority = "Zones collection and its zones"

    def __init__(self, *args: Any, skip_memory_targets: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: leave targets with memory chunks to a Connection backend on the same fabric
        self.skip_memory_targets = skip_memory_targets
        self.roles = _Roles()
        self._targets: list[str] = []
        self._bound: _BoundMemo | None = None  # the bindings passes' answer (:func:`bound_over`)
        #: host → the zone of that host alone that offers Zone.AddEndpoint (from discovery)
        self._host_zones: dict[str, str] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self.turns = _Turns()
        #: the fabric's Zones collection (from discovery)
        self._zones_uri: str | None = None
        #: the zones as last read, read again where their ETags changed
        self.reads = ZoneReads(self.client)
        #: the hosts' own zones as last read, and AddEndpoint on them
        self.own_zones = _HostZoneActions(self.client, self.turns)
        #: device key → the zone its last bind added it to or created (:meth:`witnessed` reads it)
        self.bind_changed = self.own_zones.bind_changed

    @property
    def select(self) -> bool:
        """The service lists the zones' ETags (``$select`` with ``$expand``): :mod:`.zone_reads`."""
        return self.reads.select

    @select.setter
    def select(self, value: bool) -> None:
        self.reads.select = value

    async def discover(self, walk: Walk, hosts: Mapping[str, HostRecord]) -> DiscoveryResult:
        fabric = await walk.read(self.fabric_uri, Fabric)
        if fabric is None:
            return DiscoveryResult()
        endpoints = await read_endpoints(walk, fabric)
        self._zones_uri, self.expand = fabric.zones, walk.expand
        root = await walk.read(SERVICE_ROOT, ServiceRoot)
        self.select = bool(root and root.supports_select)
        zones = await self._zones(walk, fabric, endpoints)
        await self.reads.remember(walk, [zone.uri for zone in zones])
        endpoints += await linked_initiators(walk, endpoints, (e for z in zones for e in z.endpoints))
        result = host_initiators(endpoints, hosts)
        self.roles.learn(result.initiators, endpoints)
        self._targets = []
        self._host_zones = self.roles.own_zones(zones)
        bound_by = self.roles.bound_by(zones)
        targets = [v for v in endpoints if v.is_target and not (self.skip_memory_targets and v.chunks)]
        self._targets = [view.uri for view in targets]
        # a switch's devices' resources in collections, then its devices described at once, a
        # few switches at a time; what they were read from is dropped once they are described
        described = await describe_by_switch(walk, [(view.entities, view.endpoint) for view in targets])
        for view, attributes in zip(targets, described, strict=True):
            result.devices.append(
                DeviceRecord(
                    key=view.uri,
                    resource_id=view.id,
                    fabric=self.fabric_id,
                    style=self.style,
                    attributes=attributes,
                    bound_hosts=tuple(sorted(bound_by.get(view.uri, ()))),
                    reachable_hosts=result.hosts,
                    endpoint=view.uri,
                )
            )
        return result

    async def read_bindings(self, walk: Walk) -> dict[str, tuple[str, ...]]:
        fabric = await walk.read(self.fabric_uri, Fabric)
        collection = fabric.zones if fabric else None
        current = await self.reads.current(walk, collection)
        if current is not None:
            return bound_over(self, current)
        zones: dict[str, _Zone] = {}
        for zone in await walk.members(collection, Zone):
            self._add_zone(zones, zone)
        bound = self.roles.bound_by(list(zones.values()))
        return {t: tuple(sorted(bound.get(t, ()))) for t in self._targets}

    async def _zones(self, walk: Walk, fabric: Fabric, endpoints: list[EndpointView]) -> list[_Zone]:
        zones: dict[str, _Zone] = {}
        for zone in await walk.members(fabric.zones, Zone):
            self._add_zone(zones, zone)
        listed = set(zones)
        # Endpoints may list zones the collection does not: take those too. A zone the collection
        # lists says itself which endpoints it holds (an endpoint's links may be stale).
        for view in endpoints:
            for uri in view.endpoint.links.zones or ():
                if uri in listed:
                    continue
                if uri not in zones:
                    self._add_zone(zones, await walk.read(uri, Zone))
                if uri in zones:
                    zones[uri].endpoints.add(view.uri)
        return list(zones.values())

    @staticmethod
    def _add_zone(zones: dict[str, _Zone], zone: Zone | None) -> None:
        uri = zone.uri if zone else None
        if zone is None or uri is None or zone.zone_type not in _BINDING_ZONE_TYPES:
            return
        zones[uri] = _Zone.of(uri, zone)

    async def _zones_collection(self, walk: Walk) -> str | None:
        if self._zones_uri:
            return self._zones_uri
        fabric = await walk.read(self.fabric_uri, Fabric)
        return fabric.zones if fabric else None

    async def _candidates(
        self, walk: Walk, uri: str | None, linked: Sequence[str]
    ) -> tuple[list[str], frozenset[str], dict[str, JSON] | None]:
        """The zones to read to learn which hold the endpoint at ``uri``, which links the zones
        ``linked`` (:func:`authoritative_members`): when the service expanded the collection, only
        those whose members hold it; and every zone as the shared read gave it
        (:meth:`ZoneReads.current`), None without one."""
        collection = await self._zones_collection(walk)
        current = await self.reads.current(walk, collection)
        if current is not None:
            linked_only = frozenset(u for u in dict.fromkeys(linked) if u not in current)
            held = [u for u, body in current.items() if uri in self.reads.view(u, body)[2]]
            return [*held, *linked_only], linked_only, current
        uris, linked_only = await authoritative_members(walk, collection, linked)
        if walk.expand:
            # The members came inline: pick the zones that hold the endpoint from the JSON as
            # read, and validate only those (a zone per host holds every device bound to it, so
            # validating all of them cost in proportion to the bindings of the whole fabric).
            listed = [u for u in uris if u not in linked_only]
            bodies = await asyncio.gather(*(walk.get(u) for u in listed))
            holding = {u for u, body in zip(listed, bodies, strict=True) if uri and _links_to(body, uri)}
            uris = [u for u in uris if u in holding or u in linked_only]
        return uris, linked_only, None

    async def _fresh_zones_of(self, walk: Walk, endpoint: Endpoint) -> list[_Zone]:
        """Zones that contain ``endpoint``, read now."""
        zones: dict[str, _Zone] = {}
        uris, linked_only, _ = await self._candidates(walk, endpoint.uri, endpoint.links.zones or ())
        for read in await walk.read_all(uris, Zone):
            self._add_zone(zones, read)
        uri = endpoint.uri
        found = []
        for zone in zones.values():
            if zone.uri in linked_only and uri:
                zone.endpoints.add(uri)
            if uri in zone.endpoints:
                found.append(zone)
        return found

    async def _zones_with_etags(
        self, endpoint: JSON
    ) -> tuple[list[tuple[_Zone, str | None]], frozenset[str], dict[str, JSON] | None]:
        """Zones that contain ``endpoint`` (its JSON as just read), read now from the fabric's
        Zones collection (and the endpoint's links), each with its ETag; the zones only the links
        name; every zone as the shared read gave it (None without one)."""
        # only its URI and linked zones: validating it whole was a third of a binding read's CPU
        uri, links = odata_id(endpoint), endpoint.get("Links")
        linked = EndpointLinks.model_validate(links).zones if isinstance(links, dict) else None
        walk = self.fresh_walk()
        uris, linked_only, listed = await self._candidates(walk, uri, linked or ())
        found = []
        read = await asyncio.gather(*(self._with_etag(walk, u, u in linked_only, listed) for u in uris))
        for u, (body, etag) in zip(uris, read, strict=True):
            zones: dict[str, _Zone] = {}
            # a zone as the shared read gave it is validated once per version read, not per caller
            shared = body is not None and listed is not None and listed.get(u) is body
            self._add_zone(zones, self.reads.view(u, body)[1] if shared and body else Zone.of(body))
            for zone in zones.values():
                if zone.uri in linked_only and uri:
                    zone.endpoints.add(uri)
                if uri in zone.endpoints:
                    found.append((zone, etag))
        return found, linked_only, listed

    async def _with_etag(
        self, walk: Walk, uri: str, linked_only: bool, listed: Mapping[str, JSON] | None
    ) -> tuple[JSON | None, str | None]:
        """A zone and its ETag: from the expanded collection the walk just read (or the shared
        read ``listed``, its JSON itself: its view is validated once per version) when the member
        carries ``@odata.etag`` (DSP0266 "ETags": the same value as the resource's ETag header),
        else from a GET of the zone. A wrong tag only makes the service refuse the change (412),
        and the change is then read again."""
        if walk.expand and not linked_only:
            body = listed[uri] if listed is not None and uri in listed else await walk.get(uri)
            etag = body.get("@odata.etag") if body is not None else None
            if isinstance(etag, str):
                return body, etag
        response = await get_or_none(self.client, uri)
        return (response.body, response.etag) if response is not None else (None, None)

    async def _snapshot(self, device: DeviceRecord, hosts: Sequence[HostRecord] = ()) -> _Snapshot | None:
        # our changes to the hosts' zones before the reads: one after them makes the reads stale
        own = {h.id: (u, self.turns.changes(u)) for h in hosts if (u := self._host_zones.get(h.id))}
        endpoint = await get_or_none(self.client, str(device.endpoint))
        if endpoint is None:
            self._snapshots.pop(device.key, None)
            return None
        holding, linked_only, listed = await self._zones_with_etags(endpoint.body)
        if listed is not None:
            self.own_zones.keep(own, listed, self.reads)
        zones = [(zone, etag, self.turns.changes(zone.uri)) for zone, etag in holding]
        snapshot = _Snapshot(time.monotonic(), endpoint, zones, linked_only)
        self._snapshots[device.key] = snapshot
        return snapshot

    def _take_snapshot(self, device: DeviceRecord) -> _Snapshot | None:
        """The read that came right before this action, if there was one (each is used once)."""
        snapshot = self._snapshots.pop(device.key, None)
        if snapshot is None or time.monotonic() - snapshot.at > _SNAPSHOT_SECONDS:
            return None
        return snapshot

    async def read_binding(self, device: DeviceRecord, hosts: Sequence[HostRecord] = ()) -> tuple[str, ...]:
        snapshot = await self._snapshot(device, hosts)
        if snapshot is None:
            return ()
        walk = self.fresh_walk()
        bound: set[str] = set()
        for zone, _etag, _seen in snapshot.zones:
            bound |= await self.roles.hosts_of(walk, zone)
        return tuple(sorted(bound))

    async def witnessed(self, device: DeviceRecord, host: HostRecord) -> bool:
        """Whether the Zones collection lists the zone ``uri`` and that zone, read now, binds
        ``device`` to ``host``.

        Why this is as authoritative as reading every zone: :meth:`read_binding` counts ``host``
        as bound exactly when some zone of type ZoneOfEndpoints holds the device's endpoint and
        an initiator of ``host``. Here the fabric's Zones collection is read after the change
        (its member links: which zones exist), and the zone the bind added the device to (or
        created) is read after the change too; when the collection lists that zone and the
        zone's own ``Links.Endpoints`` hold both endpoints, such a zone exists, so the full read
        would say the same. The endpoint's ``Links.Zones`` play no part (some services leave them
        stale). Only the absence of a binding needs every zone: an unbind, and a bind without
        such a zone, are confirmed by :meth:`read_binding` as before."""
        uri = self.bind_changed.get(device.key)
        if uri is None:
            return False
        walk = self.fresh_walk()
        current = await self.reads.current(walk, await self._zones_collection(walk))
        zones: dict[str, _Zone] = {}
        if current is not None:
            # the zones read now (:mod:`.zone_reads`): the bind's zone is there iff the collection lists it
            body = current.get(uri)
            self._add_zone(zones, self.reads.view(uri, body)[1] if body is not None else None)
        else:
            walk = Walk(self.client)  # without $expand: the member links, not every zone inline
            listed, fresh = await asyncio.gather(
                walk.member_uris(await self._zones_collection(walk)), get_or_none(self.client, uri)
            )
            if fresh is None or uri not in listed:
                return False
            self._add_zone(zones, Zone.of(fresh.body))
        zone = zones.get(uri)
        return (
            zone is not None
            and str(device.endpoint) in zone.endpoints
            and host.id in await self.roles.hosts_of(walk, zone)
        )

    async def _is_own_zone(self, walk: Walk, zone: _Zone, host: HostRecord) -> bool:
        return (
            zone.zone.zone_type in _BINDING_ZONE_TYPES
            and zone.action("Zone.AddEndpoint") is not None
            and await self.roles.hosts_of(walk, zone) == {host.id}
        )

    async def prepare_bind(self, device: DeviceRecord, host: HostRecord) -> None:
        if self.select:
            return  # the read of the binding lists the host's zone with its ETag (_HostZoneActions.keep)
        known = self._host_zones.get(host.id)
        if known is None or self.turns.lock(known).locked():
            return  # another action of ours is on the zone: the bind reads it after that one
        seen = self.turns.changes(known)
        fresh = await get_or_none(self.client, known)
        if fresh is not None:
            zone = _Zone.of(known, Zone.model_validate(fresh.body))
            self.own_zones.remember(host.id, zone, fresh.etag, seen)

    async def _own_zone(self, walk: Walk, host: HostRecord) -> tuple[_Zone, str | None] | None:
        """The host's own zone with AddEndpoint, read now (with its ETag); None when it has none.
        The last read of it (:class:`_HostZoneRead`) counts as now unless one of our actions
        changed the zone since."""
        last = self.own_zones.last(host.id)
        if last is not None and await self._is_own_zone(walk, last.zone, host):
            return last.zone, last.etag
        known = self._host_zones.get(host.id)
        if known is not None:
            seen = self.turns.changes(known)
            fresh = await get_or_none(self.client, known)
            if fresh is not None:
                zone = _Zone.of(known, Zone.model_validate(fresh.body))
                if await self._is_own_zone(walk, zone, host):
                    self.own_zones.remember(host.id, zone, fresh.etag, seen)
                    return zone, fresh.etag
            self._host_zones.pop(host.id, None)
        for initiator_uri in self.initiators_of(host):  # not known (or changed): look for one
            initiator = await walk.read(initiator_uri, Endpoint) or Endpoint()
            for zone in await self._fresh_zones_of(walk, initiator):
                if await self._is_own_zone(walk, zone, host):
                    fresh = await self.client.get(zone.uri)
                    self._host_zones[host.id] = zone.uri
                    return _Zone(zone.uri, Zone.model_validate(fresh.body), zone.endpoints), fresh.etag
        return None

    async def bind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        initiators = self.initiators_of(host)
        walk = self.fresh_walk()
        snapshot = self._take_snapshot(device)
        async with self.turns.lock(self._host_zones.get(host.id)):
            if snapshot is not None:
                target, own = snapshot.endpoint, await self._own_zone(walk, host)
            else:
                target, own = await asyncio.gather(
                    self.client.get(str(device.endpoint)), self._own_zone(walk, host)
                )
            ctx.fence()
            if own is not None:
                own, response = await self.own_zones.add_endpoint(
                    device, target.etag, own, functools.partial(self._own_zone, walk, host)
                )
            else:
                fabric = await walk.read(self.fabric_uri, Fabric)
                collection = fabric.zones if fabric else None
                if not collection:
                    raise BindFailed(
                        f"fabric {self.fabric_id} has no Zones collection to bind {device.name} with"
                    )
                response = await self.client.post(
                    collection,
                    {
                        "Name": f"{ZONE_NAME_PREFIX}{device.name} on {host.id}",
                        "Description": f"{device.name} bound to {host.id} by fabric-dra",
                        "ZoneType": "ZoneOfEndpoints",
                        "Links": {"Endpoints": self._link_list([initiators[0], str(device.endpoint)])},
                    },
                )
                created = odata_id(response.body) if response.status == 201 else None
                if created:
                    self.bind_changed[device.key] = created
                else:
                    self.bind_changed.pop(device.key, None)
        try:
            await self._finish(response, ctx)
        finally:
            if own is not None:  # a task changes the zone when it ends, after the answer above
                self.turns.changed(own[0].uri)

    async def unbind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        walk = self.fresh_walk()
        snapshot = self._take_snapshot(device) or await self._snapshot(device)
        if snapshot is None:
            return  # the endpoint is gone: nothing is bound
        self._snapshots.pop(device.key, None)
        target_etag = snapshot.endpoint.etag
        for zone, zone_etag, seen in snapshot.zones:
            if host.id not in await self.roles.hosts_of(walk, zone):
                continue
            async with self.turns.lock(zone.uri):
                if self.turns.changes(zone.uri) != seen:
                    # One of our own actions changed the zone since the read: its ETag is stale.
                    fresh = await get_or_none(self.client, zone.uri)
                    if fresh is None:
                        continue  # the zone is gone, and the binding with it
                    zone = _Zone.of(zone.uri, Zone.model_validate(fresh.body))
                    zone_etag = fresh.etag
                    if zone.uri in snapshot.linked_only:
                        zone.endpoints.add(str(device.endpoint))
                    if device.endpoint not in zone.endpoints:
                        continue
                others = [
                    uri
                    for uri in zone.endpoints
                    if uri != device.endpoint
                    and not await self.roles.host_of(walk, uri)
                    and await self.roles.is_device(walk, uri)
                ]
                remove = zone.action("Zone.RemoveEndpoint")
                if not (zone.ours and not others) and not remove and others:
                    raise BindFailed(
                        f"zone {zone.uri} also binds other devices and offers no Zone.RemoveEndpoint; "
                        f"{device.name} cannot be unbound without unbinding them"
                    )
                ctx.fence()
                try:
                    if remove and not (zone.ours and not others):
                        response = await self.client.post(
                            remove, _endpoint_action(device, target_etag, zone_etag)
                        )
                    else:  # our own zone for this binding alone, or a zone without RemoveEndpoint
                        response = await self.client.delete(zone.uri, etag=zone_etag)
                finally:
                    self.turns.changed(zone.uri)
            try:
                await self._finish(response, ctx)
            finally:
                self.turns.changed(zone.uri)


def _links_to(zone: JSON | None, endpoint: str) -> bool:
    """Whether a zone's JSON names ``endpoint`` in its ``Links.Endpoints`` (as :class:`Zone`
    reads them)."""
    links = zone.get("Links") if zone is not None else None
    members = links.get("Endpoints") if isinstance(links, dict) else None
    if isinstance(members, list):
        return any(odata_id(m) == endpoint for m in members)
    return odata_id(members) == endpoint


def _endpoint_action(device: DeviceRecord, endpoint_etag: str | None, zone_etag: str | None) -> JSON:
    """The body of ``#Zone.AddEndpoint`` / ``#Zone.RemoveEndpoint`` for ``device``'s endpoint, with
    the ETags read before it (Zone 1.5) so the service refuses with 412 if either changed since."""
    body: JSON = {"Endpoint": {"@odata.id": device.endpoint}}
    if endpoint_etag:
        body["EndpointETag"] = endpoint_etag
    if zone_etag:
        body["ZoneETag"] = zone_etag
    return body


def bound_over(backend: ZoneBackend, current: Mapping[str, JSON]) -> dict[str, tuple[str, ...]]:
    """Target → the hosts it is bound to, from the shared zone reads ``current`` (:class:`_BoundMemo`)."""
    memo, generation = backend._bound, backend.roles.generation
    if memo is None or memo.key[0] is not backend._targets or memo.key[1] != generation:
        memo = backend._bound = _BoundMemo.for_targets(backend._targets, generation)
    return memo.update(current, backend.reads, backend.roles.initiator_hosts)
