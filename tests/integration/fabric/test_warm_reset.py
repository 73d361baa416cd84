"""Hygiene between tenants: a warm device that served one claim is reset before it serves another.

Real processes: a manager in front of the TLS emulator (default topology: two NVIDIA L40S GPUs,
gpu4 and gpu5, that every host reaches; the emulator offers ``#Processor.Reset`` on each GPU's
Processor and counts resets on the binding, ``Resets`` in its binding table). The pool keeps one
L40S warm on the home node; the other L40S goes to a claim elsewhere, so the pool has nothing to
refill from and every claim at home meets the one warm device.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric_dra_testbed.stack import Role, wait_ready
from manager_api.models import AttachmentState, BindingState
from plumbing.kube.resources import EVENTS, NODES
from tests.integration.fabric.conftest import FabricAdmin, allocated_claim, manager_args
from tests.integration.fabric.test_cluster import _node_info
from tests.integration.fabric.test_warm import (
    AWAY,
    HOME,
    L40S,
    _off,
    client_of,
    ledger_entry,
    manager,
    redfish_writes,
    resets_sent,
    sample,
    scrape,
    until,
    warm_devices,
    warm_flags,
)
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.fabric_manager import start_manager
from tests.support.uids import claim_uid
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def clean(fabric: FabricAdmin) -> Iterator[FabricAdmin]:
    """The module's emulator, and a check that each test gave back every binding and fault."""
    assert fabric.bound_hosts() == {}, "an earlier test left bindings"
    yield fabric
    fabric.reset_faults()
    assert fabric.bound_hosts() == {}, "bindings left behind"


def resets(fabric: FabricAdmin, device: str) -> int:
    """How often the emulator reset ``device`` in its current binding (0: none since its hot-add)."""
    binding = fabric.binding(device)
    assert binding is not None, f"{device} is not bound"
    return int(binding["Resets"])


async def warm_with_spare_away(role: Role, spare_claim: str) -> tuple[str, str]:
    """The warm device at home, and the spare L40S, given to a claim on the other node."""
    (device,) = await until(lambda: warm_devices(role), "one L40S warm")
    spare = "gpu5" if device == "gpu4" else "gpu4"
    async with client_of(role) as client:
        await client.attach(spare, AWAY, spare_claim, wait_seconds=20)
    return device, spare


async def test_reset_on_reuse_before_the_next_claim_gets_it(clean: FabricAdmin, tmp_path: Path) -> None:
    role = manager(clean, tmp_path, *warm_flags(size=1))
    first, second, other = claim_uid("reset-first"), claim_uid("reset-second"), claim_uid("reset-spare")
    try:
        device, spare = await warm_with_spare_away(role, other)
        assert resets(clean, device) == 0  # fresh from its hot-add: nothing to clean
        async with client_of(role) as client:
            taken = await client.attach(device, HOME, first, wait_seconds=20, namespace="team-a")
            assert taken.state is AttachmentState.ATTACHED
            assert resets(clean, device) == 0  # a device warmed by a hot-add is given as it is
            entry = ledger_entry(tmp_path, device)
            assert entry is not None and (entry["namespace"], entry["reset"]) == ("team-a", None)

            await client.detach(device, HOME, first, wait_seconds=20)
            writes = redfish_writes(role)
            # The next tenant, of another namespace: a hit, and the reset was done before it.
            again = await client.attach(device, HOME, second, wait_seconds=20, namespace="team-b")
            assert again.state is AttachmentState.ATTACHED
            assert resets(clean, device) == 1, "the device was handed over without a reset"
            assert redfish_writes(role) == writes  # still a hit: no unbind, no bind
            assert clean.bound_hosts() == {device: HOME, spare: AWAY}
            entry = ledger_entry(tmp_path, device)
            assert entry is not None
            assert (entry["claim_uid"], entry["namespace"], entry["reset"]) == (second, "team-b", None)
            text = scrape(role)
            assert sample(text, "fabric_dra_device_resets_total", outcome="success") == 1.0
            assert sample(text, "fabric_dra_warm_claims_total", model=L40S, outcome="hit") == 2.0
            assert resets_sent(role) == 1.0
            logged = role.log_since_start()
            assert logged.index("warm device reset") < logged.rindex("warm device given to a claim")
            # Within one namespace too: a claim's device is reset before the next claim's.
            await client.detach(device, HOME, second, wait_seconds=20)
            third = claim_uid("reset-third")
            await client.attach(device, HOME, third, wait_seconds=20, namespace="team-b")
            assert resets(clean, device) == 2
            await client.detach(device, HOME, third, wait_seconds=20)
            await client.detach(spare, AWAY, other, wait_seconds=20)
    finally:
        role.stop()
    _off(clean, tmp_path)


async def test_a_device_whose_reset_is_still_due_is_not_handed_over(
    clean: FabricAdmin, tmp_path: Path
) -> None:
    """Killed between the return to warm and the reset (``manager.warm.before-reset``): the ledger
    says the reset is due, and a claim of another namespace gets the device only after it."""
    role = manager(clean, tmp_path, *warm_flags(size=1))
    first, second, other = claim_uid("due-first"), claim_uid("due-second"), claim_uid("due-spare")
    try:
        device, spare = await warm_with_spare_away(role, other)
        async with client_of(role) as client:
            await client.attach(device, HOME, first, wait_seconds=20, namespace="team-a")
        # Armed at the point: the detach is answered (the device is warm, its reset due, durably),
        # then the driver dies before it sends the reset.
        role.stop()
        role.start(["manager.warm.before-reset"])
        wait_ready(role.address, 60)
        async with client_of(role) as client:
            released = await client.detach(device, HOME, first, wait_seconds=10)
            assert released.state is AttachmentState.DETACHED
        role.wait_crashed("manager.warm.before-reset")
        entry = ledger_entry(tmp_path, device)
        assert entry is not None
        assert (entry["state"], entry["claim_uid"], entry["reset"], entry["namespace"]) == (
            "warm",
            "",
            "pending",
            "team-a",
        )
        assert resets(clean, device) == 0 and clean.bound_hosts() == {device: HOME, spare: AWAY}

        # A restarted manager whose pool loop has not run yet: the claim's own request finds the
        # reset due, has it done, and only then takes the device.
        role.stop()
        restarted = start_manager(
            tmp_path,
            clean.url,
            args=manager_args(clean, tmp_path, *warm_flags(size=1), "--warm-interval-seconds", "3600"),
            name="restarted",
        )
        try:
            wait_ready(restarted.address, 60)
            async with client_of(restarted) as client:
                attached = await client.attach(device, HOME, second, wait_seconds=20, namespace="team-b")
                assert attached.state is AttachmentState.ATTACHED
                assert resets(clean, device) == 1
                assert clean.bound_hosts() == {device: HOME, spare: AWAY}
                logged = restarted.log_since_start()
                assert logged.index("warm device reset") < logged.index("warm device given to a claim")
                await client.detach(device, HOME, second, wait_seconds=20)
                await client.detach(spare, AWAY, other, wait_seconds=20)
        finally:
            restarted.stop()
    finally:
        role.stop()
    _off(clean, tmp_path)


# -- a failed reset, with the Kubernetes API for its Event ---------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, fabric: FabricAdmin) -> Iterator[ApiServerProcess]:
    """An API test server whose Nodes carry the emulated hosts' names and system UUIDs."""
    with start_apiserver(tmp_path_factory.mktemp("apiserver")) as server:
        asyncio.run(_nodes(server, fabric))
        yield server


async def _nodes(server: ApiServerProcess, fabric: FabricAdmin) -> None:
    async with server.client() as kube:
        for node in (HOME, AWAY):
            uuid = fabric.get(f"/redfish/v1/Systems/{node}")["UUID"]
            created = await kube.create(NODES, {"metadata": {"name": node}})
            created["status"] = {"nodeInfo": _node_info(uuid.upper())}
            await kube.replace(NODES, created, subresource="status")


async def node_events(cluster: ApiServerProcess, reason: str) -> list[dict[str, Any]]:
    async with cluster.client() as kube:
        found = await kube.list(EVENTS, "default")
    items: list[dict[str, Any]] = found.get("items") or []
    return [e for e in items if e.get("reason") == reason]


@pytest.fixture
async def kube_manager(clean: FabricAdmin, cluster: ApiServerProcess, tmp_path: Path) -> AsyncIterator[Role]:
    args = manager_args(
        clean,
        tmp_path,
        *warm_flags(size=1),
        *("--kubeconfig", str(cluster.kubeconfig), "--namespace", "default"),
        *("--orphan-grace-seconds", "0"),
    )
    role = start_manager(tmp_path, clean.url, args=args)
    try:
        yield role
    finally:
        role.stop()
        _off(clean, tmp_path)


async def test_a_failed_reset_takes_the_device_out_of_the_pool(
    clean: FabricAdmin, cluster: ApiServerProcess, kube_manager: Role, tmp_path: Path
) -> None:
    role = kube_manager
    (device,) = await until(lambda: warm_devices(role), "one L40S warm")
    spare = "gpu5" if device == "gpu4" else "gpu4"
    first = await allocated_claim(cluster, "failed-reset-first", device, HOME)
    second = await allocated_claim(cluster, "failed-reset-second", device, HOME)
    other = await allocated_claim(cluster, "failed-reset-spare", spare, AWAY)
    async with client_of(role) as client:
        await client.attach(spare, AWAY, other, wait_seconds=20)  # nothing to refill the pool from
        await client.attach(device, HOME, first, wait_seconds=20, namespace="default")
        clean.inject({"Kind": "FailOperations", "Target": device, "Operation": "reset"})
        since = clean.binding(device)
        assert since is not None
        await client.detach(device, HOME, first, wait_seconds=20)

        # The reset fails: the device leaves the pool (detached), with a Warning Event on its node.
        await until(lambda: _count(role, "failure"), "the failed reset counted", within=20)
        logged = role.log_since_start()
        assert "reset of a warm device failed; it leaves the warm pool" in logged
        events = await until(lambda: node_events(cluster, "DeviceResetFailed"), "the Event recorded")
        (event,) = events
        assert event["type"] == "Warning" and event["regarding"]["name"] == HOME
        assert device in event["note"] and "injected fault" in event["note"]
        wait_until(
            lambda: (b := clean.binding(device)) is None or b["Since"] != since["Since"],
            timeout=20,
            what="the unreset binding gone",
        )

        # The next claim is still served: by a fresh hot-add, never by the unreset binding.
        attached = await client.attach(device, HOME, second, wait_seconds=30, namespace="default")
        assert attached.state is AttachmentState.ATTACHED
        binding = clean.binding(device)
        assert binding is not None and binding["Since"] != since["Since"] and binding["Resets"] == 0
        shown = await client.device(device)
        assert (shown.state, shown.claim_uid) == (BindingState.BOUND, second)
        await client.detach(device, HOME, second, wait_seconds=20)
        await client.detach(spare, AWAY, other, wait_seconds=20)


async def _count(role: Role, outcome: str) -> bool:
    return sample(scrape(role), "fabric_dra_device_resets_total", outcome=outcome) == 1.0
