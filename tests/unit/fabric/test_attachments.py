"""The safety rules of attach and detach (request front, operation driver, reconciliation),
against an in-memory fabric that fails on command."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from fabric.driver.settings import OperationSettings
from fabric.redfish.error_mapping import OutcomeUnknown
from fabric.state.ledger import LedgerState
from manager_api import models as api
from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    DeviceBusy,
    DeviceNotFound,
    FabricUnavailable,
    NodeNotFound,
    NotLeader,
)
from tests.unit.fabric.fakes import Fault, Harness, make_harness


def attach_request(device: str, node: str, claim: str) -> api.AttachRequest:
    # Unvalidated: the binder behind the API is under test here, with short made-up claim UIDs;
    # the API's own checks of names and UIDs are tested through the manager's HTTP server.
    return api.AttachRequest.model_construct(device=device, node=node, claim_uid=claim)


async def test_attach_is_idempotent_per_claim_and_device(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    first, status = await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    again, again_status = await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    assert (status, again_status) == (200, 200)
    assert first.state == again.state == api.AttachmentState.ATTACHED
    assert h.fabric.binds == [("gpu0", "node-0")]
    assert first.device.claim_uid == "c1" and first.device.node == "node-0"
    # The intent is on disk, and the outcome once its write (not waited for by the answer) is done.
    await h.ledger.commit()
    saved = json.loads((tmp_path / "ledger.json").read_text())
    assert saved["entries"]["gpu0"]["state"] == "bound"


async def test_held_device_is_busy_with_holder_until_detach_completed(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    with pytest.raises(DeviceBusy) as busy:
        await h.attachments.attach(attach_request("gpu0", "node-1", "c2"), wait=5)
    assert busy.value.held_by == "node-0/c1" and busy.value.retriable
    h.fabric.delay = 0.2
    detach = asyncio.create_task(h.attachments.detach("gpu0", "c1", "node-0", wait=5))
    await asyncio.sleep(0.05)
    with pytest.raises(DeviceBusy, match="being detached from node node-0"):
        await h.attachments.attach(attach_request("gpu0", "node-1", "c2"), wait=5)
    assert (await detach)[1] == 200
    _, status = await h.attachments.attach(attach_request("gpu0", "node-1", "c2"), wait=5)
    assert status == 200 and h.fabric.bound == {"gpu0": "node-1"}


async def test_detach_by_anyone_but_the_holder_is_a_noop(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    for claim, node in (("c2", "node-0"), ("c1", "node-1")):
        attachment, status = await h.attachments.detach("gpu0", claim, node, wait=5)
        assert (status, attachment.state) == (200, api.AttachmentState.DETACHED)
    assert h.fabric.unbinds == [] and h.fabric.bound == {"gpu0": "node-0"}
    # detaching twice: the second is a no-op too
    assert (await h.attachments.detach("gpu0", "c1", "node-0", wait=5))[1] == 200
    assert (await h.attachments.detach("gpu0", "c1", "node-0", wait=5))[1] == 200
    assert h.fabric.unbinds == [("gpu0", "node-0")]


async def test_unknown_device_or_node_is_named(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    with pytest.raises(DeviceNotFound, match="device gpu9"):
        await h.attachments.attach(attach_request("gpu9", "node-0", "c1"), wait=1)
    with pytest.raises(NodeNotFound, match="node node-7"):
        await h.attachments.attach(attach_request("gpu0", "node-7", "c1"), wait=1)
    with pytest.raises(DeviceNotFound, match="device gpu9"):
        await h.attachments.detach("gpu9", "c1", "node-0", wait=1)


async def test_bind_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    h.fabric.faults["gpu0"] = [Fault(BindFailed("Redfish POST failed: InternalError"))]
    with pytest.raises(BindFailed, match="InternalError"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    await _settled(h)
    assert h.ledger.get("gpu0") is None and h.fabric.bound == {}
    assert h.inventory.render_device(h.inventory.device("gpu0")).state == api.BindingState.FREE  # type: ignore[arg-type]
    # the next attempt works
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5))[1] == 200


async def test_lost_answer_is_confirmed_by_reading_never_resent_blindly(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    # The fabric bound it but the answer was lost: one bind, confirmed by a read.
    h.fabric.faults["gpu0"] = [Fault(OutcomeUnknown("connection lost"), applied=True)]
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5))[1] == 200
    assert h.fabric.binds == [("gpu0", "node-0")]
    # The fabric did not bind it and the answer was lost: resent once, after a read said so.
    h.fabric.faults["gpu1"] = [Fault(OutcomeUnknown("connection lost"), applied=False)]
    assert (await h.attachments.attach(attach_request("gpu1", "node-1", "c2"), wait=5))[1] == 200
    assert h.fabric.binds == [("gpu0", "node-0"), ("gpu1", "node-1")]


async def test_unreachable_fabric_is_503_and_the_attach_resumes_later(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, settings=OperationSettings(operation_timeout=0.3, retry_seconds=0.05))
    h.fabric.reachable = False
    with pytest.raises(FabricUnavailable, match="unreachable"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    entry = h.ledger.get("gpu0")
    assert entry is not None and entry.state is LedgerState.ATTACHING  # intent kept: outcome unknown
    h.fabric.reachable = True
    await asyncio.sleep(0.1)
    await h.reconciler.reconcile()
    await _settled(h)
    assert h.ledger.get("gpu0").state is LedgerState.BOUND  # type: ignore[union-attr]
    assert h.fabric.bound == {"gpu0": "node-0"}
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5))[1] == 200


async def test_hung_task_is_cancelled_and_the_attach_rolled_back(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    h.fabric.hang_next_bind.add("gpu0")
    with pytest.raises(AttachTimeout, match="still running"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    await _settled(h)
    assert h.fabric.cancelled == ["/redfish/v1/TaskService/TaskMonitors/gpu0"]
    assert h.ledger.get("gpu0") is None and h.fabric.bound == {}


async def test_restart_completes_half_done_operations(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=2, devices=3)
    await h.attachments.attach(attach_request("gpu0", "node-0", "c0"), wait=5)
    await h.attachments.attach(attach_request("gpu2", "node-1", "c2"), wait=5)
    await h.ledger.commit()  # the outcomes' writes are done
    document = json.loads((tmp_path / "ledger.json").read_text())
    entries = document["entries"]
    # Crashed right after recording the intent to attach gpu1 (nothing sent to the fabric yet),
    entries["gpu1"] = {
        **entries["gpu0"],
        "device": "gpu1",
        "device_key": "/redfish/v1/Fabrics/PCIe/Endpoints/gpu1",
        "state": "attaching",
        "claim_uid": "c1",
        "operation_id": "op-before-crash",
    }
    # and right after recording the intent to detach gpu0 (the fabric still has it bound),
    entries["gpu0"]["state"] = "detaching"
    (tmp_path / "ledger.json").write_text(json.dumps(document))
    # while someone removed gpu2's binding behind fabric-dra's back.
    del h.fabric.bound["gpu2"]

    restarted = await make_harness(tmp_path, fabric=h.fabric)
    await _settled(restarted)
    assert restarted.fabric.bound == {"gpu1": "node-0"}
    assert restarted.ledger.get("gpu0") is None
    assert restarted.ledger.get("gpu1").state is LedgerState.BOUND  # type: ignore[union-attr]
    assert restarted.ledger.get("gpu2") is None  # forgotten: the fabric no longer has it
    resumed = restarted.driver.operations.get("op-before-crash")
    assert resumed is not None and resumed.state == api.OperationState.SUCCEEDED
    # every binding made exactly once
    assert h.fabric.binds.count(("gpu1", "node-0")) == 1


async def test_unmanaged_binding_is_reported_and_never_touched(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    h.fabric.bound["gpu0"] = "node-1"  # bound outside fabric-dra
    await h.watch.refresh()
    device = h.inventory.render_device(h.inventory.device("gpu0"))  # type: ignore[arg-type]
    assert (device.state, device.managed, device.node) == (api.BindingState.BOUND, False, "node-1")
    with pytest.raises(DeviceBusy, match="bound outside fabric-dra"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=1)
    assert (await h.attachments.detach("gpu0", "c1", "node-1", wait=1))[1] == 200
    assert h.fabric.bound == {"gpu0": "node-1"} and h.fabric.unbinds == []


async def test_a_follower_never_touches_the_fabric(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    h.leader[0] = False
    with pytest.raises(NotLeader):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=1)
    # Leadership lost in the middle of an operation: the bind is fenced off, the intent is kept
    # for the next leader.
    h.leader[0] = True
    h.fabric.read_delay = 0.1
    task = asyncio.create_task(h.attachments.attach(attach_request("gpu1", "node-0", "c2"), wait=1))
    await asyncio.sleep(0.05)  # the operation is reading the fabric now
    h.leader[0] = False
    with pytest.raises(NotLeader):
        await task
    assert h.fabric.bound == {} and h.fabric.binds == []
    assert h.ledger.get("gpu1").state is LedgerState.ATTACHING  # type: ignore[union-attr]


async def test_concurrent_attaches_never_bind_a_device_twice(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=10, devices=20)
    h.fabric.delay = 0.001
    rng = random.Random(7)
    requests = [
        attach_request(f"gpu{rng.randrange(20)}", f"node-{rng.randrange(10)}", f"claim-{i}")
        for i in range(200)
    ]
    results = await asyncio.gather(
        *(h.attachments.attach(r, wait=10) for r in requests), return_exceptions=True
    )
    winners: dict[str, str] = {}
    for request, result in zip(requests, results, strict=True):
        if isinstance(result, BaseException):
            assert isinstance(result, DeviceBusy), result
            assert result.held_by
            continue
        _, status = result
        assert status == 200
        assert request.device not in winners
        winners[request.device] = request.node
    assert winners == h.fabric.bound
    assert len(h.fabric.binds) == len(winners)


async def _settled(h: Harness) -> None:
    for _ in range(200):
        if all(slot.driver is None for slot in h.driver.slots.all()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("drivers still running")


async def test_refused_unbind_keeps_the_device_held_and_is_retried(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
    h.fabric.faults["gpu0"] = [Fault(BindFailed("Redfish POST failed: the switch refused"))]
    with pytest.raises(BindFailed, match="switch refused"):
        await h.attachments.detach("gpu0", "c1", "node-0", wait=5)
    # still bound on the fabric, so nobody else gets it
    assert h.fabric.bound == {"gpu0": "node-0"}
    with pytest.raises(DeviceBusy, match="being detached from node node-0"):
        await h.attachments.attach(attach_request("gpu0", "node-1", "c2"), wait=1)
    entry = h.ledger.get("gpu0")
    assert entry is not None and entry.state is LedgerState.DETACHING
    await asyncio.sleep(0.06)  # past the retry pause
    await h.reconciler.reconcile()
    await _settled(h)
    assert h.fabric.bound == {} and h.ledger.get("gpu0") is None
    operation = h.driver.operations.get(entry.operation_id)
    assert operation is not None and operation.state == api.OperationState.SUCCEEDED


async def test_the_inventory_counts_failed_attaches_in_a_row_until_one_succeeds(tmp_path: Path) -> None:
    """The plain flow's quarantine reads these (docs/controller.md): the manager is the one place
    that sees every attach attempt."""
    h = await make_harness(tmp_path)

    def shown() -> tuple[int, str | None]:
        device = next(d for d in h.inventory.snapshot().devices if d.name == "gpu0")
        return device.attach_failures, device.attach_error

    for expected in (1, 2):
        h.fabric.faults["gpu0"] = [Fault(BindFailed("Redfish POST failed: InternalError"))]
        with pytest.raises(BindFailed):
            await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5)
        await _settled(h)
        assert shown() == (expected, "BindFailed")
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=5))[1] == 200
    assert shown() == (0, None)


async def test_a_change_the_fabric_does_not_show_is_no_success(tmp_path: Path) -> None:
    """A service that answers "done" without doing it: the attach fails with the reason and is
    rolled back; the detach fails, the device stays held and shown, and nothing is resent."""
    h = await make_harness(tmp_path)
    h.fabric.ignored.add("gpu0")
    with pytest.raises(BindFailed, match="accepted the bind of gpu0 to node-0 but did not apply it"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c1"), wait=10)
    await _settled(h)
    assert h.fabric.binds == [("gpu0", "node-0")] and h.fabric.bound == {}
    assert h.ledger.get("gpu0") is None

    h.fabric.ignored.clear()
    await h.attachments.attach(attach_request("gpu0", "node-0", "c2"), wait=10)
    h.fabric.ignored.add("gpu0")
    with pytest.raises(BindFailed, match="accepted the unbind of gpu0 from node-0 but did not apply it"):
        await h.attachments.detach("gpu0", "c2", "node-0", wait=10)
    assert h.fabric.unbinds == [("gpu0", "node-0")] and h.fabric.bound == {"gpu0": "node-0"}
    entry = h.ledger.get("gpu0")
    assert entry is not None and entry.state is LedgerState.DETACHING
    shown = h.inventory.render_device(h.inventory.device("gpu0"))  # type: ignore[arg-type]
    assert shown.node == "node-0" and shown.state != api.BindingState.FREE
