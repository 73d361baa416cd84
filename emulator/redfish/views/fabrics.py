"""``/redfish/v1/Fabrics``: switches, ports, endpoints, zones (PCIe) and connections (CXL).

Binding styles served here:

* PCIe zones of endpoints. Each host has its own zone (``Zones/{host}``: the host's initiator
  endpoint plus the targets bound to it), which offers ``#Zone.AddEndpoint`` and
  ``#Zone.RemoveEndpoint`` (Zone v1_5). A client may also POST a zone holding one host
  initiator and target endpoints; DELETE of such a zone unbinds its targets.
* CXL memory connections: POST a ``Connection`` with ``MemoryChunkInfo`` and one host initiator
  (Connection v1_1 ``MemoryChunkInfo``); DELETE of the connection unbinds its chunks.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from typing import Literal

from pydantic import Field

from emulator.redfish.engine.operation import Operation
from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.resources import (
    ConnectedEntity,
    Connection,
    ConnectionLinks,
    Endpoint,
    EndpointLinks,
    Fabric,
    FabricLinks,
    Identifier,
    MemoryChunkInfo,
    PCIeErrorCounts,
    Port,
    PortLinks,
    PortMetrics,
    Ref,
    Status,
    Switch,
    SwitchLinks,
    Zone,
    ZoneLinks,
    ref,
    refs,
)
from emulator.redfish.model.state import ClientRecord, OperationKind, id_order
from emulator.redfish.tree.http import Reply, Request, parse_body
from emulator.redfish.tree.nodes import CollectionNode, Context, Node, actions, collection_of, not_allowed
from emulator.redfish.views.common import (
    Body,
    DeviceNode,
    LinkIn,
    check_reachable,
    entity_type,
    named,
    parameter_error,
    pci_id,
    primary_uri,
    resolve_endpoint,
)
from emulator.redfish.views.outcome import reply_for
from emulator.topology import FABRIC_CXL, FABRIC_PCIE, Device, SwitchInfo
from manager_api.devices import BindingStyle, DeviceType

__all__ = ["fabrics_node"]

#: Zones a client may create; each binds at least a host, so more means a leak on the client side.
MAX_CLIENT_ZONES = 4096

#: PCIe lane rate in GT/s by generation, for a port's CurrentSpeedGbps (128b/130b from Gen3 on)
_GT_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def _lane_gbps(generation: int) -> float:
    encoding = 0.8 if generation <= 2 else 128 / 130
    return _GT_PER_LANE[generation] * encoding


def fabrics_node(ctx: Context) -> CollectionNode:
    fabrics = {f: functools.partial(FabricNode, ctx, f) for f in ctx.index.fabrics()}
    return collection_of(ctx, f"{uris.ROOT}/Fabrics", "FabricCollection", "Fabrics", fabrics)


class FabricNode(Node):
    def __init__(self, ctx: Context, fabric_id: str) -> None:
        super().__init__(ctx, uris.fabric(fabric_id))
        self.fabric_id = fabric_id

    def render(self) -> Fabric:
        pcie = self.fabric_id == FABRIC_PCIE
        return Fabric(
            odata_id=self.uri,
            Id=self.fabric_id,
            Name=f"{self.fabric_id} fabric",
            Description="PCIe switch fabric of pooled devices" if pcie else "CXL fabric of pooled memory",
            FabricType=self.fabric_id,
            Status=Status(),
            Switches=ref(f"{self.uri}/Switches"),
            Endpoints=ref(f"{self.uri}/Endpoints"),
            Zones=ref(f"{self.uri}/Zones") if pcie else None,
            Connections=ref(f"{self.uri}/Connections") if not pcie else None,
            Links=FabricLinks(ManagedBy=[ref(uris.MANAGER)]),
        )

    def host_ids(self) -> list[str]:
        return list(self.ctx.index.fabric_hosts(self.fabric_id))

    def child(self, segment: str) -> Node | None:
        ctx, fabric = self.ctx, self.fabric_id
        if segment == "Switches":

            def switch(s: str) -> Node | None:
                # a lookup, not a map of every switch: each port of an expanded Ports collection
                # is resolved from the root, and a map of 632 switches made for each of them was
                # most of what an expanded Ports answer cost at 10,100 devices
                info = ctx.index.switches.get(s)
                return SwitchNode(ctx, info) if info is not None and info.fabric == fabric else None

            return CollectionNode(
                ctx,
                f"{self.uri}/Switches",
                "SwitchCollection",
                f"{fabric} switches",
                lambda: [s.id for s in ctx.index.fabric_switches(fabric)],
                switch,
            )
        if segment == "Endpoints":
            hosts = self.host_ids()
            # behaviour.initiators "links-only": host endpoints exist, but only zones and
            # connections link to them; the collection lists the targets alone
            listed = hosts if ctx.index.topology.behaviour.initiators == "collection" else []

            def endpoint(e: str) -> Node | None:
                # a lookup, not a scan of the fabric's devices: every endpoint GET comes here
                if e in hosts:
                    return HostEndpointNode(ctx, fabric, e, self)
                device = ctx.index.devices.get(e)
                return DeviceEndpointNode(ctx, device) if device and device.fabric == fabric else None

            return CollectionNode(
                ctx,
                f"{self.uri}/Endpoints",
                "EndpointCollection",
                f"{fabric} endpoints",
                lambda: listed + [d.id for d in ctx.index.fabric_devices(fabric)],
                endpoint,
            )
        if segment == "Zones" and fabric == FABRIC_PCIE:
            return ZonesNode(ctx, self)
        if segment == "Connections" and fabric == FABRIC_CXL:
            return ConnectionsNode(ctx, self)
        return None


class SwitchNode(Node):
    def __init__(self, ctx: Context, switch: SwitchInfo) -> None:
        super().__init__(ctx, uris.switch(switch.fabric, switch.id))
        self.switch = switch

    def _ports(self) -> dict[str, tuple[str, str | None, Device | None]]:
        """Port Id → (PortType, host, device): Port v1_0_0 ``PortType`` UpstreamPort (to a host),
        DownstreamPort (to a device), InterswitchPort (to another switch: neither)."""
        ports: dict[str, tuple[str, str | None, Device | None]] = {
            p: ("UpstreamPort", h, None) for h, p in self.switch.upstream_ports.items()
        }
        for device_id in self.switch.devices:
            device = self.ctx.index.devices[device_id]
            ports[device.port] = ("DownstreamPort", None, device)
        for port in self.switch.interswitch_ports:
            ports[port] = ("InterswitchPort", None, None)
        return ports

    def render(self) -> Switch:
        sw = self.switch
        return Switch(
            odata_id=self.uri,
            Id=sw.id,
            Name=f"{sw.fabric} switch {sw.id}",
            SwitchType=sw.fabric,
            Manufacturer=sw.manufacturer,
            Model=sw.model,
            Status=Status(),
            Ports=ref(f"{self.uri}/Ports"),
            Links=SwitchLinks(Chassis=ref(uris.chassis(sw.id)), ManagedBy=[ref(uris.MANAGER)]),
        )

    def child(self, segment: str) -> Node | None:
        if segment != "Ports":
            return None
        ports = {
            p: functools.partial(PortNode, self.ctx, self.switch, p, *at) for p, at in self._ports().items()
        }
        return collection_of(
            self.ctx, f"{self.uri}/Ports", "PortCollection", f"Ports of {self.switch.id}", ports
        )


class PortNode(Node):
    def __init__(
        self,
        ctx: Context,
        switch: SwitchInfo,
        port_id: str,
        kind: str,
        host: str | None,
        device: Device | None,
    ) -> None:
        super().__init__(ctx, uris.port(switch.fabric, switch.id, port_id))
        self.switch, self.port_id, self.kind, self.host, self.device = switch, port_id, kind, host, device

    def fingerprint(self) -> Hashable:
        """All a port's rendering depends on besides the topology: whether its link is up (a
        host's port: PortDown; a cable to a switch: LinkRemoved). A device's port has nothing
        else. An expanded ``Ports`` (116 ports a switch at fleet scale) is then checked, not
        rendered, when the fabric changed elsewhere."""
        if self.kind == "InterswitchPort":
            return (self.switch.id, self.port_id) not in self.ctx.engine.conditions.cut_links()
        if self.device is None and self.host is not None:
            return self.ctx.engine.conditions.port_up(self.switch.id, self.host)
        return ()

    def render(self) -> Port:
        if self.kind == "InterswitchPort":
            return self._render_interswitch()
        fabric = self.switch.fabric
        if self.device is not None:
            generation, width = self.device.model.pcie_generation, self.device.model.pcie_width
            endpoint = uris.endpoint(fabric, self.device.id)
            up = True
            health = "OK"
        else:
            if self.host is None:
                raise RedfishError.of(500, "InternalError")
            generation, width = 5, 16
            endpoint = uris.endpoint(fabric, self.host)
            up = self.ctx.engine.conditions.port_up(self.switch.id, self.host)
            health = "OK" if up else "Critical"
        return Port(
            odata_id=self.uri,
            Id=self.port_id,
            Name=f"{self.switch.id} port {self.port_id}",
            Description=f"to host {self.host}"
            if self.host
            else f"to device {self.device.id if self.device else ''}",
            PortId=self.port_id,
            PortProtocol=fabric,
            PortType=self.kind,
            CurrentSpeedGbps=round(_lane_gbps(generation) * width, 1) if up else 0,
            Width=width,
            LinkStatus="LinkUp" if up else "LinkDown",
            Status=Status(Health=health),
            Metrics=ref(f"{self.uri}/Metrics") if self.device is not None else None,
            Links=PortLinks(AssociatedEndpoints=[ref(endpoint)]),
        )

    def _render_interswitch(self) -> Port:
        """A cable to another switch: ``Links.ConnectedSwitches`` and ``ConnectedSwitchPorts``
        (Port v1_0_0 Links: "the switches / switch ports at the other end of the link") name its
        peer, as long as a link is detected; a pulled cable (a LinkRemoved fault) is ``NoLink``
        (Port v1_2_0 LinkStatus) with no peer, as a switch that sees nothing on the port says."""
        fabric, peer = self.switch.fabric, self.switch.interswitch_ports[self.port_id]
        linked = (self.switch.id, self.port_id) not in self.ctx.engine.conditions.cut_links()
        return Port(
            odata_id=self.uri,
            Id=self.port_id,
            Name=f"{self.switch.id} port {self.port_id}",
            Description=f"to switch {peer[0]}",
            PortId=self.port_id,
            PortProtocol=fabric,
            PortType=self.kind,
            CurrentSpeedGbps=round(_lane_gbps(5) * 16, 1) if linked else 0,
            Width=16,
            LinkStatus="LinkUp" if linked else "NoLink",
            Status=Status(Health="OK" if linked else "Critical"),
            Links=PortLinks(
                AssociatedEndpoints=[],
                ConnectedSwitches=[ref(uris.switch(fabric, peer[0]))] if linked else [],
                ConnectedSwitchPorts=[ref(uris.port(fabric, *peer))] if linked else [],
            ),
        )

    def child(self, segment: str) -> Node | None:
        if segment != "Metrics" or self.device is None:
            return None
        return PortMetricsNode(self.ctx, f"{self.uri}/Metrics", self.port_id, self.device)


class PortMetricsNode(Node):
    """A downstream port's metrics: the PCIe error counters of its link to the device (what the
    ``PCIeErrors`` faults in force on the device add up to)."""

    def __init__(self, ctx: Context, uri: str, port_id: str, device: Device) -> None:
        super().__init__(ctx, uri)
        self.port_id, self.device = port_id, device

    def fingerprint(self) -> Hashable:
        """The error counters are all that changes (the ``PCIeErrors`` faults in force)."""
        return tuple(self.ctx.engine.conditions.pcie_errors(self.device.id).values())

    def render(self) -> PortMetrics:
        counts = self.ctx.engine.conditions.pcie_errors(self.device.id)
        return PortMetrics(
            odata_id=self.uri,
            Id="Metrics",
            Name=f"Metrics of port {self.port_id}",
            PCIeErrors=PCIeErrorCounts(**counts),
        )


class HostEndpointNode(Node):
    """A host's initiator endpoint (its root port into the fabric)."""

    def __init__(self, ctx: Context, fabric_id: str, host: str, fabric: FabricNode) -> None:
        super().__init__(ctx, uris.endpoint(fabric_id, host))
        self.fabric_id, self.host, self.fabric = fabric_id, host, fabric

    def render(self) -> Endpoint:
        info = self.ctx.index.hosts[self.host]
        ports = [
            ref(uris.port(s.fabric, s.id, s.upstream_ports[self.host]))
            for s in self.ctx.index.fabric_switches(self.fabric_id)
            if self.host in s.upstream_ports
        ]
        zones: list[str] = []
        connections: list[str] = []
        if self.fabric_id == FABRIC_PCIE:
            zones = [uris.zone(self.fabric_id, self.host)]
            if _links_current(self.ctx):
                zones += [
                    uris.zone(self.fabric_id, z.id)
                    for z in self.ctx.engine.state.zones.values()
                    if z.host == self.host and z.fabric == self.fabric_id
                ]
        elif _links_current(self.ctx):
            connections = [
                uris.connection(self.fabric_id, c.id)
                for c in self.ctx.engine.state.connections.values()
                if c.host == self.host and c.fabric == self.fabric_id
            ]
        identity = [Identifier(DurableName=str(info.uuid), DurableNameFormat="UUID")]
        return Endpoint(
            odata_id=self.uri,
            Id=self.host,
            Name=f"{self.host} {self.fabric_id} initiator",
            Description=f"Host port of {self.host} into the {self.fabric_id} fabric",
            EndpointProtocol=self.fabric_id,
            Status=Status(),
            ConnectedEntities=[
                ConnectedEntity(
                    EntityType="RootComplex",
                    EntityRole="Initiator",
                    EntityLink=ref(uris.system(self.host)),
                    Identifiers=identity,
                )
            ],
            Links=_endpoint_links(self.ctx, ports, zones, connections),
        )


class DeviceEndpointNode(DeviceNode, at=lambda device: uris.endpoint(device.fabric, device.id)):
    """A pooled device's target endpoint; a CXL one lists each memory chunk as an entity."""

    def fingerprint(self) -> Hashable:
        """All an endpoint's rendering depends on besides the topology: the device's health and
        what binds it — its zone, or each memory chunk's connection (:meth:`render` reads them
        the same way) — so a bind elsewhere does not render it again."""
        dev, bindings = self.device, self.ctx.engine.bindings
        held: Hashable = None
        if dev.type == DeviceType.CXL_MEMORY:
            held = tuple(
                (chunk.id, chunk.index, record.connection if (record := bindings.binding(chunk.id)) else None)
                for chunk in self.ctx.index.chunks_of(dev)
            )
        elif (record := bindings.binding(dev.id)) is not None:
            held = record.zone
        return (self.ctx.engine.conditions.health(dev.id), held)

    def render(self) -> Endpoint:
        dev, engine = self.device, self.ctx.engine
        entities = [
            ConnectedEntity(
                EntityType=entity_type(dev),
                EntityRole="Target",
                EntityLink=ref(primary_uri(dev)),
                EntityPciId=pci_id(dev),
            )
        ]
        zones: list[str] = []
        connections: list[str] = []
        if dev.type == DeviceType.CXL_MEMORY:
            for chunk in self.ctx.index.chunks_of(dev):
                entities.append(
                    ConnectedEntity(
                        EntityType="MemoryChunk",
                        EntityRole="Target",
                        EntityLink=ref(uris.chunk(dev.id, chunk.index)),
                    )
                )
                binding = engine.bindings.binding(chunk.id) if _links_current(self.ctx) else None
                if binding is not None and binding.connection is not None:
                    uri = uris.connection(dev.fabric, binding.connection)
                    if uri not in connections:
                        connections.append(uri)
        elif _links_current(self.ctx):
            binding = engine.bindings.binding(dev.id)
            if binding is not None and binding.zone is not None:
                zones.append(uris.zone(dev.fabric, binding.zone))
        return Endpoint(
            odata_id=self.uri,
            **named(dev),
            Description=f"Target endpoint of {dev.type.value} {dev.id}",
            EndpointProtocol=dev.fabric,
            Status=self.status(),
            ConnectedEntities=entities,
            Links=_endpoint_links(
                self.ctx, [ref(uris.port(dev.fabric, dev.switch, dev.port))], zones, connections
            ),
        )


def _links_current(ctx: Context) -> bool:
    """Whether endpoints list the zones and connections made since start (``behaviour.endpointLinks``:
    a "stale" service never updates them, an "omitted" one does not send them)."""
    return ctx.index.topology.behaviour.endpoint_links == "current"


def _endpoint_links(
    ctx: Context, ports: list[Ref], zones: list[str], connections: list[str]
) -> EndpointLinks:
    if ctx.index.topology.behaviour.port_links == "omitted":
        ports = []  # behaviour.portLinks: the service does not say where an endpoint is cabled
    if ctx.index.topology.behaviour.endpoint_links == "omitted":
        return EndpointLinks(ConnectedPorts=ports, Zones=None, Connections=None)
    return EndpointLinks(ConnectedPorts=ports, Zones=refs(zones), Connections=refs(connections))


# --- PCIe zones --------------------------------------------------------------------------------


class _ZoneLinksIn(Body):
    Endpoints: list[LinkIn] = Field(min_length=1)


class _Creation(Body):
    """What the body of a POST that creates a zone or a connection may name it."""

    Name: str | None = Field(default=None, max_length=255)
    Description: str | None = Field(default=None, max_length=1024)


class _ZoneCreate(_Creation):
    ZoneType: Literal["ZoneOfEndpoints"] = "ZoneOfEndpoints"
    Links: _ZoneLinksIn


class _EndpointParams(Body):
    Endpoint: LinkIn
    EndpointETag: str | None = None
    ZoneETag: str | None = None


class _ClientCollection(CollectionNode):
    """The zones or connections of a fabric that clients create with POST, in order of creation."""

    def __init__(self, ctx: Context, fabric: FabricNode, segment: str, collection_type: str) -> None:
        self.fabric = fabric
        super().__init__(
            ctx,
            f"{fabric.uri}/{segment}",
            collection_type,
            f"{fabric.fabric_id} {segment.lower()}",
            self._ids,
            self._make,
            on_post=self._create,
        )

    def records(self) -> Mapping[str, ClientRecord]:
        raise NotImplementedError

    def record(self, ident: str) -> ClientRecord | None:
        """The client-made zone or connection ``ident`` of this fabric."""
        record = self.records().get(ident)
        return record if record is not None and record.fabric == self.fabric.fabric_id else None

    def client_ids(self) -> list[str]:
        return sorted(
            (r.id for r in self.records().values() if r.fabric == self.fabric.fabric_id), key=id_order
        )

    def _ids(self) -> list[str]:
        return self.client_ids()

    def _make(self, ident: str) -> Node | None:
        raise NotImplementedError

    async def _create(self, request: Request) -> Reply:
        raise NotImplementedError

    def creation(
        self,
        request: Request,
        body: _Creation,
        style: BindingStyle,
        host: str,
        targets: list[str],
        ident: str,
    ) -> Operation:
        """The bind that creates member ``ident`` of this collection for ``host``, answered 201 with it."""
        return Operation(
            kind=OperationKind.BIND,
            style=style,
            fabric=self.fabric.fabric_id,
            host=host,
            targets=targets,
            method="POST",
            uri=self.uri,
            body=request.text,
            name=body.Name,
            description=body.Description,
            success_status=201,
            location=f"{self.uri}/{ident}",
        )


class ZonesNode(_ClientCollection):
    def __init__(self, ctx: Context, fabric: FabricNode) -> None:
        super().__init__(ctx, fabric, "Zones", "ZoneCollection")

    def records(self) -> Mapping[str, ClientRecord]:
        return self.ctx.engine.state.zones

    def _ids(self) -> list[str]:
        return self.fabric.host_ids() + self.client_ids()

    def _make(self, ident: str) -> Node | None:
        if ident in self.fabric.host_ids():
            return ZoneNode(self.ctx, self.fabric, ident, ident, client=False)
        record = self.record(ident)
        return (
            ZoneNode(self.ctx, self.fabric, ident, record.host, client=True) if record is not None else None
        )

    async def _create(self, request: Request) -> Reply:
        body = parse_body(_ZoneCreate, request.json())
        fabric_id = self.fabric.fabric_id
        hosts: list[str] = []
        targets: list[Device] = []
        for i, link in enumerate(body.Links.Endpoints):
            host, device = resolve_endpoint(self.ctx, fabric_id, link.odata_id, f"Links/Endpoints/{i}")
            if host is not None:
                hosts.append(host)
            elif device is not None:
                if device in targets:
                    raise RedfishError.of(
                        400,
                        "PropertyValueError",
                        f"Links/Endpoints/{i}",
                        detail=f"{device.id} is listed twice in Links/Endpoints.",
                    )
                targets.append(device)
        if len(hosts) != 1:
            raise RedfishError.of(
                400,
                "PropertyValueError",
                "Links/Endpoints",
                related=["/Links/Endpoints"],
                detail=f"A zone needs exactly one host initiator endpoint; got {len(hosts)}.",
            )
        host = hosts[0]
        for device in targets:
            check_reachable(self.ctx, device, host, "Links/Endpoints")
        if len(self.client_ids()) >= MAX_CLIENT_ZONES:
            raise RedfishError.of(
                503,
                "CreateLimitReachedForResource",
                detail=f"There are {MAX_CLIENT_ZONES} client zones already; delete unused ones.",
            )
        zone_id = self.ctx.engine.state.allocate_id()
        op = self.creation(request, body, BindingStyle.ZONE, host, [d.id for d in targets], zone_id)
        op.zone, op.create_zone = zone_id, True
        return await reply_for(self.ctx, op, request)


class ZoneNode(Node):
    def __init__(self, ctx: Context, fabric: FabricNode, zone_id: str, host: str, *, client: bool) -> None:
        super().__init__(ctx, uris.zone(fabric.fabric_id, zone_id))
        self.fabric, self.zone_id, self.host, self.client = fabric, zone_id, host, client
        self.allow = ("GET", "HEAD", "DELETE") if client else ("GET", "HEAD")

    def fingerprint(self) -> Hashable:
        """All a zone's rendering depends on: its name and description (a client zone's are
        stored) and its targets — not the rest of the fabric's state."""
        record = self.ctx.engine.state.zones.get(self.zone_id) if self.client else None
        named = (record.name, record.description) if record is not None else None
        return (self.host, named, self.ctx.engine.bindings.zone_targets(self.zone_id))

    def render(self) -> Zone:
        engine = self.ctx.engine
        targets = engine.bindings.zone_targets(self.zone_id)
        members = [uris.endpoint(self.fabric.fabric_id, self.host)] + [
            uris.endpoint(self.fabric.fabric_id, t) for t in targets
        ]
        switches = sorted({self.ctx.index.targets[t].device.switch for t in targets})
        if self.client:
            record = engine.state.zones[self.zone_id]
            name = record.name or f"Zone {self.zone_id} of {self.host}"
            description = record.description
        else:
            name = f"{self.host} zone"
            description = f"The devices bound to {self.host}; add or remove endpoints to bind or unbind"
        return Zone(
            odata_id=self.uri,
            Id=self.zone_id,
            Name=name,
            Description=description,
            ZoneType="ZoneOfEndpoints",
            Status=Status(),
            Links=ZoneLinks(
                Endpoints=refs(members),
                InvolvedSwitches=refs([uris.switch(self.fabric.fabric_id, s) for s in switches]),
            ),
            Actions=actions(self.uri, "Zone.AddEndpoint", "Zone.RemoveEndpoint"),
        )

    def child(self, segment: str) -> Node | None:
        return self.actions_child(segment)

    def action_names(self) -> tuple[str, ...]:
        return ("Zone.AddEndpoint", "Zone.RemoveEndpoint")

    async def action(self, name: str, request: Request) -> Reply:
        params = parse_body(_EndpointParams, request.json(), action=name)
        fabric_id = self.fabric.fabric_id
        host, device = resolve_endpoint(self.ctx, fabric_id, params.Endpoint.odata_id, "Endpoint")
        if device is None:
            detail = f"{host} is a host initiator; a zone holds exactly one, {self.host}, and it stays."
            raise parameter_error("Endpoint", name, detail)
        renderer = self.ctx.renderer
        renderer.check_action_etag(self, params.ZoneETag, "ZoneETag")
        renderer.check_action_etag(DeviceEndpointNode(self.ctx, device), params.EndpointETag, "EndpointETag")
        adding = name == "Zone.AddEndpoint"
        if adding:
            check_reachable(self.ctx, device, self.host, "Endpoint", name)
        else:
            binding = self.ctx.engine.bindings.binding(device.id)
            if binding is None or binding.zone != self.zone_id:
                raise parameter_error("Endpoint", name, f"{device.id} is not in zone {self.zone_id}.")
        op = Operation(
            kind=OperationKind.BIND if adding else OperationKind.UNBIND,
            style=BindingStyle.ZONE,
            fabric=fabric_id,
            host=self.host,
            targets=[device.id],
            method="POST",
            uri=f"{self.uri}/Actions/{name}",
            body=request.text,
            zone=self.zone_id,
        )
        return await reply_for(self.ctx, op, request)

    async def delete(self, request: Request) -> Reply:
        if not self.client:
            raise not_allowed(self, "DELETE")
        op = Operation(
            kind=OperationKind.UNBIND,
            style=BindingStyle.ZONE,
            fabric=self.fabric.fabric_id,
            host=self.host,
            targets=list(self.ctx.engine.bindings.zone_targets(self.zone_id)),
            method="DELETE",
            uri=self.uri,
            zone=self.zone_id,
            delete_zone=True,
        )
        return await reply_for(self.ctx, op, request)


# --- CXL connections ---------------------------------------------------------------------------


_Access = Literal["Read", "Write"]


def _read_write() -> list[_Access]:
    return ["Read", "Write"]


class _ChunkInfoIn(Body):
    MemoryChunk: LinkIn
    AccessCapabilities: list[_Access] = Field(default_factory=_read_write, min_length=1)
    AccessState: str | None = None


class _ConnectionLinksIn(Body):
    InitiatorEndpoints: list[LinkIn] = Field(min_length=1, max_length=1)
    TargetEndpoints: list[LinkIn] = Field(default_factory=list)


class _ConnectionCreate(_Creation):
    ConnectionType: Literal["Memory"] = "Memory"
    MemoryChunkInfo: list[_ChunkInfoIn] = Field(min_length=1)
    Links: _ConnectionLinksIn


class ConnectionsNode(_ClientCollection):
    def __init__(self, ctx: Context, fabric: FabricNode) -> None:
        super().__init__(ctx, fabric, "Connections", "ConnectionCollection")

    def records(self) -> Mapping[str, ClientRecord]:
        return self.ctx.engine.state.connections

    def _make(self, ident: str) -> Node | None:
        if self.record(ident) is None:
            return None
        return ConnectionNode(self.ctx, self.fabric.fabric_id, ident)

    def _chunk_target(self, uri: str, index: int) -> str:
        """The chunk target Id for a MemoryChunk link; 400 naming the property otherwise."""
        prop = f"MemoryChunkInfo/{index}/MemoryChunk"
        clean = uri.rstrip("/")
        for device in self.ctx.index.fabric_devices(self.fabric.fabric_id):
            for chunk in self.ctx.index.chunks_of(device):
                if clean == uris.chunk(device.id, chunk.index):
                    return chunk.id
        raise RedfishError.of(
            400,
            "ResourceNotFound",
            "MemoryChunks",
            uri,
            related=[f"/{prop}"],
            detail=f"{uri} is not a memory chunk of fabric {self.fabric.fabric_id}.",
        )

    async def _create(self, request: Request) -> Reply:
        body = parse_body(_ConnectionCreate, request.json())
        fabric_id = self.fabric.fabric_id
        host, _ = resolve_endpoint(
            self.ctx, fabric_id, body.Links.InitiatorEndpoints[0].odata_id, "Links/InitiatorEndpoints/0"
        )
        if host is None:
            raise RedfishError.of(
                400,
                "PropertyValueError",
                "Links/InitiatorEndpoints",
                related=["/Links/InitiatorEndpoints/0"],
                detail="Links/InitiatorEndpoints must name a host initiator endpoint.",
            )
        targets: list[str] = []
        access: set[str] = set()
        for i, info in enumerate(body.MemoryChunkInfo):
            target = self._chunk_target(info.MemoryChunk.odata_id, i)
            if target in targets:
                raise RedfishError.of(
                    400,
                    "PropertyValueError",
                    f"MemoryChunkInfo/{i}/MemoryChunk",
                    detail=f"{info.MemoryChunk.odata_id} is listed twice.",
                )
            targets.append(target)
            access.update(info.AccessCapabilities)
        devices = {self.ctx.index.targets[t].device.id for t in targets}
        for i, link in enumerate(body.Links.TargetEndpoints):
            _, target_device = resolve_endpoint(
                self.ctx, fabric_id, link.odata_id, f"Links/TargetEndpoints/{i}"
            )
            if target_device is None or target_device.id not in devices:
                raise RedfishError.of(
                    400,
                    "PropertyValueError",
                    f"Links/TargetEndpoints/{i}",
                    related=[f"/Links/TargetEndpoints/{i}"],
                    detail=f"{link.odata_id} is not the endpoint of a chunk in MemoryChunkInfo.",
                )
        for t in targets:
            check_reachable(self.ctx, self.ctx.index.targets[t].device, host, "Links/InitiatorEndpoints/0")
        conn_id = self.ctx.engine.state.allocate_id()
        op = self.creation(request, body, BindingStyle.CONNECTION, host, targets, conn_id)
        op.connection, op.access, op.create_connection = conn_id, sorted(access), True
        return await reply_for(self.ctx, op, request)


class ConnectionNode(Node):
    allow = ("GET", "HEAD", "DELETE")

    def __init__(self, ctx: Context, fabric_id: str, conn_id: str) -> None:
        super().__init__(ctx, uris.connection(fabric_id, conn_id))
        self.fabric_id, self.conn_id = fabric_id, conn_id

    def render(self) -> Connection:
        record = self.ctx.engine.state.connections[self.conn_id]
        chunks = [self.ctx.index.chunks[c] for c in record.chunks if c in self.ctx.engine.state.bindings]
        devices = sorted({c.device for c in chunks})
        return Connection(
            odata_id=self.uri,
            Id=self.conn_id,
            Name=record.name or f"Connection {self.conn_id} to {record.host}",
            Description=record.description,
            ConnectionType="Memory",
            Status=Status(),
            MemoryChunkInfo=[
                MemoryChunkInfo(
                    AccessCapabilities=record.access, MemoryChunk=ref(uris.chunk(c.device, c.index))
                )
                for c in chunks
            ],
            Links=ConnectionLinks(
                InitiatorEndpoints=[ref(uris.endpoint(self.fabric_id, record.host))],
                TargetEndpoints=refs([uris.endpoint(self.fabric_id, d) for d in devices]),
            ),
        )

    async def delete(self, request: Request) -> Reply:
        record = self.ctx.engine.state.connections[self.conn_id]
        op = Operation(
            kind=OperationKind.UNBIND,
            style=BindingStyle.CONNECTION,
            fabric=self.fabric_id,
            host=record.host,
            targets=[c for c in record.chunks if c in self.ctx.engine.state.bindings],
            method="DELETE",
            uri=self.uri,
            connection=self.conn_id,
            delete_connection=True,
        )
        return await reply_for(self.ctx, op, request)
