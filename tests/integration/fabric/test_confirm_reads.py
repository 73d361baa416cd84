"""What confirms a change, read after it (issue 15's rule), and what it costs.

A bind is proven by one zone: the zone it changed, listed in the fabric's Zones collection and
holding the device's endpoint and the host's initiator, read after the change — not by every zone
of the fabric inline (that read grows with every device bound anywhere). When that zone does not
show the binding, the whole collection decides, as it does for every unbind. On a CXL fabric the
connection the bind created plays the zone's part.

Real processes: the emulator (packaged topology, ``$expand`` served); the zone backend in this
process, its GETs recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fabric.backends.base import Backend, BindContext
from fabric.backends.discovery import Discovery
from fabric.redfish.client import RedfishClient, RedfishResponse, RedfishSettings
from fabric.state.model import DeviceRecord, HostRecord
from tests.support.emulator import run_emulator

ZONES = "/redfish/v1/Fabrics/PCIe/Zones"
HOST = "kind-worker"


Fixture = tuple[RedfishClient, Backend, DeviceRecord, HostRecord, list[str]]


@pytest.fixture
async def zone_fabric(tmp_path: Path) -> AsyncIterator[Fixture]:
    """(client, the zone backend, gpu0, kind-worker, the URIs of every GET from now on)."""
    async with _fabric(tmp_path, "gpu0") as found:
        yield found


@contextlib.asynccontextmanager
async def _fabric(tmp_path: Path, device: str) -> AsyncIterator[Fixture]:
    with run_emulator(tmp_path, extra_args=["--insecure-no-auth"]) as emulator:
        client = RedfishClient(RedfishSettings(base_url=emulator.url, auth="none"))
        try:
            discovery = Discovery(client)
            snapshot = await discovery.scan()
            record = next(d for d in snapshot.devices if d.name == device)
            reads: list[str] = []
            get = client.get

            async def recorded(uri: str, *, if_none_match: str | None = None) -> RedfishResponse:
                reads.append(uri)
                return await get(uri, if_none_match=if_none_match)

            client.get = recorded  # type: ignore[method-assign]
            yield client, discovery.backend_for(record), record, snapshot.hosts[HOST], reads
        finally:
            await client.aclose()


def _context() -> BindContext:
    return BindContext(deadline=time.monotonic() + 30, fence=lambda: None, action="bind")


async def test_a_bind_is_confirmed_by_the_zone_it_changed(
    zone_fabric: Fixture,
) -> None:
    _client, backend, record, host, reads = zone_fabric
    assert await backend.read_binding(record, (host,)) == ()
    await backend.bind(record, host, _context())
    reads.clear()
    assert await backend.confirmed(record, host, bound=True)
    # the zones' ETags (the emulator serves $select) and the zone the bind changed, each read after
    # the change; no zone inline
    assert sorted(reads) == sorted([f"{ZONES}?$expand=.($levels=1)&$select=Id", f"{ZONES}/{HOST}"])
    assert not await backend.confirmed(record, host, bound=False)


async def test_a_zone_that_does_not_show_the_bind_leaves_it_to_the_whole_collection(
    zone_fabric: Fixture,
) -> None:
    """The service took the bind, then the device left the zone (another client, or a service
    that undid it): the zone no longer proves the binding, and the full read says unbound."""
    client, backend, record, host, reads = zone_fabric
    await backend.read_binding(record, (host,))
    await backend.bind(record, host, _context())
    await client.post(
        f"{ZONES}/{HOST}/Actions/Zone.RemoveEndpoint", {"Endpoint": {"@odata.id": record.endpoint}}
    )
    reads.clear()
    assert not await backend.confirmed(record, host, bound=True)
    assert any(u.startswith(f"{ZONES}?$expand=") for u in reads), reads
    assert await backend.confirmed(record, host, bound=False)


async def test_a_bind_is_confirmed_by_the_connection_it_created(tmp_path: Path) -> None:
    async with _fabric(tmp_path, "cxlmem1-chunk2") as (_client, backend, record, host, reads):
        assert await backend.read_binding(record, (host,)) == ()
        await backend.bind(record, host, _context())
        reads.clear()
        assert await backend.confirmed(record, host, bound=True)
        # the fabric, its Connections collection's member links, the new connection: none inline
        assert len(reads) == 3 and not any("$expand" in u for u in reads), reads
        assert reads[0] == "/redfish/v1/Fabrics/CXL"
        assert not await backend.confirmed(record, host, bound=False)
