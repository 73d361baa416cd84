"""How the zone backend reads the fabric's zones, and that what it reads still confirms each change.

* Where the service offers ``$expand`` and ``$select`` (the service root's
  ``ProtocolFeaturesSupported``) and many zones changed since they were last read, the Zones
  collection is read once with every zone inline instead of a GET per changed zone; the read after
  that goes straight to it, and a read that finds few zones changed goes back to the ETag listing.
* Where the service does not offer ``$expand`` (the emulator's quirk profile ``expand:
  unsupported``), the collection's member links and a GET of each zone, as before.
* Either way a bind or an unbind is confirmed only by what the fabric shows when read after it:
  a bind the fabric does not hold when read (another client took it back at once, as a service that
  answers an action it did not apply would leave it) is not confirmed, nor an unbind undone.

Real processes: the emulator on a generated topology (6 hosts, 40 GPUs); the zone backend in this
process, its GETs recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bench.common import generate_topology, host_name
from fabric.backends.base import BindContext
from fabric.backends.discovery import Discovery
from fabric.backends.zones import ZoneBackend
from fabric.redfish.client import RedfishClient, RedfishResponse, RedfishSettings
from fabric.state.model import FabricSnapshot
from tests.support.emulator import ZONES, run_emulator, with_behaviour, zone_add

pytestmark = pytest.mark.slow(seconds=25)

HOSTS = 6
INLINE = f"{ZONES}?$expand=.($levels=1)"
LISTING = f"{ZONES}?$expand=.($levels=1)&$select=Id"


def _topology(tmp: Path, **behaviour: str) -> Path:
    path = generate_topology(tmp / "generated.yaml", hosts=HOSTS, gpus=40)
    return with_behaviour(path, tmp / "topology.yaml", **behaviour)


class _Fabric:
    """The zone backend of a running emulator, discovered, with every GET it makes recorded."""

    def __init__(self, client: RedfishClient, backend: ZoneBackend, snapshot: FabricSnapshot) -> None:
        self.client = client
        self.backend = backend
        self.devices = {d.name: d for d in snapshot.devices}
        self.hosts = snapshot.hosts
        self.gets: list[str] = []
        get = client.get

        async def recorded(uri: str, *, if_none_match: str | None = None) -> RedfishResponse:
            self.gets.append(uri)
            return await get(uri, if_none_match=if_none_match)

        client.get = recorded  # type: ignore[method-assign]

    def zone_gets(self) -> list[str]:
        """The GETs of the Zones collection and its zones since the last call."""
        gets, self.gets = self.gets, []
        return [u for u in gets if u.startswith(ZONES)]

    async def bind_elsewhere(self, pairs: list[tuple[int, str]]) -> None:
        """Bind each ``(host index, device)`` as another client of the service would."""
        for host, device in pairs:
            uri, body = zone_add(host_name(host), device)
            await self.client.post(uri, body)

    async def unbind_elsewhere(self, host: int, device: str) -> None:
        await self.client.post(
            f"{ZONES}/{host_name(host)}/Actions/Zone.RemoveEndpoint",
            {"Endpoint": {"@odata.id": self.devices[device].endpoint}},
        )

    async def binding(self, device: str) -> tuple[str, ...]:
        return await self.backend.read_binding(self.devices[device], (self.hosts[host_name(0)],))


@contextlib.asynccontextmanager
async def _fabric(tmp: Path, **behaviour: str) -> AsyncIterator[_Fabric]:
    with run_emulator(tmp, topology=_topology(tmp, **behaviour), extra_args=["--insecure-no-auth"]) as emu:
        client = RedfishClient(RedfishSettings(base_url=emu.url, auth="none"))
        try:
            discovery = Discovery(client)
            snapshot = await discovery.scan()
            backend = discovery.backend_for(next(d for d in snapshot.devices if d.name == "gpu0"))
            assert isinstance(backend, ZoneBackend)
            yield _Fabric(client, backend, snapshot)
        finally:
            await client.aclose()


def _context(action: str) -> BindContext:
    return BindContext(deadline=time.monotonic() + 30, fence=lambda: None, action=action)


async def test_many_zones_changed_are_read_inline_where_the_service_offers_it(tmp_path: Path) -> None:
    async with _fabric(tmp_path) as fabric:
        assert fabric.backend.select and fabric.backend.expand, "the emulator advertises both"
        await fabric.bind_elsewhere([(h, f"gpu{10 + h}") for h in range(HOSTS)])  # every host's zone
        fabric.zone_gets()
        assert await fabric.binding("gpu13") == (host_name(3),)
        # the listing shows every zone changed: the collection inline, not a GET of each zone
        assert fabric.zone_gets() == [LISTING, INLINE]
        await fabric.bind_elsewhere([(h, f"gpu{20 + h}") for h in range(HOSTS)])
        assert await fabric.binding("gpu24") == (host_name(4),)
        assert fabric.zone_gets() == [INLINE], "after many changed, straight to the zones inline"
        assert await fabric.binding("gpu24") == (host_name(4),)
        assert fabric.zone_gets() == [INLINE], "that read found none changed ..."
        await fabric.bind_elsewhere([(1, "gpu31")])
        assert await fabric.binding("gpu31") == (host_name(1),)
        # ... so this one lists the ETags and reads the one zone that changed
        assert fabric.zone_gets() == [LISTING, f"{ZONES}/{host_name(1)}"]
        assert await fabric.binding("gpu0") == ()


async def test_without_expand_each_zone_is_read_on_its_own(tmp_path: Path) -> None:
    async with _fabric(tmp_path, expand="unsupported") as fabric:
        assert not fabric.backend.expand and not fabric.backend.select
        await fabric.bind_elsewhere([(h, f"gpu{10 + h}") for h in range(HOSTS)])
        fabric.zone_gets()
        assert await fabric.binding("gpu13") == (host_name(3),)
        gets = fabric.zone_gets()
        assert gets[0] == ZONES and not any("$" in u for u in gets), gets
        assert {f"{ZONES}/{host_name(h)}" for h in range(HOSTS)} <= set(gets[1:]), gets


@pytest.mark.parametrize("behaviour", [{}, {"expand": "unsupported"}], ids=["inline", "zone-by-zone"])
async def test_a_change_the_fabric_does_not_hold_is_not_confirmed(
    tmp_path: Path, behaviour: dict[str, Any]
) -> None:
    async with _fabric(tmp_path, **behaviour) as fabric:
        backend, host, device = fabric.backend, fabric.hosts[host_name(0)], fabric.devices["gpu5"]
        await fabric.bind_elsewhere([(h, f"gpu{10 + h}") for h in range(1, HOSTS)])  # many changed
        assert await backend.read_binding(device, (host,)) == ()
        await backend.bind(device, host, _context("bind"))
        await fabric.unbind_elsewhere(0, "gpu5")  # taken back before anyone read it
        assert not await backend.confirmed(device, host, bound=True)
        assert await backend.confirmed(device, host, bound=False)

        await backend.bind(device, host, _context("bind"))
        assert await backend.confirmed(device, host, bound=True)
        await backend.unbind(device, host, _context("unbind"))
        await fabric.bind_elsewhere([(0, "gpu5")])  # bound again before anyone read it
        assert not await backend.confirmed(device, host, bound=False)
        assert await backend.confirmed(device, host, bound=True)


async def test_concurrent_reads_share_one_and_each_sees_what_came_before_it(tmp_path: Path) -> None:
    async with _fabric(tmp_path) as fabric:
        names = [f"gpu{10 + i}" for i in range(12)]
        await fabric.bind_elsewhere([(i % HOSTS, name) for i, name in enumerate(names)])
        fabric.zone_gets()
        shared = fabric.backend.reads.shared
        sent, answered = shared.sent, shared.answered
        found = await asyncio.gather(*(fabric.binding(name) for name in names))
        assert list(found) == [(host_name(i % HOSTS),) for i in range(len(names))]
        assert shared.answered - answered == len(names)
        assert shared.sent - sent < len(names), "callers that asked together shared a read"
        # each read: the ETag listing, and the zones inline when many changed
        assert len([u for u in fabric.zone_gets() if u.startswith(f"{ZONES}?")]) <= 2 * (shared.sent - sent)
        # a caller that asks after a change sees it, even with a read under way that began before
        first = asyncio.ensure_future(fabric.binding("gpu10"))
        await asyncio.sleep(0)  # that read is sent ...
        await fabric.unbind_elsewhere(0, "gpu10")  # ... and the fabric changes under it
        assert await fabric.binding("gpu10") == ()
        assert await first in ((), (host_name(0),))
