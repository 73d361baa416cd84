"""The ledger's reset state of warm devices: what an earlier release's ledger means, and which warm
entry may be handed to a claim (the flows run against the emulator in
tests/integration/fabric/test_warm_reset.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fabric.backends.base import BindContext
from fabric.state.ledger import WARM_HOLDER, FileLedgerStore, Ledger, LedgerEntry, LedgerState, ResetState
from fabric.state.model import DeviceRecord
from manager_api import models as api
from manager_api.errors import BindFailed, FabricError
from tests.unit.fabric.fakes import Harness, make_harness


def _entry(device: str, claim: str, state: str) -> dict[str, object]:
    """An entry as the release before resets wrote it: no ``namespace``, no ``reset``."""
    return {
        "device": device,
        "device_key": f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        "node": "n1",
        "host": "h1",
        "claim_uid": claim,
        "state": state,
        "operation_id": "op-1",
        "rollback": False,
        "task_monitor": None,
        "error": None,
        "updated_at": "2026-11-30T10:00:00Z",
    }


async def test_an_earlier_ledger_loads_and_its_warm_devices_are_reset_before_reuse(tmp_path: Path) -> None:
    document = {
        "kind": "FabricDraLedger",
        "version": 1,
        "entries": {"gpu4": _entry("gpu4", WARM_HOLDER, "warm"), "gpu5": _entry("gpu5", "claim-1", "bound")},
    }
    (tmp_path / "ledger.json").write_text(json.dumps(document))
    ledger = Ledger(FileLedgerStore(tmp_path))
    await ledger.load()
    warm, bound = ledger.get("gpu4"), ledger.get("gpu5")
    assert warm is not None and bound is not None
    assert (warm.namespace, warm.reset) == (None, None)
    # It may have served a claim before the upgrade: not clean until reset.
    assert warm.state is LedgerState.WARM and not warm.clean
    assert bound.state is LedgerState.BOUND and bound.reset is None


async def test_the_reset_state_is_written_and_read_back(tmp_path: Path) -> None:
    ledger = Ledger(FileLedgerStore(tmp_path))
    entry = LedgerEntry(
        device="gpu4",
        device_key="/k/gpu4",
        node="n1",
        host="h1",
        claim_uid=WARM_HOLDER,
        state=LedgerState.WARM,
        operation_id="op",
        namespace="team-a",
        reset=ResetState.PENDING,
    )
    ledger.put(entry)
    await ledger.commit()
    written = json.loads((tmp_path / "ledger.json").read_text())["entries"]["gpu4"]
    assert (written["namespace"], written["reset"]) == ("team-a", "pending")
    reloaded = Ledger(FileLedgerStore(tmp_path))
    await reloaded.load()
    again = reloaded.get("gpu4")
    assert again is not None and not again.clean and again.namespace == "team-a"
    again.reset = ResetState.DONE
    assert again.clean


# -- the operation driver's reset, on the in-memory fabric ----------------------------------------


class ScriptedReset:
    """The fake fabric's Reset action: records each reset; waits on ``gate``; fails with ``error``."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.error: FabricError | None = None

    async def __call__(self, device: DeviceRecord, ctx: BindContext) -> None:
        ctx.fence()
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        self.done.append(device.name)


async def _harness_with_a_returned_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Harness, ScriptedReset, LedgerEntry]:
    """gpu0 served claim-a on node-0 and was given back to the warm pool there: reset pending."""
    h = await make_harness(tmp_path)
    reset = ScriptedReset()
    backend = h.driver.backend_for(h.inventory.device("gpu0"))  # type: ignore[arg-type]
    monkeypatch.setattr(backend, "reset", reset)
    await h.attachments.attach(api.AttachRequest(device="gpu0", node="node-0", claim_uid=CLAIM_A), 5)
    entry = h.ledger.get("gpu0")
    assert entry is not None
    reset.gate.clear()  # the reset the return starts waits until the test lets it go
    async with h.driver.slot("gpu0").lock:
        await h.driver.records.keep_warm(entry)
        h.driver.kick("gpu0")  # its reset
    assert (entry.state, entry.reset) == (LedgerState.WARM, ResetState.PENDING)
    return h, reset, entry


CLAIM_A = "0a6c3c6e-4e4b-4a52-9d8a-6b1f0f0a0001"
CLAIM_B = "0a6c3c6e-4e4b-4a52-9d8a-6b1f0f0a0002"


async def test_a_claim_waits_for_the_reset_then_gets_the_device_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, reset, entry = await _harness_with_a_returned_device(tmp_path, monkeypatch)
    binds = len(h.fabric.binds)
    request = api.AttachRequest(device="gpu0", node="node-0", claim_uid=CLAIM_B, namespace="team-b")
    attach = asyncio.ensure_future(h.attachments.attach(request, 5))
    await asyncio.sleep(0.2)
    assert not attach.done() and entry.claim_uid == WARM_HOLDER  # not handed over unreset
    reset.gate.set()
    answer, status = await asyncio.wait_for(attach, 5)
    assert (answer.state, status) == (api.AttachmentState.ATTACHED, 200)
    assert reset.done == ["gpu0"]
    assert len(h.fabric.binds) == binds and h.fabric.bound == {"gpu0": "node-0"}  # a hit: no hot-add
    taken = h.ledger.get("gpu0")
    assert taken is not None and (taken.claim_uid, taken.namespace, taken.reset) == (CLAIM_B, "team-b", None)


async def test_a_failed_reset_takes_the_device_out_and_the_claim_gets_it_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, reset, _ = await _harness_with_a_returned_device(tmp_path, monkeypatch)
    reset.error = BindFailed("the fabric refused to reset gpu0", device="gpu0")
    reset.gate.set()
    for _ in range(100):
        if h.ledger.get("gpu0") is None:
            break
        await asyncio.sleep(0.02)
    assert h.ledger.get("gpu0") is None and "gpu0" not in h.fabric.bound  # detached, not warm
    assert h.fabric.unbinds == [("gpu0", "node-0")]
    request = api.AttachRequest(device="gpu0", node="node-0", claim_uid=CLAIM_B)
    answer, _ = await h.attachments.attach(request, 5)
    assert answer.state is api.AttachmentState.ATTACHED
    assert h.fabric.binds[-1] == ("gpu0", "node-0") and len(h.fabric.binds) == 2  # a fresh hot-add
    assert reset.done == []


async def test_a_deposed_leader_leaves_the_reset_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h, reset, entry = await _harness_with_a_returned_device(tmp_path, monkeypatch)
    h.leader[0] = False
    reset.gate.set()
    for _ in range(50):
        if not h.driver.slot("gpu0").running:
            break
        await asyncio.sleep(0.02)
    assert reset.done == [] and entry.reset is ResetState.PENDING and "gpu0" in h.fabric.bound
    h.leader[0] = True
    h.driver.kick("gpu0")  # what the next leader's pool loop does
    for _ in range(50):
        if entry.clean:
            break
        await asyncio.sleep(0.02)
    assert reset.done == ["gpu0"] and entry.clean
