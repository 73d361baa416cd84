"""Cascaded switches in the emulator: the packaged 2- and 3-tier presets, their inter-switch ports as
Redfish renders them (Port v1_0_0 ``PortType`` InterswitchPort, ``Links.ConnectedSwitches`` /
``ConnectedSwitchPorts``), binds routed over the links and refused where no path exists, and a
pulled cable (a ``LinkRemoved`` fault). Driven in process through the ASGI application."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from emulator.redfish.model.latency import INSTANT
from emulator.redfish.service.server import ServeConfig, build_service
from emulator.redfish.tree.auth import Credentials
from emulator.topology import (
    PRESETS,
    TopologyError,
    load_topology,
    parse_topology,
    preset_path,
    resolve_topology,
)
from tests.support.emulator import zone_add

Client = httpx.AsyncClient
SWITCHES = "/redfish/v1/Fabrics/PCIe/Switches"
FAULTS = "/redfish/v1/Oem/FabricDRA/Faults"
W1, W2, W3, W4, W5 = "kind-worker", "kind-worker2", "kind-worker3", "kind-worker4", "kind-worker5"

#: who reaches what, from the cabling the preset files describe (written out, not derived)
TWO_TIER = {
    "gpu0": {W1, W2, W3},
    "gpu1": {W1, W2, W3},
    "gpu2": {W1, W2, W3},
    "nvme0": {W1, W2, W3},
    "gpu3": {W1, W2, W3},
    "nic0": {W1, W2, W3},
    "gpu4": {W4},
    "fpga0": {W4},
}
THREE_TIER = {
    "gpu0": {W1, W2, W3},
    "gpu1": {W1, W2, W3},
    "nvme0": {W1, W2, W3},
    "gpu2": {W1, W2, W3},
    "nic0": {W1, W2, W3},
    "gpu3": {W5},
    "fpga0": {W5},
    "gpu4": {W4},
    "nvme1": {W4},
}


@pytest.mark.parametrize(("preset", "expected"), [("cascade-2tier", TWO_TIER), ("cascade-3tier", THREE_TIER)])
def test_the_presets_reach_exactly_as_cabled(preset: str, expected: dict[str, set[str]]) -> None:
    index = load_topology(preset_path(preset))
    reach = {d.id: {h for h in index.hosts if index.host_reaches(h, d)} for d in index.devices.values()}
    assert reach == expected


def test_a_preset_name_is_a_topology_unless_a_file_has_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert set(PRESETS) == {"default", "cascade-2tier", "cascade-3tier"}
    monkeypatch.chdir(tmp_path)
    assert resolve_topology("cascade-2tier") == preset_path("cascade-2tier")
    # the command line makes a bare name absolute against the working directory
    assert resolve_topology(tmp_path / "cascade-3tier") == preset_path("cascade-3tier")
    assert (
        resolve_topology(tmp_path / "elsewhere" / "cascade-3tier") == tmp_path / "elsewhere" / "cascade-3tier"
    )
    (tmp_path / "cascade-2tier").write_text("version: 1\n")
    assert resolve_topology("cascade-2tier") == Path("cascade-2tier")
    with pytest.raises(ValueError, match="no topology preset"):
        preset_path("cascade-9tier")


def test_links_are_checked() -> None:
    data = yaml.safe_load(preset_path("cascade-2tier").read_text())
    data["pcie"]["links"] += [{"switches": ["leaf0", "leaf0"]}, {"switches": ["spine0", "spine9"]}]
    data["pcie"]["switches"][1]["devices"][0]["port"] = "ISL7"
    with pytest.raises(TopologyError) as info:
        parse_topology(data, "test.yaml")
    problems = [str(p) for p in info.value.problems]
    assert problems == [
        "pcie.switches[1].devices[0].port: port 'ISL7' is taken "
        "(UP* are host ports, ISL* inter-switch ports)",
        "pcie.links[3].switches: a link joins two different switches, not 'leaf0' to itself",
        "pcie.links[4].switches[1]: unknown switch 'spine9' (the pcie section has: leaf0, leaf1, leaf2, "
        "leaf3, spine0)",
    ]


def _run(preset: str, tmp_path: Path, body: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        service = build_service(
            ServeConfig(
                index=load_topology(preset_path(preset)),
                state_dir=tmp_path / "state",
                latency=INSTANT,
                credentials=Credentials(username="admin", password="secret-password"),
            )
        )
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://emulator", auth=("admin", "secret-password")
        ) as client:
            await body(client)
        service.engine.close()

    asyncio.run(main())


async def _json(client: Client, uri: str) -> dict[str, Any]:
    response = await client.get(uri)
    assert response.status_code == 200, (uri, response.text)
    data: dict[str, Any] = response.json()
    return data


def test_interswitch_ports_name_their_peer(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        ports = await _json(client, f"{SWITCHES}/spine0/Ports")
        assert [m["@odata.id"].rsplit("/", 1)[1] for m in ports["Members"]] == ["ISL0", "ISL1", "ISL2"]
        port = await _json(client, f"{SWITCHES}/spine0/Ports/ISL1")
        assert port["@odata.type"] == "#Port.v1_18_0.Port"
        assert (port["PortType"], port["LinkStatus"]) == ("InterswitchPort", "LinkUp")
        assert port["Links"] == {
            "AssociatedEndpoints": [],
            "ConnectedSwitches": [{"@odata.id": f"{SWITCHES}/leaf1"}],
            "ConnectedSwitchPorts": [{"@odata.id": f"{SWITCHES}/leaf1/Ports/ISL0"}],
        }
        back = await _json(client, f"{SWITCHES}/leaf1/Ports/ISL0")
        assert back["Links"]["ConnectedSwitchPorts"] == [{"@odata.id": f"{SWITCHES}/spine0/Ports/ISL1"}]
        leaf3 = await _json(client, f"{SWITCHES}/leaf3/Ports")
        assert {m["@odata.id"].rsplit("/", 1)[1] for m in leaf3["Members"]} == {"UP0", "DP0", "DP1"}

    _run("cascade-2tier", tmp_path, body)


def test_binds_follow_the_links_and_a_pulled_cable_cuts_them(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        # kind-worker hangs off leaf0, gpu3 off leaf2: joined through spine0
        uri, request = zone_add(W1, "gpu3")
        assert (await client.post(uri, json=request)).status_code == 204
        # leaf3 is linked to nothing: only its own host reaches gpu4
        uri, request = zone_add(W1, "gpu4")
        refused = await client.post(uri, json=request)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "Base.1.22.ActionParameterValueError"
        assert "gpu4 hangs off leaf3, which is neither cabled to kind-worker nor joined" in error["message"]
        uri, request = zone_add(W4, "gpu4")
        assert (await client.post(uri, json=request)).status_code == 204
        # the cable between spine0 and leaf1 is pulled: kind-worker3 (leaf1) reaches leaf1 alone
        unknown = await client.post(FAULTS, json={"Kind": "LinkRemoved", "Switch": "spine0", "Port": "UP0"})
        assert unknown.status_code == 400
        added = await client.post(FAULTS, json={"Kind": "LinkRemoved", "Switch": "spine0", "Port": "ISL1"})
        assert added.status_code == 201, added.text
        for uri in (f"{SWITCHES}/spine0/Ports/ISL1", f"{SWITCHES}/leaf1/Ports/ISL0"):
            port = await _json(client, uri)
            assert port["LinkStatus"] == "NoLink"
            assert port["Links"]["ConnectedSwitchPorts"] == [] and port["Links"]["ConnectedSwitches"] == []
        uri, request = zone_add(W3, "gpu0")
        assert (await client.post(uri, json=request)).status_code == 400
        uri, request = zone_add(W1, "gpu2")
        assert (await client.post(uri, json=request)).status_code == 400
        uri, request = zone_add(W3, "gpu2")
        assert (await client.post(uri, json=request)).status_code == 204
        # the cable back in: kind-worker3 reaches leaf0 again
        assert (await client.delete(FAULTS)).status_code in (200, 204)
        assert (await _json(client, f"{SWITCHES}/leaf1/Ports/ISL0"))["LinkStatus"] == "LinkUp"
        uri, request = zone_add(W3, "gpu0")
        assert (await client.post(uri, json=request)).status_code == 204

    _run("cascade-2tier", tmp_path, body)
