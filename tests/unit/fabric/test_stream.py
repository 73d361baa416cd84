"""Devices described a switch at a time: what a pass keeps of them is their attributes and the
ETags they were derived from, not the answers (fabric/backends/stream.py)."""

from __future__ import annotations

from typing import Any

from fabric.backends.stream import SwitchRecord, _SwitchWalk, describe_by_switch
from fabric.backends.views import Endpoint
from fabric.backends.walk import Revalidation, Walk
from fabric.redfish import RedfishClient, RedfishSettings
from tests.support.fabric_http import Reply, Request, ScriptedServer

SWITCHES = {"S1": ["gpu1", "gpu2"], "S2": ["gpu3"]}


class Service:
    """Each switch's Processors and Ports, expanded, with an ETag per answer (304 to a match)."""

    def __init__(self) -> None:
        self.models = {device: "H100" for devices in SWITCHES.values() for device in devices}

    def _processors(self, switch: str) -> dict[str, Any]:
        return {
            "Members": [
                {
                    "@odata.id": f"/redfish/v1/Chassis/{switch}/Processors/{device}",
                    "@odata.type": "#Processor.v1_22_0.Processor",
                    "Id": device,
                    "ProcessorType": "GPU",
                    "Model": self.models[device],
                    "SerialNumber": f"SN-{device}",
                }
                for device in SWITCHES[switch]
            ]
        }

    @staticmethod
    def _ports(switch: str) -> dict[str, Any]:
        return {
            "Members": [
                {"@odata.id": f"/redfish/v1/Fabrics/F/Switches/{switch}/Ports/{device}", "Id": device}
                for device in SWITCHES[switch]
            ]
        }

    def answer(self, request: Request) -> Reply:
        parts = request.path.split("?")[0].split("/")
        if "Processors" in parts:
            body = self._processors(parts[4])
            if parts[-1] != "Processors":  # a member alone (a switch of one device is read so)
                body = next(m for m in body["Members"] if m["Id"] == parts[-1])
        elif "Ports" in parts:
            body = self._ports(parts[6])
        else:
            return Reply(404, None)
        tag = f'"{abs(hash(repr(body)))}"'
        if request.headers.get("if-none-match") == tag:
            return Reply(304, None, {"ETag": tag})
        return Reply(200, body, {"ETag": tag})


def _targets() -> list[tuple[list[tuple[str, str]], Endpoint]]:
    return [
        (
            [("Processor", f"/redfish/v1/Chassis/{switch}/Processors/{device}")],
            Endpoint.model_validate(
                {
                    "@odata.id": f"/redfish/v1/Fabrics/F/Endpoints/{device}",
                    "Id": device,
                    "Links": {
                        "ConnectedPorts": [
                            {"@odata.id": f"/redfish/v1/Fabrics/F/Switches/{switch}/Ports/{device}"}
                        ]
                    },
                }
            ),
        )
        for switch, devices in SWITCHES.items()
        for device in devices
    ]


async def test_a_pass_keeps_etags_and_attributes_not_answers() -> None:
    service = Service()
    targets = _targets()
    with ScriptedServer(service.answer) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        revalidation = Revalidation()
        try:

            async def one_pass() -> list[Any]:
                walk = Walk(client, expand=True, max_levels=3, revalidation=revalidation)
                described = await describe_by_switch(walk, targets)
                # the switches' answers were counted against the pass's bounds while held, no longer
                assert walk.gets > 0 and walk.read_bytes == walk.read_values == walk.listed == 0
                revalidation.retain(walk)
                return described

            first = await one_pass()
            asked = len(server.requests)
            second = await one_pass()
            again = server.requests[asked:]
            service.models["gpu3"] = "A100"
            third = await one_pass()
        finally:
            await client.aclose()
    assert [a.model for a in first] == ["H100", "H100", "H100"]
    assert [a.switch for a in first] == ["S1", "S1", "S2"]
    # nothing of the answers is kept: per switch, the requests with their ETags and the attributes
    records = list(revalidation.derived.values())
    assert len(records) == 2
    assert all(isinstance(r, SwitchRecord) and not r.borrowed for r in records)
    assert all(isinstance(k, str) and isinstance(t, str) for r in records for k, t in r.etags)
    assert not any(revalidation.kept(key) for r in records for key, _ in r.etags)
    # unchanged: each answer asked for with If-None-Match, 304, the attributes taken as they were
    assert again and all(r.headers.get("if-none-match") for r in again)
    assert all(a is b for a, b in zip(first, second, strict=True))
    # a changed switch is read and described again; the other is not
    assert [a.model for a in third] == ["H100", "H100", "A100"]
    assert third[0] is first[0] and third[2] is not first[2]


async def test_a_switch_walk_borrows_a_slimmed_endpoint_with_its_view() -> None:
    """An endpoint the pass read and slimmed (its JSON a stub): a switch's walk that reads it gets
    the pass's view, not a view of the stub."""
    client = RedfishClient(RedfishSettings(base_url="http://127.0.0.1:9", auth="none"))
    try:
        walk = Walk(client, revalidation=Revalidation())
        uri = "/redfish/v1/Fabrics/F/Endpoints/gpu1"
        ports = [{"@odata.id": "/redfish/v1/Fabrics/F/Switches/S1/Ports/gpu1"}]
        walk.seed_as(uri, {"@odata.id": uri, "Id": "gpu1", "Links": {"ConnectedPorts": ports}})
        endpoint = await walk.read(uri, Endpoint)
        assert endpoint is not None
        walk.slim([endpoint])
        switch_walk = _SwitchWalk(walk)
        assert await switch_walk.read(uri, Endpoint) is endpoint
        assert endpoint.links.connected_ports == ("/redfish/v1/Fabrics/F/Switches/S1/Ports/gpu1",)
        assert switch_walk.gets == 0
    finally:
        await client.aclose()
