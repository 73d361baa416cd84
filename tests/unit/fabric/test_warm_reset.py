"""The ledger's reset state of warm devices: what an earlier release's ledger means, and which warm
entry may be handed to a claim (the flows run against the emulator in
tests/integration/fabric/test_warm_reset.py)."""

from __future__ import annotations

import json
from pathlib import Path

from fabric.ledger import WARM_HOLDER, FileLedgerStore, Ledger, LedgerEntry, LedgerState, ResetState


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
