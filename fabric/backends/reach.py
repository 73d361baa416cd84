"""Which hosts can reach each device: the switches a host's initiators and a device's target are
cabled to, and the inter-switch links that join switches.

A fabric is not always cabled all-to-all: a switch may be cabled to some hosts only, and switches
cascade (a spine with leaf switches; hosts on some leaves, devices on others). Binding a device to
a host that no cable path joins it to fails on the fabric (a real switch answers 400
``ActionParameterValueError``), so a device must only ever be offered to the hosts that reach it.

Redfish says where an endpoint is cabled in its port links (Endpoint v1_8 ``Links.ConnectedPorts``,
``Links.Ports``, ``Links.LocalPorts``): a switch port names its switch in its URI
(``…/Switches/{id}/Ports/{port}``); a port elsewhere (a host processor's port, a FabricAdapter port
as in DMTF's public-cxl mockup) names the switch port or switch it is cabled to in
``Links.ConnectedSwitchPorts`` / ``Links.ConnectedSwitches`` (Port v1_0_0). A switch's own ports
say the same of a cable to another switch (``PortType`` ``InterswitchPort``, or an upstream port
cabled to another switch's downstream port, as PCIe cascades are wired), and ``ConnectedPorts``
(Port v1_2_0) may name the far port too. A host reaches a device when one of its initiators'
switches and the device's target switch are the same or joined by a chain of such links.

The links are read only where they can change an answer: when every host of a device's fabric
shares a switch with it (a flat fabric, cabled all-to-all), no port is read, as before. Otherwise
the switches of the hosts and devices that share none are read (their ``Ports``, revalidated with
ETags like every read of a pass), and so on across the links found. Which hosts reach each switch
is computed again only when those links or the hosts' switches changed (:class:`SwitchGraph`),
not on every pass.

What the service does not say is not guessed against the device: a target or an initiator whose
ports name no switch counts as reaching (and reached by) every host of the fabric, as before
per-device reachability existed (docs/manager.md, "Reachability").
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from fabric.backends.views import Endpoint, Port, Switch
from fabric.backends.walk import Walk
from fabric.state.model import DeviceRecord, HostRecord

__all__ = ["SwitchGraph", "endpoint_switches", "narrow_reach", "reaching_hosts", "read_links", "switch_uri"]

#: (a switch, another switch) joined by a cable, the two switch URIs in order
Edge = tuple[str, str]


def switch_uri(uri: str) -> str | None:
    """``…/Switches/{id}`` of a switch or of one of its ports (None: no switch in ``uri``). URIs,
    not Ids: a Switch Id is unique only in its fabric."""
    head, found, tail = uri.partition("/Switches/")
    ident = tail.split("/", 1)[0]
    return f"{head}/Switches/{ident}" if found and ident else None


def _port_uris(endpoint: Endpoint) -> list[str]:
    links = endpoint.links
    return list(dict.fromkeys((*links.connected_ports, *links.ports, *links.local_ports)))


async def endpoint_switches(walk: Walk, endpoint: Endpoint | None) -> frozenset[str]:
    """The switches (URIs) the endpoint's ports are cabled to (empty: the service does not say)."""
    if endpoint is None:
        return frozenset()
    uris = _port_uris(endpoint)
    direct = {s for s in map(switch_uri, uris) if s}
    if direct:
        return frozenset(direct)
    found: set[str] = set()
    for port in await walk.read_all(uris, Port):
        found.update(s for s in map(switch_uri, port.links.connected_switch_ports) if s)
        found.update(s for s in map(switch_uri, port.links.connected_switches) if s)
    return frozenset(found)


async def _switches_of(walk: Walk, uris: Iterable[str]) -> dict[str, frozenset[str]]:
    """Each endpoint's switches. The pass holds the endpoints already: only one whose ports are
    not switch ports needs a task (to read those ports) — a task per endpoint, 20,400 of them for
    the restart bench's fabric, was most of what reachability cost."""
    wanted = {u: u.rstrip("/") or "/" for u in dict.fromkeys(uris)}
    normal = list(dict.fromkeys(wanted.values()))
    bodies = await walk.get_all(normal)
    present = [u for u, body in zip(normal, bodies, strict=True) if body is not None]
    views = dict(zip(present, await walk.read_all(present, Endpoint), strict=True))
    found: dict[str, frozenset[str]] = {}
    indirect: list[str] = []
    for uri in normal:
        endpoint = views.get(uri)
        direct = frozenset(s for s in map(switch_uri, _port_uris(endpoint)) if s) if endpoint else frozenset()
        if direct or endpoint is None:
            found[uri] = direct
        else:
            indirect.append(uri)
    switches = await asyncio.gather(*(endpoint_switches(walk, views[u]) for u in indirect))
    found.update(zip(indirect, switches, strict=True))
    return {u: found[n] for u, n in wanted.items()}


def _peers(switch: str, port: Port) -> set[str]:
    """The other switches ``port`` of ``switch`` is cabled to; none where no link is detected."""
    if port.link_status == "NoLink":
        return set()
    links = port.links
    named = (*links.connected_switch_ports, *links.connected_switches, *links.connected_ports)
    return {peer for peer in map(switch_uri, named) if peer and peer != switch}


async def _ports_of(walk: Walk, switch: str) -> list[Port]:
    found = await walk.read(switch, Switch)
    return await walk.members(found.ports, Port) if found is not None and found.ports else []


async def read_links(walk: Walk, start: Collection[str]) -> frozenset[Edge]:
    """The inter-switch links of every switch joined to one of ``start``, by reading their ports
    (one collection a switch, members inline where the service expands), across each link found."""
    seen = set(start)
    pending = sorted(seen)
    edges: set[Edge] = set()
    while pending:
        batch, pending = pending, []
        # the switches of a batch in one expanded read of their collection, not a GET each
        await walk.prefetch(batch)
        for switch, ports in zip(
            batch, await asyncio.gather(*(_ports_of(walk, s) for s in batch)), strict=True
        ):
            for peer in {p for port in ports for p in _peers(switch, port)}:
                edges.add((switch, peer) if switch < peer else (peer, switch))
                if peer not in seen:
                    seen.add(peer)
                    pending.append(peer)
    return frozenset(edges)


#: a host on a fabric: (ComputerSystem Id, Fabric Id)
HostKey = tuple[str, str]


class SwitchGraph:
    """Which hosts reach each switch through inter-switch links, kept between passes: computed
    again only when the links read or the hosts' switches differ from the last computation's."""

    def __init__(self) -> None:
        self._key: tuple[frozenset[Edge], frozenset[tuple[HostKey, frozenset[str]]]] | None = None
        self._reaching: dict[str, frozenset[HostKey]] = {}
        #: computations so far (a pass over an unchanged fabric adds none)
        self.computations = 0

    def reaching(
        self, edges: frozenset[Edge], host_switches: Mapping[HostKey, frozenset[str]]
    ) -> Mapping[str, frozenset[HostKey]]:
        """Switch → the hosts (keys of ``host_switches``) cabled to a switch of its component."""
        key = (edges, frozenset(host_switches.items()))
        if key != self._key:
            self._reaching = reaching_hosts(edges, host_switches)
            self._key = key
            self.computations += 1
        return self._reaching


def reaching_hosts(
    edges: Iterable[Edge], host_switches: Mapping[HostKey, frozenset[str]]
) -> dict[str, frozenset[HostKey]]:
    """Switch → the hosts whose switches share its component of the graph ``edges`` make (the
    switches a chain of links joins; a cycle, two spines, is one component like any other)."""
    parent: dict[str, str] = {}

    def root(switch: str) -> str:
        parent.setdefault(switch, switch)
        while parent[switch] != switch:
            parent[switch] = parent[parent[switch]]
            switch = parent[switch]
        return switch

    for a, b in edges:
        parent[root(a)] = root(b)
    hosts: dict[str, set[HostKey]] = {}
    for host, switches in host_switches.items():
        for switch in switches:
            hosts.setdefault(root(switch), set()).add(host)
    return {switch: frozenset(hosts.get(root(switch), ())) for switch in list(parent)}


async def narrow_reach(
    walk: Walk,
    devices: Sequence[DeviceRecord],
    hosts: Mapping[str, HostRecord],
    graph: SwitchGraph | None = None,
) -> list[DeviceRecord]:
    """``devices`` with ``reachable_hosts`` narrowed to the hosts cabled to their switches, or to
    switches joined to them by inter-switch links.

    The endpoints were read by the pass already (``walk`` remembers them); only ports that are not
    switch ports cost a GET, once each, and switches' ports where a host and a device share no
    switch. ``graph`` keeps what links joined between passes (a new one without it)."""
    initiators = {u for h in hosts.values() for uris in h.initiators.values() for u in uris}
    targets = {d.endpoint for d in devices if d.endpoint}
    switches = await _switches_of(walk, [*sorted(initiators), *sorted(targets)])
    host_switches: dict[HostKey, frozenset[str]] = {
        (h.id, fabric): frozenset().union(*(switches.get(u, frozenset()) for u in uris))
        for h in hosts.values()
        for fabric, uris in h.initiators.items()
    }
    # Devices behind the same switches, offered to the same hosts, are narrowed alike: once a
    # group (16 devices a switch on the restart bench's fabric), not once a device.
    groups: dict[tuple[str, frozenset[str], tuple[str, ...]], tuple[str, ...]] = {}
    for device in devices:
        target = switches.get(device.endpoint or "", frozenset())
        if target:
            groups.setdefault((device.fabric, target, device.reachable_hosts), ())
    apart = _apart(groups, host_switches)
    linked: Mapping[str, frozenset[HostKey]] = {}
    if apart:
        edges = await read_links(walk, apart)
        linked = (graph or SwitchGraph()).reaching(edges, {k: s for k, s in host_switches.items() if s})
    for fabric, target, offered in groups:
        through = {h for s in target for h in linked.get(s, ())}
        groups[(fabric, target, offered)] = tuple(
            sorted(
                h
                for h in offered
                if not (own := host_switches.get((h, fabric))) or own & target or (h, fabric) in through
            )
        )
    narrowed: list[DeviceRecord] = []
    for device in devices:
        target = switches.get(device.endpoint or "", frozenset())
        if not target:
            narrowed.append(device)
            continue
        reaching = groups[(device.fabric, target, device.reachable_hosts)]
        if device.bound_hosts:
            # A binding the fabric shows proves the host reaches the device, whatever the ports say.
            bound = set(device.bound_hosts) & set(device.reachable_hosts)
            reaching = tuple(sorted(set(reaching) | bound))
        if reaching != device.reachable_hosts:
            device = replace(device, reachable_hosts=reaching)
        narrowed.append(device)
    return narrowed


def _apart(
    groups: Iterable[tuple[str, frozenset[str], tuple[str, ...]]],
    host_switches: Mapping[HostKey, frozenset[str]],
) -> set[str]:
    """The switches of the devices and hosts that share no switch (where links could join them);
    empty on a flat fabric cabled all-to-all, whose ports then are not read at all."""
    apart: set[str] = set()
    for fabric, target, offered in groups:
        for host in offered:
            own = host_switches.get((host, fabric))
            if own and not own & target:
                apart |= own | target
    return apart
