"""What one attach and detach through the zone backend reads does not grow with the bindings.

Issue 16's acceptance: attach p50 at 10,000 bindings within 20 % of that at 10. The read before a
bind used to be the Zones collection with every zone inline, ~60 bytes per binding of the whole
fabric; now it is each zone's ETag (``$expand`` + ``$select``) and a GET of the zones that changed
since they were last read. Here the same attach+detach cycle runs at N and at 10N bindings of a
generated fabric, every request it makes recorded: the same requests, and the same bytes but for
the host's own zone (it holds the host's devices, and its ETag is what the bind sends).

Real processes: the emulator on a generated topology (10 hosts, 230 GPUs); the zone backend in
this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from bench.common import generate_topology, host_name
from fabric.backends.base import Backend, BindContext
from fabric.backends.discovery import Discovery
from fabric.backends.zones import ZoneBackend
from fabric.redfish.client import RedfishClient, RedfishResponse, RedfishSettings
from fabric.state.model import DeviceRecord, HostRecord
from fabric_dra_testbed.stack import Emulator as RunningEmulator
from tests.support.emulator import ZONES, run_emulator, zone_add

pytestmark = pytest.mark.slow(seconds=33)

HOSTS = 10
#: bindings of the first measure; the second has ten times as many
FEW = 20

Request = tuple[str, str, int]


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    tmp = tmp_path_factory.mktemp("flat")
    topology = generate_topology(tmp / "topology.yaml", hosts=HOSTS, gpus=10 * FEW + 30)
    with run_emulator(tmp, topology=topology, extra_args=["--insecure-no-auth"]) as running:
        yield running


@contextlib.asynccontextmanager
async def _zone_backend(emu: RunningEmulator) -> AsyncIterator[tuple[RedfishClient, Backend, Discovery]]:
    client = RedfishClient(RedfishSettings(base_url=emu.url, auth="none"))
    try:
        discovery = Discovery(client)
        snapshot = await discovery.scan()
        probe = next(d for d in snapshot.devices if d.name == "gpu0")
        yield client, discovery.backend_for(probe), discovery
    finally:
        await client.aclose()


def _recording(client: RedfishClient) -> list[Request]:
    """Every request ``client`` makes from now on: (method, URI, bytes of the answer)."""
    log: list[Request] = []
    send = client.request

    async def recorded(method: str, uri: str, **kwargs: Any) -> RedfishResponse:
        response = await send(method, uri, **kwargs)
        log.append((method, uri, response.size))
        return response

    client.request = recorded
    return log


async def _bind_directly(client: RedfishClient, devices: range) -> None:
    """Bind ``gpu{i}`` to host ``i % HOSTS`` through the emulator, as another client would."""
    gate = asyncio.Semaphore(8)

    async def one(index: int) -> None:
        async with gate:
            uri, body = zone_add(host_name(index % HOSTS), f"gpu{index}")
            await client.post(uri, body)

    await asyncio.gather(*(one(i) for i in devices))


async def _cycle(backend: Backend, device: DeviceRecord, host: HostRecord) -> None:
    """An attach and a detach as the manager runs them (fabric.driver.attempts)."""
    ctx = BindContext(deadline=time.monotonic() + 30, fence=lambda: None, action="bind")
    current, _ = await asyncio.gather(
        backend.read_binding(device, (host,)), backend.prepare_bind(device, host)
    )
    assert current == ()
    await backend.bind(device, host, ctx)
    assert await backend.confirmed(device, host, bound=True)
    assert await backend.read_binding(device, (host,)) == (host.id,)
    await backend.unbind(device, host, ctx)
    assert await backend.confirmed(device, host, bound=False)


async def test_an_attach_reads_the_same_at_ten_times_the_bindings(emu: RunningEmulator) -> None:
    async with _zone_backend(emu) as (client, backend, discovery):
        snapshot = await discovery.scan()
        devices = {d.name: d for d in snapshot.devices}
        probe, host = devices["gpu0"], snapshot.hosts[host_name(0)]
        own_zone = f"{ZONES}/{host.id}"
        measured: list[list[Request]] = []
        for bindings, first in ((FEW, 1), (10 * FEW, FEW + 1)):
            await _bind_directly(client, range(first, bindings + 1))
            await _cycle(backend, probe, host)  # the zones that changed are read once more
            send = client.request
            log = _recording(client)
            await _cycle(backend, probe, host)
            client.request = send
            measured.append(log)
        few, many = measured
        assert sorted((m, u) for m, u, _ in few) == sorted((m, u) for m, u, _ in many)
        assert any("$select" in u for _, u, _ in many), "the Zones collection is read for its ETags"

        def elsewhere(log: list[Request]) -> int:
            return sum(size for _, uri, size in log if uri != own_zone)

        # the host's own zone holds its devices (2, then 20): only its reads may grow
        assert elsewhere(many) <= elsewhere(few) * 1.02, (few, many)
        assert sum(s for _, _, s in many) < sum(s for _, _, s in few) + 10 * 60 * len(many), (few, many)


async def test_the_etag_listing_and_the_expanded_collection_agree(emu: RunningEmulator) -> None:
    """Whichever way the zones are read — the ETag listing with the zones that changed, or every
    zone inline (a service without ``$select``) — a device's binding reads the same."""
    async with _zone_backend(emu) as (client, backend, discovery):
        await _bind_directly(client, range(10 * FEW + 1, 10 * FEW + 11))
        snapshot = await discovery.scan()
        hosts = list(snapshot.hosts.values())
        named = {d.name: d for d in snapshot.devices}
        devices = [named[f"gpu{i}"] for i in (0, *range(10 * FEW + 1, 10 * FEW + 21))]
        assert isinstance(backend, ZoneBackend) and backend.select, "the emulator advertises $select"
        with_select = [await backend.read_binding(d, hosts) for d in devices]
        backend.select = False
        inline = [await backend.read_binding(d, hosts) for d in devices]
        assert with_select == inline
        assert any(with_select) and not all(with_select), "some of them bound, some not"
