"""The warm pool against real processes: a manager in front of the TLS emulator (default topology:
two NVIDIA L40S GPUs, gpu4 and gpu5, that every host reaches).

A warm device is bound on the fabric to its node with a ledger entry ``warm`` and no claim; a claim
there takes it without a Redfish write (a hit), a claim elsewhere moves it (a miss), a released
device goes back to warm while its node's pool is below target, and a manager killed in the middle
of a transfer leaves the device warm or claimed, never both and never lost.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from fabric_dra_testbed.stack import Role, wait_ready
from manager_api.client import ManagerClient, ManagerUnreachable
from manager_api.models import AttachmentState, BindingState, Device
from tests.integration.fabric.conftest import CONTROLLER_TOKEN, OPERATOR_TOKEN, FabricAdmin, manager_args
from tests.support.fabric_manager import start_manager
from tests.support.uids import claim_uid
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow(seconds=26), pytest.mark.timeout(120)]
T = TypeVar("T")

L40S = "NVIDIA L40S"
HOME, AWAY = "kind-worker", "kind-worker2"


def warm_flags(size: int = 1, node: str = HOME, mode: str = "fixed") -> list[str]:
    return [
        *("--warm-mode", mode),
        *("--warm-size", str(size)),
        *("--warm-model", L40S),
        *("--warm-node", node),
        *("--warm-interval-seconds", "0.2"),
        *("--poll-seconds", "1"),
    ]


@pytest.fixture
def clean(fabric: FabricAdmin) -> Iterator[FabricAdmin]:
    """The module's emulator, and a check that each test gave back every binding it made."""
    assert fabric.bound_hosts() == {}, "an earlier test left bindings"
    yield fabric
    assert fabric.bound_hosts() == {}, "bindings left behind"


def manager(fabric: FabricAdmin, work: Path, *flags: str, name: str = "manager", ready: bool = True) -> Role:
    return start_manager(work, fabric.url, args=manager_args(fabric, work, *flags), name=name, ready=ready)


def client_of(role: Role) -> ManagerClient:
    return ManagerClient(role.address, token=CONTROLLER_TOKEN, timeout=30)


async def devices(role: Role) -> dict[str, Device]:
    async with client_of(role) as client:
        return {d.name: d for d in await client.devices()}


async def warm_devices(role: Role, node: str = HOME) -> list[str]:
    found = await devices(role)
    return sorted(n for n, d in found.items() if d.state is BindingState.WARM and d.node == node)


async def until(check: Callable[[], Awaitable[T]], what: str, within: float = 30.0) -> T:
    deadline = asyncio.get_running_loop().time() + within
    last: T | None = None
    while asyncio.get_running_loop().time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {within}s (last: {last})")


def scrape(role: Role) -> str:
    auth = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    return httpx.get(role.address.rstrip("/") + "/metrics", headers=auth, timeout=10).text


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``name`` with exactly these labels (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


#: the Redfish resource label of the reset a warm device gets between tenants (not a binding change)
RESET_ACTION = "Processor.Reset"


def redfish_writes(role: Role) -> float:
    """Requests the manager sent to the Redfish service that change bindings: not reads, nor its
    own session and event subscription, nor the resets of warm devices (:func:`resets_sent`)."""
    total = 0.0
    for line in scrape(role).splitlines():
        if line.startswith("fabric_dra_redfish_request_duration_seconds_count{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            own = "Session" in labels["resource"] or "Subscription" in labels["resource"]
            if labels["method"] not in ("GET", "HEAD") and not own and labels["resource"] != RESET_ACTION:
                total += float(line.rsplit(" ", 1)[1])
    return total


def resets_sent(role: Role) -> float:
    """Reset actions the manager sent to the Redfish service."""
    return sample(
        scrape(role),
        "fabric_dra_redfish_request_duration_seconds_count",
        method="POST",
        resource=RESET_ACTION,
    )


def ledger_entry(work: Path, device: str) -> dict[str, object] | None:
    entries: dict[str, dict[str, object]] = json.loads((work / "manager-state" / "ledger.json").read_text())[
        "entries"
    ]
    return entries.get(device)


async def test_pool_fills_to_its_size_and_empties_when_turned_off(clean: FabricAdmin, tmp_path: Path) -> None:
    role = manager(clean, tmp_path, *warm_flags(size=1))
    try:
        warm = await until(lambda: warm_devices(role), "one L40S warm on the home node")
        assert warm in (["gpu4"], ["gpu5"])
        (device,) = warm
        assert clean.bound_hosts() == {device: HOME}  # bound on the fabric, to the home node only
        # the API shows the device warm as soon as the fabric holds it; the ledger's file follows
        # with the entry's last write
        entry = wait_until(
            lambda: (e := ledger_entry(tmp_path, device)) is not None and e["state"] == "warm" and e,
            timeout=10,
            what="the ledger entry written as warm",
        )
        assert entry["claim_uid"] == ""
        await asyncio.sleep(1.0)  # several passes: still exactly one, no other node warmed
        assert clean.bound_hosts() == {device: HOME}
        shown = (await devices(role))[device]
        assert (shown.state, shown.node, shown.claim_uid) == (BindingState.WARM, HOME, None)
        assert sample(scrape(role), "fabric_dra_warm_devices", model=L40S) == 1.0
    finally:
        role.stop()
    # The warm entry is durable: a manager started with the pool off finds it and gives it back.
    role = manager(clean, tmp_path, "--warm-mode", "off", "--warm-interval-seconds", "0.2", name="off")
    try:
        await until(lambda: _unbound(clean), "the warm device detached once the pool is off")
        assert await warm_devices(role) == []
    finally:
        role.stop()


async def _unbound(fabric: FabricAdmin) -> bool:
    return fabric.bound_hosts() == {}


async def test_hit_no_redfish_write_then_back_to_warm(clean: FabricAdmin, tmp_path: Path) -> None:
    role = manager(clean, tmp_path, *warm_flags(size=1))
    claim, other = claim_uid("warm-hit"), claim_uid("warm-hit-other")
    try:
        (device,) = await until(lambda: warm_devices(role), "one L40S warm")
        spare = "gpu5" if device == "gpu4" else "gpu4"
        async with client_of(role) as client:
            # The other L40S goes to a claim elsewhere, so the pool has nothing to refill from.
            await client.attach(spare, AWAY, other, wait_seconds=20)
            writes = redfish_writes(role)
            attachment = await client.attach(device, HOME, claim, wait_seconds=20)
            assert attachment.state is AttachmentState.ATTACHED
            assert redfish_writes(role) == writes  # no bind sent: the binding was there
            assert clean.bound_hosts() == {device: HOME, spare: AWAY}
            shown = await client.device(device)
            assert (shown.state, shown.claim_uid) == (BindingState.BOUND, claim)
            entry = ledger_entry(tmp_path, device)
            assert entry is not None and (entry["state"], entry["claim_uid"]) == ("bound", claim)
            text = scrape(role)
            assert sample(text, "fabric_dra_warm_claims_total", model=L40S, outcome="hit") == 1.0
            assert sample(text, "fabric_dra_warm_claims_total", model=L40S, outcome="cold") == 1.0

            # Released while the pool is below its size: it stays bound, warm again, no unbind;
            # one reset action cleans it for the next claim (test_warm_reset.py).
            detached = await client.detach(device, HOME, claim, wait_seconds=20)
            assert detached.state is AttachmentState.DETACHED
            assert redfish_writes(role) == writes
            assert clean.bound_hosts() == {device: HOME, spare: AWAY}
            assert (await client.device(device)).state is BindingState.WARM
            wait_until(lambda: resets_sent(role) == 1.0, timeout=10, what="the returned device reset")

            # Released when the pool is full: detached as before.
            await client.detach(spare, AWAY, other, wait_seconds=20)
            assert clean.bound_hosts() == {device: HOME}
            seconds = scrape(role)
        # Device-seconds were counted for both states while they lasted.
        device_seconds = "fabric_dra_device_seconds_total"
        assert sample(seconds, device_seconds, namespace="", model=L40S, state="warm") > 0
        assert sample(seconds, device_seconds, namespace="", model=L40S, state="bound") > 0
    finally:
        role.stop()
    _off(clean, tmp_path)


def _off(fabric: FabricAdmin, work: Path) -> None:
    """Give back what the pool left warm: a manager with the pool off detaches it."""
    role = manager(fabric, work, "--warm-mode", "off", "--warm-interval-seconds", "0.2", name="cleanup")
    try:
        wait_until(lambda: fabric.bound_hosts() == {}, timeout=30, what="warm devices given back")
    finally:
        role.stop()


async def test_miss_moves_the_device_to_the_claims_node(clean: FabricAdmin, tmp_path: Path) -> None:
    role = manager(clean, tmp_path, *warm_flags(size=1))
    claim = claim_uid("warm-miss")
    try:
        (device,) = await until(lambda: warm_devices(role), "one L40S warm")
        spare = "gpu5" if device == "gpu4" else "gpu4"
        async with client_of(role) as client:
            attachment = await client.attach(device, AWAY, claim, wait_seconds=30)
            assert attachment.state is AttachmentState.ATTACHED
            # Moved, not refused; bound to the claim's node only. The pool refills from the spare.
            bound = clean.bound_hosts()
            assert bound[device] == AWAY
            shown = await client.device(device)
            assert (shown.state, shown.node, shown.claim_uid) == (BindingState.BOUND, AWAY, claim)
            assert sample(scrape(role), "fabric_dra_warm_claims_total", model=L40S, outcome="miss") == 1.0
            # one outcome for the claim: its attach after the move is not a cold one as well
            assert not sample(scrape(role), "fabric_dra_warm_claims_total", model=L40S, outcome="cold")
            await until(lambda: warm_devices(role), "the pool refilled")
            assert clean.bound_hosts() == {device: AWAY, spare: HOME}
            await client.detach(device, AWAY, claim, wait_seconds=20)
    finally:
        role.stop()
    _off(clean, tmp_path)


async def crash_at(role: Role, point: str, call: Callable[[ManagerClient], Awaitable[object]]) -> None:
    """Restart the manager armed at ``point`` and make the request that reaches it: the manager
    dies there (SIGKILL), the request gets no answer."""
    role.stop()
    role.start([point])
    wait_ready(role.address, 60)
    async with client_of(role) as client:
        with pytest.raises(ManagerUnreachable):
            await call(client)
    role.wait_crashed(point)


@pytest.mark.parametrize(
    ("point", "holder"),
    [("manager.warm.before-transfer", "warm"), ("manager.warm.after-transfer", "claim")],
)
async def test_crash_in_the_middle_of_a_transfer(
    clean: FabricAdmin, tmp_path: Path, point: str, holder: str
) -> None:
    """Killed before the transfer's write the device is still warm; after it, the claim's. The
    claim's retry gets it either way, with no bind sent and no second binding."""
    role = manager(clean, tmp_path, *warm_flags(size=1))
    claim, other = claim_uid(f"warm-crash-{point}"), claim_uid(f"warm-crash-spare-{point}")
    try:
        (device,) = await until(lambda: warm_devices(role), "one L40S warm")
        spare = "gpu5" if device == "gpu4" else "gpu4"
        async with client_of(role) as client:  # nothing left to refill the pool from
            await client.attach(spare, AWAY, other, wait_seconds=20)
        await crash_at(role, point, lambda client: client.attach(device, HOME, claim, wait_seconds=10))
        entry = ledger_entry(tmp_path, device)
        assert entry is not None
        assert entry["claim_uid"] == ("" if holder == "warm" else claim)
        assert entry["state"] == ("warm" if holder == "warm" else "bound")
        assert clean.bound_hosts() == {device: HOME, spare: AWAY}

        role.start()
        wait_ready(role.address, 60)
        writes = redfish_writes(role)
        async with client_of(role) as client:
            attachment = await client.attach(device, HOME, claim, wait_seconds=20)
            assert attachment.state is AttachmentState.ATTACHED
            assert redfish_writes(role) == writes
            assert (await client.device(device)).claim_uid == claim
            assert clean.bound_hosts() == {device: HOME, spare: AWAY}
            await client.detach(device, HOME, claim, wait_seconds=20)
            await client.detach(spare, AWAY, other, wait_seconds=20)
    finally:
        role.stop()
    _off(clean, tmp_path)


async def test_crash_after_the_return_to_warm(clean: FabricAdmin, tmp_path: Path) -> None:
    point = "manager.warm.after-return"
    role = manager(clean, tmp_path, *warm_flags(size=1))
    claim = claim_uid("warm-crash-return")
    try:
        (device,) = await until(lambda: warm_devices(role), "one L40S warm")
        spare = "gpu5" if device == "gpu4" else "gpu4"
        async with client_of(role) as client:
            await client.attach(spare, AWAY, claim_uid("warm-crash-spare"), wait_seconds=20)
            await client.attach(device, HOME, claim, wait_seconds=20)
        await crash_at(role, point, lambda client: client.detach(device, HOME, claim, wait_seconds=10))
        entry = ledger_entry(tmp_path, device)
        assert entry is not None and (entry["state"], entry["claim_uid"]) == ("warm", "")
        role.start()
        wait_ready(role.address, 60)
        async with client_of(role) as client:
            # The claim's retried detach is a no-op success; the device stays warm and bound once.
            retried = await client.detach(device, HOME, claim, wait_seconds=10)
            assert retried.state is AttachmentState.DETACHED
            assert (await client.device(device)).state is BindingState.WARM
            assert clean.bound_hosts() == {device: HOME, spare: AWAY}
            await client.detach(spare, AWAY, claim_uid("warm-crash-spare"), wait_seconds=20)
    finally:
        role.stop()
    _off(clean, tmp_path)


async def test_auto_pool_follows_demand_and_empties_after_the_idle_ttl(
    clean: FabricAdmin, tmp_path: Path
) -> None:
    """One claim makes λ > 0, so the Poisson size is one device, kept warm on the claim's node;
    once no claim came for the idle TTL, none."""
    flags = [
        *("--warm-mode", "auto"),
        *("--warm-model", L40S),
        *("--warm-idle-ttl-seconds", "4"),
        # One claim: λ = ln 2 / 30 s. The instant emulator's hot-add T is 0.02 … 2 s depending on
        # the machine's load, so P(N > 0) = 1 - e^-λT is 5e-4 … 5e-2, always above ε = 1e-6: at
        # least one device. The cap of one per model makes it exactly one whatever P(N > 1) is
        # (the other L40S is the claim's), until the TTL ends it.
        *("--warm-rate-half-life-seconds", "30"),
        *("--warm-epsilon", "0.000001"),
        *("--warm-max-per-model", "1"),
        *("--warm-interval-seconds", "0.2"),
    ]
    role = manager(clean, tmp_path, *flags)
    claim = claim_uid("warm-auto")
    try:
        await asyncio.sleep(1.0)
        assert await warm_devices(role) == [] and clean.bound_hosts() == {}  # no demand: no pool
        async with client_of(role) as client:
            await client.attach("gpu4", HOME, claim, wait_seconds=20)
            warm = await until(lambda: warm_devices(role), "one L40S warm after the first claim")
            assert warm == ["gpu5"]  # the other L40S, on the claim's node
            await client.detach("gpu4", HOME, claim, wait_seconds=20)
        # At target already: the released device is detached, not kept.
        assert clean.bound_hosts() == {"gpu5": HOME}
        await until(lambda: _unbound(clean), "the pool emptied after the idle TTL", within=15)
        assert sample(scrape(role), "fabric_dra_warm_devices", model=L40S) == 0.0
    finally:
        role.stop()


async def test_a_model_the_fabric_lacks_is_refused_at_start_naming_its_models(
    clean: FabricAdmin, tmp_path: Path
) -> None:
    """The manager reads the fabric, finds no such model, and exits 1 with one line naming the
    models it has; nothing was bound."""
    role = manager(clean, tmp_path, *warm_flags(), "--warm-model", "NVIDIA A100", ready=False)
    try:
        code = role.proc.wait(timeout=60)
        assert code == 1
        last = role.log_since_start().strip().splitlines()[-1]
        assert "NVIDIA A100" in last and "NVIDIA H100 PCIe" in last and L40S in last
        assert "Traceback" not in role.log_since_start()
        assert clean.bound_hosts() == {}
    finally:
        role.stop()
