"""The manager's side of a node's reset: a warm device without a Redfish ``Reset`` action is handed
to a claim on its node still ``reset: pending`` and answered ``resetRequired`` until the claim's
plugin reports the reset (docs/manager.md "Hygiene between tenants"; the flows with real processes
are tests/integration/plugin/test_node_reset.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabric.driver.resets import reset_by_node, resettable
from fabric.state.ledger import LedgerEntry, LedgerState, ResetState
from manager_api import models as api
from manager_api.errors import DeviceBusy
from tests.unit.fabric.fakes import FakeFabric, Harness, make_harness

CLAIM_A = "0a6c3c6e-4e4b-4a52-9d8a-6b1f0f0a00a1"
CLAIM_B = "0a6c3c6e-4e4b-4a52-9d8a-6b1f0f0a00b2"


async def _nic_given_back(tmp_path: Path) -> tuple[Harness, LedgerEntry]:
    """nic0 served CLAIM_A on node-0 and was given back to the warm pool there: reset pending."""
    h = await make_harness(tmp_path, fabric=FakeFabric(hosts=["node-0", "node-1"], devices=["nic0"]))
    request = api.AttachRequest(device="nic0", node="node-0", claim_uid=CLAIM_A, namespace="team-a")
    await h.attachments.attach(request, 5)
    entry = h.ledger.get("nic0")
    assert entry is not None
    async with h.driver.slot("nic0").lock:
        await h.driver.records.keep_warm(entry)
        h.driver.kick("nic0")
    assert (entry.state, entry.reset) == (LedgerState.WARM, ResetState.PENDING)
    return h, entry


def _report(node: str, claim: str, ok: bool, message: str = "") -> api.ResetReport:
    outcome = api.ResetOutcome.OK if ok else api.ResetOutcome.FAILED
    return api.ResetReport(node=node, claim_uid=claim, outcome=outcome, message=message)


async def test_who_resets_what(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, fabric=FakeFabric(hosts=["node-0"], devices=["gpu0", "nic0"]))
    gpu, nic = h.inventory.device("gpu0"), h.inventory.device("nic0")
    assert gpu is not None and nic is not None
    assert not reset_by_node(gpu) and resettable(gpu)  # the fabric resets it
    assert reset_by_node(nic) and resettable(nic)  # its node does


async def test_a_hit_stays_pending_and_says_reset_required_until_the_plugin_reports(tmp_path: Path) -> None:
    h, entry = await _nic_given_back(tmp_path)
    binds, unbinds = len(h.fabric.binds), len(h.fabric.unbinds)
    await asyncio.sleep(0.1)  # the driver kicked by the return to warm has run
    assert (
        entry.state is LedgerState.WARM and entry.reset is ResetState.PENDING
    )  # the manager does not reset it

    request = api.AttachRequest(device="nic0", node="node-0", claim_uid=CLAIM_B, namespace="team-b")
    answer, status = await h.attachments.attach(request, 5)
    assert (answer.state, status, answer.reset_required) == (api.AttachmentState.ATTACHED, 200, True)
    assert (len(h.fabric.binds), len(h.fabric.unbinds)) == (binds, unbinds)  # a hit: nothing sent
    taken = h.ledger.get("nic0")
    assert taken is not None
    assert (taken.claim_uid, taken.namespace, taken.reset) == (CLAIM_B, "team-b", ResetState.PENDING)
    again, _ = await h.attachments.attach(request, 5)  # a retried prepare: reset again
    assert again.reset_required

    with pytest.raises(DeviceBusy):  # only the holder reports
        await h.attachments.report_reset("nic0", _report("node-0", CLAIM_A, True), 5)
    with pytest.raises(DeviceBusy):
        await h.attachments.report_reset("nic0", _report("node-1", CLAIM_B, True), 5)

    done, status = await h.attachments.report_reset("nic0", _report("node-0", CLAIM_B, True), 5)
    assert (done.state, status, done.reset_required) == (api.AttachmentState.ATTACHED, 200, False)
    assert taken.reset is ResetState.DONE
    assert not (await h.attachments.attach(request, 5))[0].reset_required
    twice, _ = await h.attachments.report_reset("nic0", _report("node-0", CLAIM_B, True), 5)
    assert twice.state is api.AttachmentState.ATTACHED and taken.reset is ResetState.DONE
    assert (len(h.fabric.binds), len(h.fabric.unbinds)) == (binds, unbinds)


async def test_a_failed_node_reset_power_cycles_the_device_for_the_claim(tmp_path: Path) -> None:
    h, _ = await _nic_given_back(tmp_path)
    request = api.AttachRequest(device="nic0", node="node-0", claim_uid=CLAIM_B, namespace="team-b")
    assert (await h.attachments.attach(request, 5))[0].reset_required
    binds = len(h.fabric.binds)

    report = _report("node-0", CLAIM_B, False, "/sys/bus/pci/devices/x/reset does not exist")
    answer, status = await h.attachments.report_reset("nic0", report, 5)
    assert (answer.state, status, answer.reset_required) == (api.AttachmentState.ATTACHED, 200, False)
    assert h.fabric.unbinds[-1] == ("nic0", "node-0")  # the slot powered off ...
    assert h.fabric.binds[-1] == ("nic0", "node-0") and len(h.fabric.binds) == binds + 1  # ... and on
    entry = h.ledger.get("nic0")
    assert entry is not None
    assert (entry.state, entry.claim_uid, entry.reset, entry.namespace) == (
        LedgerState.BOUND,
        CLAIM_B,
        None,
        "team-b",
    )


async def test_a_claim_on_another_node_gets_it_moved(tmp_path: Path) -> None:
    h, _ = await _nic_given_back(tmp_path)
    request = api.AttachRequest(device="nic0", node="node-1", claim_uid=CLAIM_B)
    answer, _ = await h.attachments.attach(request, 5)
    assert answer.state is api.AttachmentState.ATTACHED and not answer.reset_required
    assert h.fabric.bound == {"nic0": "node-1"} and ("nic0", "node-0") in h.fabric.unbinds
    entry = h.ledger.get("nic0")
    assert entry is not None and (entry.claim_uid, entry.reset) == (CLAIM_B, None)
