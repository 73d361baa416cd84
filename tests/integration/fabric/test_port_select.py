"""A switch's ports are read with ``$select`` where the service serves it, in full where not (issue 37).

Real processes: an emulator on a generated topology (6 hosts, 60 GPUs, 12 NVMe drives, some bound,
one device's port counting PCIe errors) serving ``$expand`` and ``$select``, and one with
``behaviour: {expand: unsupported}`` (neither). Discovery runs in this process; every GET it makes
is recorded.

* the emulator answers the selected read as DSP0266 says: each port its ``Id`` and ``Metrics``
  with the metrics' ``Id`` and ``PCIeErrors``, the ``@odata`` annotations kept, an ETag of its own
  that ``If-None-Match`` is answered 304 to;
* discovery asks for the ports with :data:`~fabric.backends.describe.PORT_SELECT` where the service
  root advertises ``SelectQuery``, with the plain expanded read where it does not (the root's
  advertisement masked), where the service refuses the query, and one by one without ``$expand``;
  the inventories (every device with its attributes, PCIe error counters included) are the same;
* the next pass revalidates the selected reads: 304, the devices taken as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fabric.backends.describe import PORT_SELECT
from fabric.backends.discovery import Discovery
from fabric.backends.views import ServiceRoot
from fabric.redfish.client import RedfishClient, RedfishSettings
from fabric.state.model import FabricSnapshot
from fabric_dra_testbed.stack import Emulator as RunningEmulator
from tests.integration.fabric.test_discovery_collections import Recorder, _bind, _inventory, _topology
from tests.support.emulator import run_emulator

PORTS = "/redfish/v1/Fabrics/PCIe/Switches/switch0/Ports"
SELECTED = f"{PORTS}?$expand=.($levels=2)&$select={PORT_SELECT}"
FULL = f"{PORTS}?$expand=.($levels=2)"
#: the device whose switch port counts errors (so a read that lost the counters gives another inventory)
FAULTY = "gpu3"


@pytest.fixture(scope="module")
def expanding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    tmp = tmp_path_factory.mktemp("selecting")
    with run_emulator(tmp, topology=_topology(tmp), extra_args=["--insecure-no-auth"]) as emu:
        _bind(emu, [f"gpu{i}" for i in range(1, 9)])
        emu.inject({"Kind": "PCIeErrors", "Device": FAULTY, "CorrectableErrorCount": 3, "ReplayCount": 2})
        yield emu


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    tmp = tmp_path_factory.mktemp("plain")
    with run_emulator(
        tmp, topology=_topology(tmp, expand="unsupported"), extra_args=["--insecure-no-auth"]
    ) as emu:
        _bind(emu, [f"gpu{i}" for i in range(1, 9)])
        emu.inject({"Kind": "PCIeErrors", "Device": FAULTY, "CorrectableErrorCount": 3, "ReplayCount": 2})
        yield emu


def _port_reads(gets: list[tuple[str, int, bool]]) -> list[tuple[str, int, bool]]:
    return [g for g in gets if "/Switches/" in g[0] and "/Ports" in g[0]]


async def _passes(
    emu: RunningEmulator, count: int = 1, refusals: list[str] | None = None
) -> tuple[list[FabricSnapshot], list[Any]]:
    client = RedfishClient(RedfishSettings(base_url=emu.url, auth="none"))
    recorder = Recorder(client)
    if refusals is not None:
        # the service refuses the selection: the same request with a malformed $select (400)
        send = client.get

        async def refusing(uri: str, *, if_none_match: str | None = None) -> Any:
            if f"$select={PORT_SELECT}" in uri:
                refusals.append(uri)
                uri = uri.replace(f"$select={PORT_SELECT}", "$select=Metrics/(bad")
            return await send(uri, if_none_match=if_none_match)

        client.get = refusing  # type: ignore[method-assign]
    snapshots, reads = [], []
    try:
        discovery = Discovery(client)
        for _ in range(count):
            snapshots.append(await discovery.scan())
            reads.append(recorder.take())
    finally:
        await client.aclose()
    return snapshots, reads


def test_the_emulator_answers_the_selected_read_with_its_own_etag(expanding: RunningEmulator) -> None:
    with httpx.Client(base_url=expanding.url) as http:
        root = http.get("/redfish/v1").json()["ProtocolFeaturesSupported"]
        assert root["SelectQuery"] is True
        full, selected = http.get(FULL), http.get(SELECTED)
        assert full.status_code == selected.status_code == 200
        ports = selected.json()["Members"]
        assert len(ports) == len(full.json()["Members"]) > 1
        with_metrics = [p for p in ports if "Metrics" in p]
        assert with_metrics, ports[0]
        for port in ports:
            assert set(port) - {"Id", "Metrics"} <= {k for k in port if k.startswith("@odata.")}, port
            assert port["Id"] and port["@odata.id"].startswith(PORTS + "/")
        for port in with_metrics:
            metrics = port["Metrics"]
            assert set(metrics) - {"Id", "PCIeErrors"} <= {k for k in metrics if k.startswith("@odata.")}
            assert metrics["Id"] and metrics["@odata.id"] and len(metrics["PCIeErrors"]) == 8, metrics
        assert len(selected.content) < len(full.content) * 3 // 4
        # an answer of its own: its ETag, 304 to it, 200 to the full answer's
        tag = selected.headers["ETag"]
        assert tag and tag != full.headers["ETag"]
        assert http.get(SELECTED, headers={"If-None-Match": tag}).status_code == 304
        assert http.get(SELECTED, headers={"If-None-Match": full.headers["ETag"]}).status_code == 200


def test_ports_are_selected_where_offered_and_read_in_full_where_not(
    expanding: RunningEmulator, plain: RunningEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    (selecting,), (selecting_reads,) = asyncio.run(_passes(expanding))
    refusals: list[str] = []
    (refused,), (refused_reads,) = asyncio.run(_passes(expanding, refusals=refusals))
    (one_by_one,), (plain_reads,) = asyncio.run(_passes(plain))
    monkeypatch.setattr(ServiceRoot, "supports_select", property(lambda self: False))
    (full,), (full_reads,) = asyncio.run(_passes(expanding))

    ports = _port_reads(selecting_reads)
    assert ports and all(f"$select={PORT_SELECT}" in uri and status == 200 for uri, status, _ in ports), ports
    full_ports = _port_reads(full_reads)
    assert full_ports and all(uri.endswith("$expand=.($levels=2)") for uri, _, _ in full_ports), full_ports
    assert len(full_ports) == len(ports)
    # refused (400: not recorded, the client raised), then every switch's ports read in full
    assert refusals
    refused_ports = [uri for uri, status, _ in _port_reads(refused_reads) if status == 200]
    assert len(refused_ports) == len(ports) and all(u.endswith("$expand=.($levels=2)") for u in refused_ports)
    assert not any("$" in uri for uri, _, _ in _port_reads(plain_reads))

    faulty = next(d for d in selecting.devices if d.name == FAULTY)
    assert faulty.attributes.pcie_errors is not None and faulty.attributes.pcie_errors.correctable == 3
    assert len(selecting.devices) > 60
    assert _inventory(selecting) == _inventory(full) == _inventory(refused) == _inventory(one_by_one)


def test_the_selected_reads_are_revalidated(expanding: RunningEmulator) -> None:
    (first, second), (_, again) = asyncio.run(_passes(expanding, 2))
    ports = _port_reads(again)
    assert ports and all(f"$select={PORT_SELECT}" in uri for uri, _, _ in ports), ports
    assert all(asked and status == 304 for _, status, asked in ports), ports
    assert _inventory(first) == _inventory(second)
