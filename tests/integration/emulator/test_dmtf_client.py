"""DMTF's own ``redfish`` client library against a running emulator: a session login, then a
bind-and-unbind round trip in each of the three binding styles, checked from several views."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redfish

from tests.support.emulator import (
    BLOCKS,
    CONNECTIONS,
    ENDPOINTS,
    ZONES,
    RunningEmulator,
    block_action,
    connection_body,
    run_emulator,
    zone_add,
    zone_remove,
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with run_emulator(tmp_path_factory.mktemp("dmtf")) as running:
        yield running


@pytest.fixture
def session(emu: RunningEmulator) -> Iterator[Any]:
    client = redfish.redfish_client(
        base_url=emu.url, username=emu.username, password=emu.password, timeout=30, max_retry=1
    )
    client.login(auth="session")
    yield client
    client.logout()


def _members(client: Any, uri: str) -> list[str]:
    response = client.get(uri)
    assert response.status == 200, response.text
    return [m["@odata.id"] for m in response.dict["Members"]]


def test_session_login_and_logout(emu: RunningEmulator) -> None:
    client = redfish.redfish_client(
        base_url=emu.url, username=emu.username, password=emu.password, timeout=30
    )
    client.login(auth="session")
    location = client.get_session_location()
    token = client.get_session_key()
    assert location.startswith("/redfish/v1/SessionService/Sessions/")
    assert token
    session = client.get(location)
    assert session.status == 200 and session.dict["UserName"] == emu.username
    assert location in _members(client, "/redfish/v1/SessionService/Sessions")
    client.logout()
    # the token is dead after logout
    stale = redfish.redfish_client(base_url=emu.url, sessionkey=token, timeout=30)
    assert stale.get("/redfish/v1/Systems").status == 401


def test_wrong_password_is_refused(emu: RunningEmulator) -> None:
    client = redfish.redfish_client(base_url=emu.url, username=emu.username, password="not-it", timeout=30)
    with pytest.raises(redfish.rest.v1.InvalidCredentialsError):
        client.login(auth="session")


def test_zone_round_trip(emu: RunningEmulator, session: Any) -> None:
    uri, body = zone_add("kind-worker", "gpu1")
    response = session.post(uri, body=body)
    assert response.status == 204, response.text
    zone = session.get(f"{ZONES}/kind-worker").dict
    assert {"@odata.id": f"{ENDPOINTS}/gpu1"} in zone["Links"]["Endpoints"]
    endpoint = session.get(f"{ENDPOINTS}/gpu1").dict
    assert endpoint["Links"]["Zones"] == [{"@odata.id": f"{ZONES}/kind-worker"}]
    system = session.get("/redfish/v1/Systems/kind-worker").dict
    assert {"@odata.id": f"{BLOCKS}/gpu1"} in system["Links"]["ResourceBlocks"]
    assert "/redfish/v1/Systems/kind-worker/Processors/gpu1" in _members(
        session, "/redfish/v1/Systems/kind-worker/Processors"
    )
    assert emu.bound_hosts()["gpu1"] == "kind-worker"

    uri, body = zone_remove("kind-worker", "gpu1")
    assert session.post(uri, body=body).status == 204
    assert {"@odata.id": f"{ENDPOINTS}/gpu1"} not in session.get(f"{ZONES}/kind-worker").dict["Links"][
        "Endpoints"
    ]
    assert "gpu1" not in emu.bound_hosts()


def test_composition_round_trip(emu: RunningEmulator, session: Any) -> None:
    uri, body = block_action("kind-worker2", "gpu2")
    assert session.post(uri, body=body).status == 204
    block = session.get(f"{BLOCKS}/gpu2").dict
    assert block["CompositionStatus"]["CompositionState"] == "Composed"
    assert block["Links"]["ComputerSystems"] == [{"@odata.id": "/redfish/v1/Systems/kind-worker2"}]
    # the zone view agrees: the device is in kind-worker2's zone
    zone = session.get(f"{ZONES}/kind-worker2").dict
    assert {"@odata.id": f"{ENDPOINTS}/gpu2"} in zone["Links"]["Endpoints"]

    uri, body = block_action("kind-worker2", "gpu2", "RemoveResourceBlock")
    assert session.post(uri, body=body).status == 204
    assert session.get(f"{BLOCKS}/gpu2").dict["CompositionStatus"]["CompositionState"] == "Unused"
    assert "gpu2" not in emu.bound_hosts()


def test_cxl_connection_round_trip(emu: RunningEmulator, session: Any) -> None:
    created = session.post(CONNECTIONS, body=connection_body("kind-worker3", "cxlmem0", 2))
    assert created.status == 201, created.text
    location = created.getheader("Location")
    assert location.startswith(f"{CONNECTIONS}/")
    connection = session.get(location).dict
    assert connection["MemoryChunkInfo"][0]["MemoryChunk"] == {
        "@odata.id": "/redfish/v1/Chassis/cxlmem0/MemoryDomains/0/MemoryChunks/2"
    }
    assert location in _members(session, CONNECTIONS)
    chunks = _members(session, "/redfish/v1/Systems/kind-worker3/MemoryDomains/CXL/MemoryChunks")
    assert chunks == ["/redfish/v1/Systems/kind-worker3/MemoryDomains/CXL/MemoryChunks/cxlmem0-chunk2"]

    assert session.delete(location).status == 204
    assert session.get(location).status == 404
    assert "cxlmem0-chunk2" not in emu.bound_hosts()


def test_errors_come_as_redfish_messages(emu: RunningEmulator, session: Any) -> None:
    uri, body = zone_add("kind-worker", "gpu3")
    assert session.post(uri, body=body).status == 204
    uri, body = block_action("kind-worker4", "gpu3")
    busy = session.post(uri, body=body)
    assert busy.status == 409
    info = busy.dict["error"]["@Message.ExtendedInfo"][0]
    assert info["MessageId"] == "Base.1.22.ResourceInUse"
    assert "kind-worker" in busy.dict["error"]["message"]
    uri, body = zone_remove("kind-worker", "gpu3")
    assert session.post(uri, body=body).status == 204
