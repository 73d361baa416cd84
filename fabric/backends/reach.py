"""Which hosts can reach each device: the switches a host's initiators and a device's target are
cabled to.

A fabric is not always cabled all-to-all: a switch may be cabled to some hosts only. Binding a
device behind it to another host fails on the fabric (a real switch answers 400
``ActionParameterValueError``), so a device must only ever be offered to the hosts that reach it.

Redfish says where an endpoint is cabled in its port links (Endpoint v1_8 ``Links.ConnectedPorts``,
``Links.Ports``, ``Links.LocalPorts``): a switch port names its switch in its URI
(``…/Switches/{id}/Ports/{port}``); a port elsewhere (a host processor's port, a FabricAdapter port
as in DMTF's public-cxl mockup) names the switch port or switch it is cabled to in
``Links.ConnectedSwitchPorts`` / ``Links.ConnectedSwitches`` (Port v1_4+). A host reaches a device
when one of its initiators and the device's target endpoint share a switch.

What the service does not say is not guessed against the device: a target or an initiator whose
ports name no switch counts as reaching (and reached by) every host of the fabric, as before
per-device reachability existed. Switches cascaded through inter-switch ports are not followed
(that would read every port of every switch in each pass): such a fabric reads as partially cabled
where hosts and devices hang off different switches (docs/manager.md, "Reachability").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from fabric.backends.views import Endpoint, Port
from fabric.backends.walk import Walk, path_ids
from fabric.state.model import DeviceRecord, HostRecord

__all__ = ["endpoint_switches", "narrow_reach"]


def _switch_of(uri: str) -> str | None:
    return path_ids(uri, "Switches")


async def endpoint_switches(walk: Walk, endpoint: Endpoint | None) -> frozenset[str]:
    """The Switch Ids the endpoint's ports are cabled to (empty: the service does not say)."""
    if endpoint is None:
        return frozenset()
    links = endpoint.links
    uris = list(dict.fromkeys((*links.connected_ports, *links.ports, *links.local_ports)))
    direct = {s for s in map(_switch_of, uris) if s}
    if direct:
        return frozenset(direct)
    found: set[str] = set()
    for port in await walk.read_all(uris, Port):
        found.update(s for s in map(_switch_of, port.links.connected_switch_ports) if s)
        found.update(s for s in map(_switch_of, port.links.connected_switches) if s)
    return frozenset(found)


async def _switches_of(walk: Walk, uris: Iterable[str]) -> dict[str, frozenset[str]]:
    unique = list(dict.fromkeys(uris))
    endpoints = await asyncio.gather(*(walk.read(u, Endpoint) for u in unique))
    switches = await asyncio.gather(*(endpoint_switches(walk, e) for e in endpoints))
    return dict(zip(unique, switches, strict=True))


async def narrow_reach(
    walk: Walk, devices: Sequence[DeviceRecord], hosts: Mapping[str, HostRecord]
) -> list[DeviceRecord]:
    """``devices`` with ``reachable_hosts`` narrowed to the hosts cabled to their switches.

    The endpoints were read by the pass already (``walk`` remembers them); only ports that are not
    switch ports cost a GET, once each."""
    initiators = {u for h in hosts.values() for uris in h.initiators.values() for u in uris}
    targets = {d.endpoint for d in devices if d.endpoint}
    switches = await _switches_of(walk, [*sorted(initiators), *sorted(targets)])
    #: (host, fabric) → the switches its initiators are cabled to
    host_switches = {
        (h.id, fabric): frozenset().union(*(switches.get(u, frozenset()) for u in uris))
        for h in hosts.values()
        for fabric, uris in h.initiators.items()
    }
    narrowed: list[DeviceRecord] = []
    for device in devices:
        target = switches.get(device.endpoint or "", frozenset())
        if not target:
            narrowed.append(device)
            continue
        reaching = tuple(
            h
            for h in device.reachable_hosts
            if not host_switches.get((h, device.fabric)) or host_switches[(h, device.fabric)] & target
        )
        # A binding the fabric shows proves the host reaches the device, whatever the ports say.
        reaching = tuple(sorted(set(reaching) | (set(device.bound_hosts) & set(device.reachable_hosts))))
        if reaching != device.reachable_hosts:
            device = replace(device, reachable_hosts=reaching)
        narrowed.append(device)
    return narrowed
