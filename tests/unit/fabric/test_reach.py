"""Which hosts reach a device: the switches its target and the hosts' initiators are cabled to,
read over real HTTP from a scripted service (fabric/backends/reach.py)."""

from __future__ import annotations

from typing import Any

from fabric.backends.reach import narrow_reach
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
