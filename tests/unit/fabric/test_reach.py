"""Which hosts reach a device: the switches its target and the hosts' initiators are cabled to,
read over real HTTP from a scripted service (fabric/backends/reach.py)."""

from __future__ import annotations

from typing import Any

from fabric.backends.reach import SwitchGraph, narrow_reach, reaching_hosts
from fabric.backends.walk import Walk
from fabric.redfish import RedfishClient, RedfishSettings
from fabric.state.model import DeviceRecord, DiscoveredAttributes, HostRecord
from manager_api.devices import BindingStyle, DeviceType
from tests.support.fabric_http import Reply, Request, ScriptedServer

F = "/redfish/v1/Fabrics/PCIe"


def _refs(*uris: str) -> list[dict[str, str]]:
    return [{"@odata.id": u} for u in uris]


RESOURCES: dict[str, dict[str, Any]] = {
    # host A: its initiator names a port of switch S1 directly
    f"{F}/Endpoints/IA": {"Links": {"ConnectedPorts": _refs(f"{F}/Switches/S1/Ports/U1")}},
    # host B: its initiator names its own processor port, which names S2's port (public-cxl's way)
    f"{F}/Endpoints/IB": {"Links": {"Ports": _refs("/redfish/v1/Systems/B/Processors/CPU/Ports/1")}},
    "/redfish/v1/Systems/B/Processors/CPU/Ports/1": {
        "Links": {"ConnectedSwitchPorts": _refs(f"{F}/Switches/S2/Ports/U1")}
    },
    # host C: the service does not say where it is cabled
    f"{F}/Endpoints/IC": {"Links": {}},
    f"{F}/Endpoints/T1": {"Links": {"ConnectedPorts": _refs(f"{F}/Switches/S1/Ports/D1")}},
    # a device whose FabricAdapter port names only the switch
    f"{F}/Endpoints/T2": {"Links": {"Ports": _refs("/redfish/v1/Chassis/X/FabricAdapters/1/Ports/1")}},
    "/redfish/v1/Chassis/X/FabricAdapters/1/Ports/1": {
        "Links": {"ConnectedSwitches": _refs(f"{F}/Switches/S2")}
    },
    f"{F}/Endpoints/T3": {"Links": {}},
    f"{F}/Endpoints/T4": {"Links": {"ConnectedPorts": _refs(f"{F}/Switches/S2/Ports/D4")}},
}


def service() -> ScriptedServer:
    def answer(request: Request) -> Reply:
        body = RESOURCES.get(request.path)
        if body is None:
            return Reply(404, None)
        return Reply(200, {"@odata.id": request.path, "Id": request.path.rsplit("/", 1)[1], **body})

    return ScriptedServer(answer)


def device(target: str, *, bound: tuple[str, ...] = ()) -> DeviceRecord:
    return DeviceRecord(
        key=f"{F}/Endpoints/{target}",
        resource_id=target,
        fabric="PCIe",
        style=BindingStyle.ZONE,
        attributes=DiscoveredAttributes(type=DeviceType.GPU),
        bound_hosts=bound,
        reachable_hosts=("A", "B", "C"),
        endpoint=f"{F}/Endpoints/{target}",
    )


HOSTS = {
    h: HostRecord(id=h, uri=f"/redfish/v1/Systems/{h}", initiators={"PCIe": (f"{F}/Endpoints/I{h}",)})
    for h in ("A", "B", "C")
}


async def test_a_device_is_reached_by_the_hosts_cabled_to_its_switch() -> None:
    with service() as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        try:
            devices = [device("T1"), device("T2"), device("T3"), device("T4", bound=("A",))]
            narrowed = await narrow_reach(Walk(client), devices, HOSTS)
        finally:
            await client.aclose()
    reach = {d.resource_id: d.reachable_hosts for d in narrowed}
    # C's ports are unknown: it is not held against any device; T3's are unknown: every host
    # reaches it; T4 is bound to A, which proves A reaches it whatever the ports say.
    assert reach == {"T1": ("A", "C"), "T2": ("B", "C"), "T3": ("A", "B", "C"), "T4": ("A", "B", "C")}


# --- cascaded switches: a hand-made port graph ---------------------------------------------------
#
#   host A ── LA ─┬─ S1 ─┬─ LD ── T1        two spines, S1 and S2, each cabled to LA and LD: the
#                 └─ S2 ─┘                  cycle LA-S1-LD-S2-LA
#   host B ── LB ─── S2                     LB hangs off S2 only
#   host C ── LC ── T2                      LC: its one cable to S1 is pulled (LinkStatus NoLink)
#             LA ── T3                      a device beside host A
#
# The links are written the three ways Port's Links can say them, and one only at one of its ends.
CABLES: list[tuple[str, str, str]] = [
    ("LA", "S1", "ConnectedSwitchPorts"),
    ("LA", "S2", "ConnectedSwitches"),
    ("LD", "S1", "ConnectedPorts"),
    ("LD", "S2", "one end"),
    ("LB", "S2", "ConnectedSwitchPorts"),
]
#: written out by hand from the picture above, not computed
EXPECTED = {"T1": ("A", "B"), "T2": ("C",), "T3": ("A", "B")}


def cascade(cables: list[tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
    """The Redfish resources of the picture: endpoints, switches, their Ports collections and ports."""
    ports: dict[str, list[tuple[str, dict[str, Any]]]] = {s: [] for s in ("S1", "S2", "LA", "LB", "LC", "LD")}
    for host, switch in (("A", "LA"), ("B", "LB"), ("C", "LC")):
        ports[switch].append((f"UP{host}", {"PortType": "UpstreamPort", "Links": {}}))
    for target, switch in (("T1", "LD"), ("T2", "LC"), ("T3", "LA")):
        ports[switch].append((f"DP{target}", {"PortType": "DownstreamPort", "Links": {}}))
    for n, (a, b, how) in enumerate(cables):
        for here, there, peer_port in ((a, b, f"X{n}b"), (b, a, f"X{n}a")):
            port_id = f"X{n}a" if here == a else f"X{n}b"
            if how == "one end" and here == b:
                links: dict[str, Any] = {}
            elif how == "ConnectedSwitches":
                links = {"ConnectedSwitches": _refs(f"{F}/Switches/{there}")}
            else:
                field = "ConnectedPorts" if how == "ConnectedPorts" else "ConnectedSwitchPorts"
                links = {field: _refs(f"{F}/Switches/{there}/Ports/{peer_port}")}
            if how == "one end" and here == a:
                links = {"ConnectedSwitchPorts": _refs(f"{F}/Switches/{there}/Ports/{peer_port}")}
            ports[here].append((port_id, {"PortType": "InterswitchPort", "Links": links}))
    pulled = {"PortType": "InterswitchPort", "LinkStatus": "NoLink"}
    ports["LC"].append(("Xpulled", pulled | {"Links": {"ConnectedSwitches": _refs(f"{F}/Switches/S1")}}))
    resources: dict[str, dict[str, Any]] = {}
    for switch, members in ports.items():
        resources[f"{F}/Switches/{switch}"] = {"Ports": {"@odata.id": f"{F}/Switches/{switch}/Ports"}}
        resources[f"{F}/Switches/{switch}/Ports"] = {
            "Members": _refs(*(f"{F}/Switches/{switch}/Ports/{p}" for p, _ in members))
        }
        for port_id, body in members:
            resources[f"{F}/Switches/{switch}/Ports/{port_id}"] = body
    for endpoint, switch, port in (
        ("IA", "LA", "UPA"),
        ("IB", "LB", "UPB"),
        ("IC", "LC", "UPC"),
        ("T1", "LD", "DPT1"),
        ("T2", "LC", "DPT2"),
        ("T3", "LA", "DPT3"),
    ):
        resources[f"{F}/Endpoints/{endpoint}"] = {
            "Links": {"ConnectedPorts": _refs(f"{F}/Switches/{switch}/Ports/{port}")}
        }
    return resources


def scripted(resources: dict[str, dict[str, Any]], asked: list[str]) -> ScriptedServer:
    def answer(request: Request) -> Reply:
        asked.append(request.path)
        body = resources.get(request.path)
        if body is None:
            return Reply(404, None)
        return Reply(200, {"@odata.id": request.path, "Id": request.path.rsplit("/", 1)[1], **body})

    return ScriptedServer(answer)


async def one_pass(url: str, graph: SwitchGraph, devices: list[DeviceRecord]) -> dict[str, tuple[str, ...]]:
    client = RedfishClient(RedfishSettings(base_url=url, auth="none"))
    try:
        narrowed = await narrow_reach(Walk(client), devices, HOSTS, graph)
    finally:
        await client.aclose()
    return {d.resource_id: d.reachable_hosts for d in narrowed}


async def test_reach_follows_interswitch_links_through_a_cycle_and_is_computed_once() -> None:
    resources = cascade(CABLES)
    asked: list[str] = []
    graph = SwitchGraph()
    devices = [device("T1"), device("T2"), device("T3")]
    with scripted(resources, asked) as server:
        assert await one_pass(server.url, graph, devices) == EXPECTED
        assert graph.computations == 1
        # every switch of the component was read, and LC's own (a host and a device apart)
        assert {p.split("/")[-2] for p in asked if p.endswith("/Ports")} == {
            "S1",
            "S2",
            "LA",
            "LB",
            "LC",
            "LD",
        }
        # a pass over the same cabling computes nothing again
        assert await one_pass(server.url, graph, devices) == EXPECTED
        assert graph.computations == 1
        # LB's cable to S2 is pulled: the next pass recomputes, and B reaches nothing but LB
        resources.clear()
        resources.update(cascade(CABLES[:4]))
        assert await one_pass(server.url, graph, devices) == {"T1": ("A",), "T2": ("C",), "T3": ("A",)}
        assert graph.computations == 2


async def test_a_fabric_cabled_all_to_all_reads_no_port() -> None:
    resources = cascade([])
    for endpoint in ("IA", "IB", "IC"):  # every host cabled to every switch with a device
        resources[f"{F}/Endpoints/{endpoint}"]["Links"]["ConnectedPorts"] += _refs(
            f"{F}/Switches/LD/Ports/UP{endpoint}",
            f"{F}/Switches/LA/Ports/UP{endpoint}",
            f"{F}/Switches/LC/Ports/UP{endpoint}",
        )
    asked: list[str] = []
    graph = SwitchGraph()
    with scripted(resources, asked) as server:
        reach = await one_pass(server.url, graph, [device("T1"), device("T2"), device("T3")])
    assert reach == {"T1": ("A", "B", "C"), "T2": ("A", "B", "C"), "T3": ("A", "B", "C")}
    assert [p for p in asked if "/Switches/" in p] == [] and graph.computations == 0


def test_reaching_hosts_of_a_graph_with_a_cycle() -> None:
    edges = [("L1", "S1"), ("L1", "S2"), ("L2", "S1"), ("L2", "S2"), ("L3", "L4")]
    hosts = {("A", "PCIe"): frozenset({"L1"}), ("B", "PCIe"): frozenset({"L3"})}
    reach = reaching_hosts(edges, hosts)
    assert reach == {
        "L1": {("A", "PCIe")},
        "L2": {("A", "PCIe")},
        "S1": {("A", "PCIe")},
        "S2": {("A", "PCIe")},
        "L3": {("B", "PCIe")},
        "L4": {("B", "PCIe")},
    }
