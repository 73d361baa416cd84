"""Redfish services that behave unlike the emulator's default: the manager stays correct.

Each test starts the emulator with a ``behaviour`` of its topology (docs/emulator.md
"Behaviours") that makes it act like a kind of service met in the wild, runs the real manager
against it over TLS, and checks the emulator's own binding table — the ground truth — after every
answer the manager gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulator.topology import default_topology_path
from manager_api.client import ManagerClient
from manager_api.models import AttachmentState, BindingState
from tests.integration.fabric.conftest import (
    NODES,
    FabricAdmin,
    Tls,
    manager_for,
    plugin_token,
    tls_emulator,
)
from tests.support.uids import claim_uid


@contextlib.asynccontextmanager
async def wild_service(
    tmp: Path, tls: Tls, node: str, manager_flags: Sequence[str], **behaviour: Any
) -> AsyncIterator[tuple[FabricAdmin, ManagerClient]]:
    """An emulator with ``behaviour`` over TLS, a manager in front of it started with
    ``manager_flags``, and a client with ``node``'s plugin token."""
    with (
        tls_emulator(tmp / "fabric", tls, topology=topology_with(tmp, **behaviour)) as fabric,
        manager_for(fabric, tmp / "manager", *manager_flags) as manager,
    ):
        async with ManagerClient(manager.address, token=plugin_token(node)) as plugin:
            yield fabric, plugin


def topology_with(tmp: Path, **behaviour: Any) -> Path:
    """The default topology with ``behaviour`` options (camelCase keys, as in the file)."""
    data = yaml.safe_load(default_topology_path().read_text())
    data["behaviour"] = behaviour
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# (style, device in the inventory, target in the emulator's table)
STYLES = [
    ("zone", "gpu0", "gpu0"),
    ("connection", "cxlmem1-chunk2", "cxlmem1-chunk2"),
]
#: cycles per profile in the suite; the acceptance runs (200 zone, 50 connection cycles with stale
#: links) are ``python -m bench --only wild`` (bench/wild_bench.py)
CYCLES = 20


@dataclass
class LinkCycles:
    """What ``cycles`` attach/detach pairs against a service with stale or omitted endpoint links
    showed, checked against the emulator's binding table after every answer."""

    cycles: int
    seconds: float
    #: "attached" answers while the fabric did not hold exactly that binding
    wrong_attach: int
    #: "detached" answers while the fabric still held a binding
    wrong_detach: int
    left_bound: dict[str, str]
    #: the device's state in the manager's inventory afterwards
    state: BindingState
    #: devices the manager reports as bound outside fabric-dra afterwards
    outside: list[str]


async def link_cycles(
    tmp: Path, tls: Tls, *, style: str, links: str, expand: str, device: str, target: str, cycles: int
) -> LinkCycles:
    """``cycles`` attach/detach pairs of ``device`` on the first node through a manager in front of
    an emulator whose endpoints' Links.Zones / Links.Connections are ``links`` ("stale" or
    "omitted"), collections expanded or not (``expand``: "served" or "unsupported"; a service
    without ``$expand`` sends no ETags either)."""
    node = NODES[0]
    flags = ("--binding-style", style)
    # a service without $expand here has no ETags either: it offers neither (issue 37)
    etags = "omitted" if expand == "unsupported" else "served"
    behaviour = {"endpointLinks": links, "expand": expand, "etags": etags}
    async with wild_service(tmp, tls, node, flags, **behaviour) as (fabric, plugin):
        wrong_detach = wrong_attach = done = 0
        started = time.monotonic()
        for cycle in range(cycles):
            claim = claim_uid(f"claim-{cycle}")
            attached = await plugin.attach(device, node, claim, wait_seconds=20)
            assert attached.state == AttachmentState.ATTACHED
            wrong_attach += fabric.bound_hosts() != {target: node}
            detached = await plugin.detach(device, node, claim, wait_seconds=20)
            assert detached.state == AttachmentState.DETACHED
            wrong_detach += fabric.bound_hosts() != {}
            done += 1
            if wrong_detach:
                break
        elapsed = time.monotonic() - started
        inventory = await plugin.inventory()
        found = {d.name: d for d in inventory.devices}
        return LinkCycles(
            cycles=done,
            seconds=elapsed,
            wrong_attach=wrong_attach,
            wrong_detach=wrong_detach,
            left_bound=fabric.bound_hosts(),
            state=found[device].state,
            outside=[d.name for d in inventory.devices if not d.managed and d.state is BindingState.BOUND],
        )


@pytest.mark.slow(seconds=34)  # the whole module's
@pytest.mark.parametrize(
    ("links", "expand"),
    # "unsupported": collections are read member by member and in full every pass, the fallback of
    # services without $expand and ETags
    [("stale", "served"), ("omitted", "served"), ("stale", "unsupported")],
    ids=["stale", "omitted", "stale-no-expand-no-etags"],
)
@pytest.mark.parametrize(("style", "device", "target"), STYLES, ids=[s[0] for s in STYLES])
async def test_endpoint_links_not_kept_current(
    tmp_path: Path, tls: Tls, links: str, expand: str, style: str, device: str, target: str
) -> None:
    """Endpoints whose Links.Zones / Links.Connections are stale or omitted: every detach that
    answers "detached" has unbound the device on the fabric, every attach has bound it, and the
    manager never reports its own binding as made outside fabric-dra — whether the service
    expands collections or not."""
    run = await link_cycles(
        tmp_path, tls, style=style, links=links, expand=expand, device=device, target=target, cycles=CYCLES
    )
    print(f"{style}/{links}: {run.cycles} cycles in {run.seconds:.1f}s")
    assert (run.cycles, run.wrong_attach, run.wrong_detach) == (CYCLES, 0, 0)
    assert run.left_bound == {}
    assert run.state == BindingState.FREE
    assert run.outside == []


async def test_resource_block_status_not_kept_current(tmp_path: Path, tls: Tls) -> None:
    """A service whose ResourceBlocks never say they were composed (the systems'
    Links.ResourceBlocks do): the attach is confirmed from the system, survives later discovery
    passes as our own binding, and the detach really removes the block."""
    node, device = NODES[1], "nvme1"
    flags = ("--binding-style", "composition", "--resync-seconds", "0.5")
    async with wild_service(tmp_path, tls, node, flags, blockStatus="stale") as (fabric, plugin):
        attached = await plugin.attach(device, node, claim_uid("claim-1"), wait_seconds=20)
        assert attached.state == AttachmentState.ATTACHED
        assert fabric.bound_hosts() == {device: node}
        first = await plugin.inventory()
        # a few discovery passes later it is still ours, bound to the node
        later = await plugin.inventory(after=first.version, timeout_seconds=3)
        await asyncio.sleep(1.25)  # two more resyncs
        shown = await plugin.device(device)
        assert (shown.state, shown.node, shown.managed) == (BindingState.BOUND, node, True), later.version
        detached = await plugin.detach(device, node, claim_uid("claim-1"), wait_seconds=20)
        assert detached.state == AttachmentState.DETACHED
        assert fabric.bound_hosts() == {}
        assert (await plugin.device(device)).state == BindingState.FREE


async def test_session_login_answered_204(tmp_path: Path, tls: Tls) -> None:
    """A service that answers the session login with 204 (X-Auth-Token and Location, no body):
    the manager logs in, becomes ready and binds through the session."""
    node = NODES[0]
    flags = ("--binding-style", "zone")
    async with wild_service(tmp_path, tls, node, flags, sessionLogin="no-content") as (fabric, plugin):
        attached = await plugin.attach("gpu0", node, claim_uid("claim-1"), wait_seconds=20)
        assert attached.state == AttachmentState.ATTACHED
        assert fabric.bound_hosts() == {"gpu0": node}
        await plugin.detach("gpu0", node, claim_uid("claim-1"), wait_seconds=20)
        sessions = fabric.get("/redfish/v1/SessionService/Sessions")
        assert sessions["Members@odata.count"] >= 1


async def test_initiators_only_in_zone_links(tmp_path: Path, tls: Tls) -> None:
    """Host initiator endpoints that only zones link to (absent from the Endpoints collection)
    still count as the hosts' ports: every host is in the PCIe pool and a device binds to it."""
    node = NODES[2]
    flags = ("--binding-style", "zone")
    async with wild_service(tmp_path, tls, node, flags, initiators="links-only") as (fabric, plugin):
        inventory = await plugin.inventory()
        pools = {p.pool: p for p in inventory.pools}
        assert sorted(pools["fabric-pcie"].nodes) == sorted(NODES)
        attached = await plugin.attach("gpu1", node, claim_uid("claim-1"), wait_seconds=20)
        assert attached.state == AttachmentState.ATTACHED
        assert fabric.bound_hosts() == {"gpu1": node}
        await plugin.detach("gpu1", node, claim_uid("claim-1"), wait_seconds=20)
        assert fabric.bound_hosts() == {}
