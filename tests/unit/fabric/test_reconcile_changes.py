"""The reconcile after a bindings-only pass looks at what may have changed, not at every entry
(fabric/bindings/reconcile.py, "After a pass, what changed"), and still finds what a walk over
every entry finds: a binding removed outside fabric-dra, an unfinished entry to resume."""

from __future__ import annotations

from pathlib import Path

from fabric.state.ledger import LedgerEntry, LedgerState
from tests.unit.fabric.fakes import Harness, make_harness
from tests.unit.fabric.test_attachments import attach_request


def _count_checks(h: Harness) -> list[str]:
    checked: list[str] = []
    check = h.reconciler._check

    async def counting(entry: LedgerEntry, now: float) -> None:
        checked.append(entry.device)
        await check(entry, now)

    h.reconciler._check = counting  # type: ignore[method-assign]
    return checked


async def test_a_pass_that_changed_nothing_checks_nothing_and_one_that_did_checks_that(
    tmp_path: Path,
) -> None:
    h = await make_harness(tmp_path, devices=6)
    for i in range(4):
        assert (await h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5))[1] == 200
    await h.watch.refresh(bindings_only=True)  # the attaches' own changes looked at once
    checked = _count_checks(h)
    await h.watch.refresh(bindings_only=True)
    assert checked == []
    # Removed on the fabric, outside fabric-dra: the next bindings pass changes that device's
    # bound hosts, its entry is checked, found unbound and dropped; the others are not looked at.
    del h.fabric.bound["gpu2"]
    await h.watch.refresh(bindings_only=True)
    assert checked == ["gpu2"]
    assert h.ledger.get("gpu2") is None
    assert {e.device for e in h.ledger.entries()} == {"gpu0", "gpu1", "gpu3"}


async def test_a_full_pass_and_the_periodic_run_check_every_entry(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=4)
    for i in range(3):
        assert (await h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5))[1] == 200
    checked = _count_checks(h)
    await h.watch.refresh()  # a full pass: the inventory cannot say which bindings changed
    assert sorted(checked) == ["gpu0", "gpu1", "gpu2"]
    checked.clear()
    await h.reconciler.reconcile()  # what Reconciler.run does every retry_seconds
    assert sorted(checked) == ["gpu0", "gpu1", "gpu2"]


async def test_an_unfinished_entry_is_resumed_after_every_pass(tmp_path: Path) -> None:
    """An attach whose fabric went away stays ``attaching``; every bindings pass looks at it (and
    the driver resumes it after its pause), whether or not anything changed."""
    h = await make_harness(tmp_path, devices=2)
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c0"), wait=5))[1] == 200
    await h.watch.refresh(bindings_only=True)
    entry = h.ledger.get("gpu0")
    assert entry is not None
    entry.state = LedgerState.ATTACHING  # as a crash mid-attach leaves it, put as loaded
    h.ledger.put(entry)
    checked = _count_checks(h)
    for _ in range(2):
        await h.watch.refresh(bindings_only=True)
    assert checked == ["gpu0", "gpu0"]
