"""CXL memory binding through fabric Connections.

The unit of binding is a memory chunk (MemoryChunks schema) behind a target endpoint. A chunk is
bound to a host while a Connection (Connection schema 1.4, ``ConnectionType`` ``Memory``) lists it in
``MemoryChunkInfo`` with one of the host's initiator endpoints in ``Links.InitiatorEndpoints``.
Binding POSTs such a Connection to the fabric's Connections collection; unbinding DELETEs it with
``If-Match``. A Connection that also carries chunks fabric-dra did not ask for is never deleted.

Connections are found through the collection *and* the endpoints' ``Links.Connections``: DMTF's
public-cxl mockup lists Connection 14 only from endpoint T4, not from its collection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
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
from fabric.backends.carving import MemoryCarver, share_of_marker
from fabric.backends.describe import describe
from fabric.backends.views import (
    Connection,
    CXLLogicalDevice,
    Endpoint,
    Fabric,
    MemoryChunks,
    MemoryDomain,
    Zone,
    odata_id,
)
from fabric.backends.walk import Walk, path_ids
from fabric.redfish.client import RedfishResponse
from fabric.state.model import DeviceRecord, HostRecord, MemoryDomainRecord
from manager_api.devices import BindingStyle, DeviceType
from manager_api.errors import BindFailed

__all__ = ["ConnectionBackend"]

_MIB = 1 << 20


class ConnectionBackend(Backend):
    style = BindingStyle.CONNECTION
    authority = "Connections collection and its connections"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._initiator_hosts: dict[str, str] = {}
        #: (chunk, endpoint) of every device found by the last discover
        self._devices: list[tuple[str, str]] = []
        #: connections only endpoints link to (public-cxl's Connection 14)
        self._unlisted: list[str] = []
        #: device key → the connection its last bind created (:meth:`witnessed` reads it)
        self.bind_changed: dict[str, str] = {}
        #: shares of the fabric's memory pools: chunks made and connected on demand
        self.carver = MemoryCarver(self)

    async def discover(self, walk: Walk, hosts: Mapping[str, HostRecord]) -> DiscoveryResult:
        fabric = await walk.read(self.fabric_uri, Fabric)
        if fabric is None:
            return DiscoveryResult()
        self.expand = walk.expand
        endpoints = await read_endpoints(walk, fabric)
        connections = await walk.members(fabric.connections, Connection)
        listed = {c.uri for c in connections}
        extra = [u for view in endpoints for u in view.endpoint.links.connections or () if u not in listed]
        self._unlisted = list(dict.fromkeys(extra))
        connections.extend(await walk.read_all(extra, Connection))
        endpoints += await linked_initiators(
            walk, endpoints, (u for c in connections for u in c.links.initiator_endpoints)
        )
        result = host_initiators(endpoints, hosts)
        self._initiator_hosts = {uri: host for host, uris in result.initiators.items() for uri in uris}
        await self.learn_initiators(walk, connections)
        self._devices = []
        for view in endpoints:
            if not view.is_target:
                continue
            pools = await self._pools(walk, view, result.hosts)
            result.devices.extend(pools)
            made = {u for p in pools if p.memory_domain for u in p.memory_domain.made}
            whole = [c for c in view.chunks if c not in made]
            for chunk_uri in whole:
                self._devices.append((chunk_uri, view.uri))
                chunk = await walk.read(chunk_uri, MemoryChunks)
                if chunk is None:
                    continue
                attributes = await describe(walk, view.entities, endpoint=view.endpoint, chunk=chunk)
                bound = {
                    host
                    for connection in connections
                    if self._carries(connection, chunk_uri, view.uri)
                    for host in self.hosts_of(connection)
                }
                result.devices.append(
                    DeviceRecord(
                        key=chunk_uri,
                        resource_id=_chunk_name(view.id, chunk_uri, whole),
                        fabric=self.fabric_id,
                        style=self.style,
                        attributes=attributes,
                        bound_hosts=tuple(sorted(bound)),
                        reachable_hosts=result.hosts,
                        endpoint=view.uri,
                        chunk=chunk_uri,
                    )
                )
        return result

    async def _pools(self, walk: Walk, view: EndpointView, hosts: tuple[str, ...]) -> list[DeviceRecord]:
        """One pool device per MemoryDomain of a memory target's (CXL Type-3) logical devices that
        allows chunk creation (``<endpoint>-pool``); the chunks fabric-dra made there are its shares, never
        whole devices, and the others are carved outside it (offered whole, as before)."""
        logical = [uri for kind, uri in view.entities if kind == "CXLDevice"]
        domains: list[str] = []
        for device in await walk.read_all(logical, CXLLogicalDevice):
            domains.extend(device.links.memory_domains)
        # The pool is its endpoint and CXL device, never one of its chunks: a share's chunk being
        # released shows Disabled while it is sanitized, which says nothing of the pool.
        device_parts = [(kind, uri) for kind, uri in view.entities if kind != "MemoryChunk"]
        pools: list[DeviceRecord] = []
        for domain in await walk.read_all(list(dict.fromkeys(domains)), MemoryDomain):
            if domain.allows_memory_chunk_creation is not True or not domain.uri or not domain.memory_chunks:
                continue
            size, least = domain.memory_size_mib, domain.min_memory_chunk_size_mib
            if not size or not least:
                continue
            step = domain.memory_chunk_increment_mib or least
            chunks = await walk.members(domain.memory_chunks, MemoryChunks)
            made = tuple(str(c.uri) for c in chunks if c.uri and share_of_marker(c.name))
            outside = sum(int(c.memory_chunk_size_mib or 0) for c in chunks if str(c.uri) not in made)
            record = MemoryDomainRecord(
                uri=domain.uri,
                chunks=domain.memory_chunks,
                size_bytes=int(size) * _MIB,
                min_chunk_bytes=int(least) * _MIB,
                increment_bytes=int(step) * _MIB,
                outside_bytes=outside * _MIB,
                made=made,
            )
            attributes = await describe(walk, device_parts, endpoint=view.endpoint)
            if attributes.type is not DeviceType.CXL_MEMORY:
                # A Type-2 accelerator's own memory (DMTF's public-cxl PooledCXLType2 GPU allows chunk
                # creation in its HBM domain) serves that accelerator: a host borrowing it by the GiB
                # is no CXL memory pool, and its device type would offer it to GPU claims.
                continue
            name = view.id if len(domains) == 1 else f"{view.id}-{domain.id}"
            pools.append(
                DeviceRecord(
                    key=domain.uri,
                    resource_id=f"{name}-pool",
                    fabric=self.fabric_id,
                    style=self.style,
                    attributes=attributes.model_copy(update={"memory_bytes": record.size_bytes}),
                    reachable_hosts=hosts,
                    endpoint=view.uri,
                    memory_domain=record,
                )
            )
        return pools

    async def read_bindings(self, walk: Walk) -> dict[str, tuple[str, ...]]:
        fabric = await walk.read(self.fabric_uri, Fabric)
        connections = await walk.members(fabric.connections if fabric else None, Connection)
        listed = {c.uri for c in connections}
        connections.extend(await walk.read_all((u for u in self._unlisted if u not in listed), Connection))
        await self.learn_initiators(walk, connections)
        return {
            chunk: tuple(
                sorted(
                    {h for c in connections if self._carries(c, chunk, endpoint) for h in self.hosts_of(c)}
                )
            )
            for chunk, endpoint in self._devices
        }

    @staticmethod
    def _carries(connection: Connection, chunk: str, endpoint: str) -> bool:
        chunks = connection.chunks
        if chunks:
            return chunk in chunks
        # A memory connection without MemoryChunkInfo grants the whole target endpoint.
        return endpoint in connection.links.target_endpoints

    def hosts_of(self, connection: Connection) -> set[str]:
        hosts = set()
        for uri in connection.links.initiator_endpoints:
            host = self._initiator_hosts.get(uri)
            if host:
                hosts.add(host)
        return hosts

    async def learn_initiators(self, walk: Walk, connections: list[Connection]) -> None:
        """Initiators a connection names but the Endpoints collection does not list (public-cxl's I4)."""
        for connection in connections:
            for uri in connection.links.initiator_endpoints:
                if uri not in self._initiator_hosts:
                    view = classify_endpoint(await walk.read(uri, Endpoint))
                    if view is not None and view.host:
                        self._initiator_hosts[uri] = view.host

    async def _fresh_connections(self, walk: Walk, device: DeviceRecord) -> list[Connection]:
        """The connections that carry ``device`` now, read from the fabric's Connections
        collection (:func:`authoritative_members`) and the ones only endpoints link to."""
        endpoint = await walk.read(device.endpoint, Endpoint)
        linked = (endpoint.links.connections or ()) if endpoint else ()
        fabric = await walk.read(self.fabric_uri, Fabric)
        uris, _ = await authoritative_members(
            walk, fabric.connections if fabric else None, [*linked, *self._unlisted]
        )
        connections = await walk.read_all(uris, Connection)
        await self.learn_initiators(walk, connections)
        return [c for c in connections if self._carries(c, str(device.chunk), str(device.endpoint))]

    async def read_binding(self, device: DeviceRecord, hosts: Sequence[HostRecord] = ()) -> tuple[str, ...]:
        walk = self.fresh_walk()
        bound: set[str] = set()
        for connection in await self._fresh_connections(walk, device):
            bound |= self.hosts_of(connection)
        return tuple(sorted(bound))

    async def witnessed(self, device: DeviceRecord, host: HostRecord) -> bool:
        """Whether the connection ``uri`` the bind created, listed in the fabric's Connections
        collection and read now, carries the device to an initiator of ``host``:
        :meth:`read_binding` counts ``host`` as bound exactly when such a connection exists, so
        one found is the full read's answer without reading every connection (their number grows
        with the bindings). Endpoint links play no part."""
        uri = self.bind_changed.get(device.key)
        if uri is None:
            return False
        walk = Walk(self.client)  # without $expand: the member links, not every connection inline
        fabric = await walk.read(self.fabric_uri, Fabric)
        listed, connection = await asyncio.gather(
            walk.member_uris(fabric.connections if fabric else None), walk.read(uri, Connection)
        )
        if connection is None or uri not in listed:
            return False
        await self.learn_initiators(walk, [connection])
        return self._carries(
            connection, str(device.chunk), str(device.endpoint)
        ) and host.id in self.hosts_of(connection)

    async def bind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        await self.post_connection(
            device, str(device.chunk), host, ctx, name=f"fabric-dra {device.name} on {host.id}"
        )

    async def follow_change(self, response: RedfishResponse, ctx: BindContext) -> RedfishResponse:
        """Follow a change's answer (a task to its end) as every bind does."""
        return await self._finish(response, ctx)

    async def post_connection(
        self, device: DeviceRecord, chunk: str, host: HostRecord, ctx: BindContext, *, name: str
    ) -> str | None:
        """POST the memory Connection of ``chunk`` (behind ``device``'s endpoint) to ``host``; the
        Connection's URI when the service answered 201 with it."""
        initiators = self.initiators_of(host)
        walk = self.fresh_walk()
        fabric = await walk.read(self.fabric_uri, Fabric)
        collection = fabric.connections if fabric else None
        if not collection:
            raise BindFailed(
                f"fabric {self.fabric_id} has no Connections collection to bind {device.name} with"
            )
        initiator = await self._initiator_for(walk, fabric, device, initiators)
        ctx.fence()
        response = await self.client.post(
            collection,
            {
                "Name": name,
                "ConnectionType": "Memory",
                "MemoryChunkInfo": [
                    {"AccessCapabilities": ["Read", "Write"], "MemoryChunk": {"@odata.id": chunk}}
                ],
                "Links": {
                    "InitiatorEndpoints": self._link_list([initiator]),
                    "TargetEndpoints": self._link_list([str(device.endpoint)]),
                },
            },
        )
        created = odata_id(response.body) if response.status == 201 else None
        created = created or (response.location if response.status == 201 else None)
        if created and device.memory_domain is None:
            self.bind_changed[device.key] = created
        else:
            self.bind_changed.pop(device.key, None)
        await self._finish(response, ctx)
        return created

    async def _initiator_for(
        self, walk: Walk, fabric: Fabric | None, device: DeviceRecord, initiators: tuple[str, ...]
    ) -> str:
        """The host initiator a zone of the fabric connects to the device's target endpoint
        (public-cxl: T5 shares zone 3 with I3, not with the host's first initiator I1); the
        first one when no zone says."""
        endpoint = await walk.read(device.endpoint, Endpoint)
        uris, _ = await authoritative_members(
            walk, fabric.zones if fabric else None, (endpoint.links.zones or ()) if endpoint else ()
        )
        for zone in await walk.read_all(uris, Zone):
            members = zone.links.endpoints
            if device.endpoint in members:
                for initiator in initiators:
                    if initiator in members:
                        return initiator
        return initiators[0]

    async def unbind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        walk = self.fresh_walk()
        for connection in await self._fresh_connections(walk, device):
            if host.id not in self.hosts_of(connection):
                continue
            uri = str(connection.uri)
            others = [c for c in connection.chunks if c != device.chunk]
            if others:
                raise BindFailed(
                    f"connection {uri} also carries {len(others)} other memory chunk(s); "
                    f"{device.name} cannot be unbound without unbinding them"
                )
            fresh = await self.client.get(uri)
            ctx.fence()
            response = await self.client.delete(uri, etag=fresh.etag)
            await self._finish(response, ctx)


def _chunk_name(endpoint_id: str, chunk_uri: str, chunks: list[str]) -> str:
    """The Id a chunk's device name comes from: the endpoint's when it has one chunk (public-cxl's
    ``T3``), else ``<endpoint>-chunk<n>`` (with the memory domain when there are several)."""
    if len(chunks) == 1:
        return endpoint_id
    chunk = chunk_uri.rstrip("/").rsplit("/", 1)[-1]
    domains = {path_ids(c, "MemoryDomains") for c in chunks}
    domain = path_ids(chunk_uri, "MemoryDomains")
    if len(domains) > 1 and domain:
        return f"{endpoint_id}-{domain}-chunk{chunk}"
    return f"{endpoint_id}-chunk{chunk}"
