"""Discovery of a large fabric reads collections, and revalidates with ETags (issue 37).

Real processes: two emulators on the same generated topology (6 hosts, 60 GPUs, 12 NVMe drives,
24 of the devices bound), one serving ``$expand`` (three levels) and ETags as by default, one with
``behaviour: {expand: unsupported, etags: omitted}`` — a service that offers neither, read one
member at a time and in full every pass. Discovery runs in this process; every request it makes
is recorded.

* the two services give the same inventory (devices, their attributes, bindings, hosts);
* with ``$expand`` the first pass makes a few requests per switch, not several per device;
* the second full pass over the unchanged expanding service is answered 304 for everything but
  the service root, and not one view is made again; after a bind, what changed is read again;
* the service without either still gives the whole inventory, with a GET per member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.common import generate_topology, host_name
from fabric.backends.discovery import Discovery
from fabric.backends.views import View
from fabric.redfish.client import RedfishClient, RedfishResponse, RedfishSettings
from fabric.state.model import FabricSnapshot
from fabric_dra_testbed.stack import Emulator as RunningEmulator
from tests.support.emulator import run_emulator, with_behaviour, zone_add

HOSTS = 6
GPUS = 60
NVME = 12
BOUND = 24


def _topology(tmp: Path, **behaviour: str) -> Path:
    path = generate_topology(tmp / "generated.yaml", hosts=HOSTS, gpus=GPUS, nvme=NVME)
    return with_behaviour(path, tmp / "topology.yaml", **behaviour)


def _bind(emu: RunningEmulator, devices: list[str]) -> None:
    async def go() -> None:
        client = RedfishClient(RedfishSettings(base_url=emu.url, auth="none"))
        try:
            for index, device in enumerate(devices):
                uri, body = zone_add(host_name(index % HOSTS), device)
                await client.post(uri, body)
        finally:
            await client.aclose()

    asyncio.run(go())


@pytest.fixture(scope="module")
def expanding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    tmp = tmp_path_factory.mktemp("expanding")
    with run_emulator(tmp, topology=_topology(tmp), extra_args=["--insecure-no-auth"]) as emu:
        _bind(emu, [f"gpu{i}" for i in range(1, BOUND + 1)])
        yield emu


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    tmp = tmp_path_factory.mktemp("plain")
    topology = _topology(tmp, expand="unsupported", etags="omitted")
    with run_emulator(tmp, topology=topology, extra_args=["--insecure-no-auth"]) as emu:
        _bind(emu, [f"gpu{i}" for i in range(1, BOUND + 1)])
        yield emu


class Recorder:
    """Every GET a client makes: (URI, status, If-None-Match sent)."""

    def __init__(self, client: RedfishClient) -> None:
        self.gets: list[tuple[str, int, bool]] = []
        send = client.get

        async def recorded(uri: str, *, if_none_match: str | None = None) -> RedfishResponse:
            response = await send(uri, if_none_match=if_none_match)
            self.gets.append((uri, response.status, if_none_match is not None))
            return response

        client.get = recorded  # type: ignore[method-assign]

    def take(self) -> list[tuple[str, int, bool]]:
        taken, self.gets = self.gets, []
        return taken


def _inventory(snapshot: FabricSnapshot) -> dict[str, Any]:
    """What a pass found, comparable across services (ETags left out: one service has none)."""
    return {
        "devices": sorted(
            (
                d.name,
                d.key,
                d.fabric,
                str(d.style),
                d.bound_hosts,
                d.reachable_hosts,
                d.attributes.model_dump_json(),
            )
            for d in snapshot.devices
        ),
        "hosts": sorted(
            (h.id, h.uri, h.uuid, tuple(sorted(h.initiators.items()))) for h in snapshot.hosts.values()
        ),
        "fabrics": sorted(snapshot.fabrics),
    }


async def _passes(
    emu: RunningEmulator, count: int, between: Any = None
) -> tuple[list[FabricSnapshot], list[Any]]:
    client = RedfishClient(RedfishSettings(base_url=emu.url, auth="none"))
    recorder = Recorder(client)
    snapshots, reads = [], []
    try:
        discovery = Discovery(client)
        for index in range(count):
            if between is not None and index:
                await between(client, index)
                recorder.take()
            snapshots.append(await discovery.scan())
            reads.append(recorder.take())
    finally:
        await client.aclose()
    return snapshots, reads


def test_expand_and_member_reads_give_the_same_inventory(
    expanding: RunningEmulator, plain: RunningEmulator
) -> None:
    (fast,), (fast_reads,) = asyncio.run(_passes(expanding, 1))
    (slow,), (slow_reads,) = asyncio.run(_passes(plain, 1))
    assert len(fast.devices) == GPUS + NVME
    assert sum(1 for d in fast.devices if d.bound_hosts) == BOUND
    assert _inventory(fast) == _inventory(slow)
    # the service without $expand: every device's resources read one by one
    assert not any("$expand" in uri for uri, _, _ in slow_reads)
    assert len(slow_reads) > 3 * (GPUS + NVME)
    # with it: the members come inline, a handful of collections per switch
    assert any("$levels=3" in uri for uri, _, _ in fast_reads)
    assert len(fast_reads) < (GPUS + NVME) // 2, sorted(uri for uri, _, _ in fast_reads)
    assert not any("/PCIeFunctions/" in uri and "$expand" not in uri for uri, _, _ in fast_reads)


def test_an_unchanged_fabric_is_revalidated_not_read(expanding: RunningEmulator) -> None:
    validated: list[int] = [0]
    original = View.model_validate.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, *args: Any, **kwargs: Any) -> Any:
        validated[-1] += 1
        return original(cls, *args, **kwargs)

    async def next_pass(client: RedfishClient, index: int) -> None:
        validated.append(0)

    View.model_validate = classmethod(counting)  # type: ignore[method-assign, assignment]
    try:
        (first, second), (reads, again) = asyncio.run(_passes(expanding, 2, next_pass))
    finally:
        View.model_validate = classmethod(original)  # type: ignore[method-assign, assignment]
    assert _inventory(first) == _inventory(second)
    assert all(status == 200 for _, status, _ in reads)
    # every request of the second pass but the service root's probe asks If-None-Match, and is 304
    asked = [(uri, status) for uri, status, conditional in again if conditional]
    assert asked and len(asked) == len(again) - 1, again
    assert all(status == 304 for _, status in asked), [a for a in asked if a[1] != 304]
    assert second.not_modified == len(asked)
    # what 304 gave back is not read into views again: a few collection pages and the root only
    assert validated[0] > GPUS + NVME
    assert validated[1] < 20, validated


def test_a_change_is_read_again(expanding: RunningEmulator) -> None:
    device = f"gpu{BOUND + 1}"

    async def bind(client: RedfishClient, index: int) -> None:
        uri, body = zone_add(host_name(0), device)
        await client.post(uri, body)

    (before, after), (_, again) = asyncio.run(_passes(expanding, 2, bind))
    assert next(d for d in before.devices if d.name == device).bound_hosts == ()
    assert next(d for d in after.devices if d.name == device).bound_hosts == (host_name(0),)
    changed = {uri for uri, status, _ in again if status == 200}
    # the endpoints (their zones' links) and zones changed; the devices' own resources did not
    assert any("/Zones" in uri for uri in changed), changed
    assert not any("/Chassis/" in uri for uri in changed), changed
    assert after.not_modified > 0
