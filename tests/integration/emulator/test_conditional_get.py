"""Conditional GETs across changes of the fabric: an answer whose body changed is never 304, an
unchanged one always is — plain resources and expanded collections alike, whose own body may
stay the same while a member inlined in the answer changes.

DSP0266 v1.20.0 §6.5 "ETags" (and RFC 9110 §13.1.2): a GET with ``If-None-Match`` naming the
current ETag is answered 304 Not Modified; any other is a full answer. The emulator answers a
kept expanded answer without building it again (``emulator/redfish/service/expanded.py``), so
these reads go through each kind of change that could leave a kept answer behind: a bind (zones,
endpoints, systems), a fault on a device (its port's metrics, its health), a host's port going
down (an upstream port), and their reversal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.emulator import (
    CONNECTIONS,
    ENDPOINTS,
    ZONES,
    RunningEmulator,
    connection_body,
    run_emulator,
    zone_add,
    zone_remove,
)

PORTS = "/redfish/v1/Fabrics/PCIe/Switches/switch0/Ports"
READS = (
    f"{ZONES}/kind-worker",
    f"{ZONES}/kind-worker2",
    f"{ZONES}?$expand=.($levels=1)",
    f"{ZONES}?$expand=.($levels=1)&$select=Id",
    f"{ENDPOINTS}/gpu0",
    f"{ENDPOINTS}/gpu4",
    f"{ENDPOINTS}?$expand=.($levels=1)",
    "/redfish/v1/Fabrics/CXL/Endpoints?$expand=.($levels=1)",
    "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem0",
    f"{PORTS}?$expand=.($levels=2)",
    f"{PORTS}?$expand=.($levels=1)",
    "/redfish/v1/Fabrics/PCIe/Switches/switch1/Ports?$expand=.($levels=2)",
    "/redfish/v1/Chassis/switch0/PCIeDevices?$expand=.($levels=3)",
    "/redfish/v1/Chassis/switch0/Processors?$expand=.($levels=1)",
    "/redfish/v1/Systems?$expand=.($levels=1)",
    "/redfish/v1/Systems/kind-worker",
    "/redfish/v1/CompositionService/ResourceBlocks?$expand=.($levels=1)&$select=Id,Links",
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with run_emulator(tmp_path_factory.mktemp("conditional")) as running:
        yield running


def _without_etag(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "@odata.etag"}


def _read_all(client: httpx.Client) -> dict[str, tuple[str, dict[str, Any]]]:
    seen = {}
    for uri in READS:
        answer = client.get(uri)
        assert answer.status_code == 200, (uri, answer.text)
        assert answer.headers["ETag"] == answer.json()["@odata.etag"]
        seen[uri] = (answer.headers["ETag"], _without_etag(answer.json()))
    return seen


def _revalidate(client: httpx.Client, before: dict[str, tuple[str, dict[str, Any]]]) -> set[str]:
    """Each read again with its old ETag; returns those whose body changed. A 304 must mean the
    body is what it was, a 200 that it is not (and the 200 is the current body)."""
    changed = set()
    for uri, (etag, body) in before.items():
        conditional = client.get(uri, headers={"If-None-Match": etag})
        fresh = client.get(uri)
        assert fresh.status_code == 200
        now = _without_etag(fresh.json())
        if now == body:
            assert conditional.status_code == 304, f"{uri}: unchanged, but answered {conditional.status_code}"
            assert conditional.headers["ETag"] == etag and not conditional.content
        else:
            changed.add(uri)
            assert conditional.status_code == 200, f"{uri}: changed, but answered 304 to its old ETag"
            assert _without_etag(conditional.json()) == now
            assert conditional.headers["ETag"] != etag
    return changed


def _step(client: httpx.Client, change: Callable[[], Any]) -> set[str]:
    before = _read_all(client)
    change()
    return _revalidate(client, before)


def _post(client: httpx.Client, request: tuple[str, dict[str, Any]]) -> None:
    uri, body = request
    assert client.post(uri, json=body).status_code == 204


def test_only_what_changed_is_read_again(emu: RunningEmulator) -> None:
    client = emu.client()
    # nothing changed: every one 304, twice over (the second from the kept answers)
    assert _step(client, lambda: None) == set()
    assert _revalidate(client, _read_all(client)) == set()

    bound = _step(client, lambda: _post(client, zone_add("kind-worker", "gpu0")))
    # the zone, its endpoint and the listings inlining them changed; another zone and the
    # switch's ports did not
    assert {f"{ZONES}/kind-worker", f"{ZONES}?$expand=.($levels=1)", f"{ENDPOINTS}/gpu0"} <= bound
    assert f"{ENDPOINTS}?$expand=.($levels=1)" in bound
    assert {f"{ZONES}/kind-worker2", f"{PORTS}?$expand=.($levels=2)", f"{ENDPOINTS}/gpu4"}.isdisjoint(bound)

    replays = {"Kind": "PCIeErrors", "Device": "gpu0", "ReplayCount": 3}
    errors = _step(client, lambda: emu.inject(replays))
    # a member two levels down (the port's Metrics) changed; the ports themselves did not
    assert f"{PORTS}?$expand=.($levels=2)" in errors
    assert f"{PORTS}?$expand=.($levels=1)" not in errors
    assert "/redfish/v1/Fabrics/PCIe/Switches/switch1/Ports?$expand=.($levels=2)" not in errors

    down = _step(client, lambda: emu.inject({"Kind": "PortDown", "Host": "kind-worker2"}))
    assert {f"{PORTS}?$expand=.($levels=1)", f"{PORTS}?$expand=.($levels=2)"} <= down

    health = _step(client, lambda: emu.inject({"Kind": "DeviceHealth", "Device": "gpu4"}))
    assert f"{ENDPOINTS}/gpu4" in health and f"{ENDPOINTS}/gpu0" not in health

    cleared = _step(client, emu.reset_faults)
    assert {f"{PORTS}?$expand=.($levels=2)", f"{ENDPOINTS}/gpu4"} <= cleared

    # a memory device's endpoint names the connection of each of its chunks
    made: list[str] = []

    def connect() -> None:
        answer = client.post(CONNECTIONS, json=connection_body("kind-worker4", "cxlmem0", 0))
        assert answer.status_code == 201, answer.text
        made.append(answer.headers["Location"])

    connected = _step(client, connect)
    assert "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem0" in connected
    assert "/redfish/v1/Fabrics/CXL/Endpoints?$expand=.($levels=1)" in connected
    assert f"{ENDPOINTS}/gpu0" not in connected
    disconnected = _step(client, lambda: client.delete(made[0]).raise_for_status())
    assert "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem0" in disconnected

    unbound = _step(client, lambda: _post(client, zone_remove("kind-worker", "gpu0")))
    assert f"{ZONES}?$expand=.($levels=1)&$select=Id" in unbound
    assert _revalidate(client, _read_all(client)) == set()


def test_an_answer_kept_through_many_changes_elsewhere(tmp_path: Path) -> None:
    """An expanded answer kept while other parts of the fabric change many times over is still
    304 when it is the same, and 200 the first time one of its members differs."""
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        listing = f"{PORTS}?$expand=.($levels=2)"
        first = client.get(listing)
        for _ in range(3):
            _post(client, zone_add("kind-worker3", "gpu5"))
            _post(client, zone_remove("kind-worker3", "gpu5"))
            assert client.get(listing, headers={"If-None-Match": first.headers["ETag"]}).status_code == 304
        emu.inject({"Kind": "PCIeErrors", "Device": "gpu3", "CorrectableErrorCount": 2})
        after = client.get(listing, headers={"If-None-Match": first.headers["ETag"]})
        assert after.status_code == 200 and after.json() != first.json()
        emu.reset_faults()
        # the counters are cleared: the same body as at first, so the first ETag again
        assert client.get(listing, headers={"If-None-Match": first.headers["ETag"]}).status_code == 304
