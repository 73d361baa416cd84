"""The device-seconds accounting: bucket math, the record and its size bound, attribution, and what
a restart counts (the same with real processes: tests/integration/fabric/test_usage_restarts.py)."""

from __future__ import annotations

import gzip
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fabric.bindings.usage import (
    BUCKET,
    RETENTION,
    FileUsageStore,
    UsageBook,
    UsageError,
    UsageKey,
    UsageMeter,
    _fitting,
    _json,
    split_hours,
    workload_of,
)
from fabric.state.ledger import WARM_HOLDER, Ledger, LedgerEntry, LedgerState
from manager_api import models as api
from plumbing.kube.dra import ResourceClaim
from tests.unit.fabric.fakes import make_harness

T0 = datetime(2026, 3, 1, 10, 40, tzinfo=UTC)
KEY = UsageKey("team-a", "H100", "Job/train", "bound")


def test_an_interval_within_one_hour_is_one_bucket() -> None:
    assert split_hours(T0, T0 + timedelta(minutes=5)) == [(T0.replace(minute=0), 300.0)]


def test_an_interval_is_split_at_every_hour_and_adds_up_exactly() -> None:
    end = T0 + timedelta(hours=2, minutes=30, seconds=0.25)
    parts = split_hours(T0, end)
    assert [start.hour for start, _ in parts] == [10, 11, 12, 13]
    assert [seconds for _, seconds in parts] == [1200.0, 3600.0, 3600.0, 600.25]
    assert sum(seconds for _, seconds in parts) == (end - T0).total_seconds()


def test_an_empty_or_backwards_interval_counts_nothing() -> None:
    assert split_hours(T0, T0) == []
    assert split_hours(T0, T0 - timedelta(seconds=1)) == []


def test_a_zone_other_than_utc_lands_in_the_same_buckets() -> None:
    tokyo = T0.astimezone(datetime.now().astimezone().tzinfo)
    assert split_hours(tokyo, tokyo + BUCKET) == split_hours(T0, T0 + BUCKET)


def test_groups_by_namespace_model_and_workload_from_the_hour_of_since() -> None:
    book = UsageBook()
    book.add(KEY, T0, T0 + timedelta(hours=1))  # 10:40 → 11:40
    book.add(UsageKey("team-b", "H100", "Pod/p-0", "attaching"), T0, T0 + timedelta(seconds=30))
    book.add(UsageKey("", "L40S", "", "warm"), T0, T0 + timedelta(seconds=60))
    by_ns = {g.name: g for g in book.groups(T0 + timedelta(minutes=10), api.UsageGrouping.NAMESPACE)}
    assert by_ns["team-a"].bound == 3600.0 and by_ns["team-a"].total == 3600.0
    assert (by_ns["team-b"].attaching, by_ns[""].warm) == (30.0, 60.0)
    by_model = {g.name: g.total for g in book.groups(T0, api.UsageGrouping.MODEL)}
    assert by_model == {"H100": 3630.0, "L40S": 60.0}
    by_workload = {g.name for g in book.groups(T0, api.UsageGrouping.WORKLOAD)}
    assert by_workload == {"team-a/Job/train", "team-b/Pod/p-0", ""}
    # From 11:00 on: only the 40 minutes of the second hour.
    later = book.groups(T0.replace(hour=11, minute=59), api.UsageGrouping.NAMESPACE)
    assert [(g.name, g.bound) for g in later] == [("team-a", 2400.0)]


def test_merging_adds_seconds_and_keeps_the_later_watermark() -> None:
    one, two = UsageBook(counted_until=T0), UsageBook(counted_until=T0 + timedelta(seconds=5))
    one.add(KEY, T0, T0 + timedelta(seconds=10))
    two.add(KEY, T0, T0 + timedelta(seconds=5))
    merged = one.merged(two)
    assert merged.hours[T0.replace(minute=0)][KEY] == 15.0
    assert merged.totals[("team-a", "H100", "bound")] == 15.0
    assert merged.counted_until == T0 + timedelta(seconds=5)
    assert one.hours[T0.replace(minute=0)][KEY] == 10.0  # the parts are left as they were


def test_buckets_past_retention_go_but_the_lifetime_totals_stay() -> None:
    book = UsageBook()
    book.add(KEY, T0, T0 + timedelta(seconds=10))
    book.prune(T0 + RETENTION)
    assert book.hours
    book.prune(T0 + RETENTION + BUCKET)
    assert not book.hours
    assert book.totals[("team-a", "H100", "bound")] == 10.0


async def test_the_record_reads_back_as_written(tmp_path: Path) -> None:
    book = UsageBook(counted_until=T0 + timedelta(hours=2))
    book.add(KEY, T0, T0 + timedelta(hours=2))
    book.add(UsageKey("", "L40S", "", "outside"), T0, T0 + timedelta(seconds=7.5))
    store = FileUsageStore(tmp_path)
    await store.save(book)
    again = await store.load()
    assert again == book
    assert await FileUsageStore(tmp_path / "nothing-yet").load() == UsageBook()
    (tmp_path / "usage.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot read the usage record"):
        await store.load()


def _week(keys: int) -> UsageBook:
    """A full retention of hourly buckets, each with ``keys`` rows named as pods are (random suffixes)."""
    rng = random.Random(7)
    names = [
        UsageKey(
            f"team-{i % 40}",
            rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA L40S", "Samsung PM1733", "CXL Memory 256GB"]),
            f"Pod/job-{i}-{rng.randrange(16**10):010x}-{rng.randrange(36**5):05d}",
            rng.choice(["bound", "warm", "attaching", "detaching"]),
        )
        for i in range(keys)
    ]
    book = UsageBook()
    start = T0.replace(minute=0) - RETENTION + BUCKET
    for hour in range(int(RETENTION / BUCKET)):
        at = start + hour * BUCKET
        for key in names:
            book.hours.setdefault(at, {})[key] = round(rng.uniform(1, 3600), 3)
    return book


def test_a_week_of_800_workloads_an_hour_fits_a_configmap_gzipped() -> None:
    """The size math of docs/manager.md: 168 hourly buckets of 800 rows each (pod-named workloads,
    seconds random to the millisecond: the worst case for compression) — 134,400 rows, ~2 MB of
    JSON with the names once — gzip to about 820 KB, under the 1 MiB a ConfigMap holds."""
    book = _week(800)
    raw = _json(book)
    packed = gzip.compress(raw, mtime=0)
    assert len(raw) > 1_900_000
    assert len(packed) < 1000 * 1024, len(packed)


def test_a_record_over_the_limit_loses_its_oldest_hours_first() -> None:
    book = _week(20)
    hours = sorted(book.hours)
    payload = _fitting(book, _json, 20_000)
    assert len(payload) <= 20_000
    assert sorted(book.hours) == hours[len(hours) - len(book.hours) :]  # the newest kept
    assert 0 < len(book.hours) < len(hours)


def _claim(owners: Sequence[Mapping[str, object]]) -> ResourceClaim:
    claim = ResourceClaim.read(
        {"metadata": {"name": "c", "namespace": "ns", "uid": "u", "ownerReferences": owners}}
    )
    assert claim is not None
    return claim


def test_the_workload_is_the_claims_controller_owner() -> None:
    pod = {"kind": "Pod", "name": "train-0", "controller": True}
    other = {"kind": "ConfigMap", "name": "x"}
    assert workload_of(_claim([other, pod])) == "Pod/train-0"
    assert workload_of(_claim([other])) == "ConfigMap/x"
    assert workload_of(_claim([])) == "ResourceClaim/c"


class _Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _put(
    ledger: Ledger, device: str, claim: str, state: LedgerState, at: datetime, namespace: str | None = None
) -> None:
    """An entry as the ledger holds it, last changed ``at`` (on the tests' clock)."""
    entry = LedgerEntry(
        namespace=namespace,
        device=device,
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        node="node-0",
        host="node-0",
        claim_uid=claim,
        state=state,
        operation_id="op",
    )
    ledger.put(entry)
    entry.updated_at = at  # put stamps the wall clock


async def test_a_restarted_meter_counts_the_time_it_was_down_from_the_durable_ledger(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=3)
    clock = _Clock(T0)
    store = FileUsageStore(tmp_path)
    meter = UsageMeter(h.ledger, h.inventory, store, clock=clock)
    _put(h.ledger, "gpu0", "uid-a", LedgerState.BOUND, T0 - timedelta(minutes=5))
    _put(h.ledger, "gpu1", WARM_HOLDER, LedgerState.WARM, T0 - timedelta(minutes=5))
    await meter.resume()  # first start: counts from now
    clock.now = T0 + timedelta(seconds=100)
    meter.tick()
    await meter.flush()
    # Stopped here; down for 50 s; meanwhile (durably, before the stop) gpu2 began attaching at +120.
    _put(h.ledger, "gpu2", "uid-b", LedgerState.ATTACHING, T0 + timedelta(seconds=120))
    clock.now = T0 + timedelta(seconds=150)
    restarted = UsageMeter(h.ledger, h.inventory, store, clock=clock)
    await restarted.resume()
    restarted.tick()
    totals = restarted.totals()
    assert totals[("", "H100", "bound")] == 150.0
    assert totals[("", "H100", "warm")] == 150.0
    assert totals[("", "H100", "attaching")] == 30.0  # from its updated_at, not from the watermark
    report = restarted.report(T0, api.UsageGrouping.MODEL)
    assert [(g.name, g.bound, g.warm, g.attaching, g.total) for g in report.groups] == [
        ("H100", 150.0, 150.0, 30.0, 330.0)
    ]
    assert report.until == T0 + timedelta(seconds=150)
    assert report.since == T0.replace(minute=0)


async def test_a_paused_meter_counts_nothing_and_writes_what_it_had(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    clock = _Clock(T0)
    meter = UsageMeter(h.ledger, h.inventory, FileUsageStore(tmp_path), clock=clock)
    _put(h.ledger, "gpu0", "uid-a", LedgerState.BOUND, T0)
    await meter.resume()
    clock.now += timedelta(seconds=10)
    await meter.pause()
    clock.now += timedelta(seconds=10)
    meter.tick()
    assert meter.totals() == {}  # a follower reports nothing
    assert (await FileUsageStore(tmp_path).load()).totals == {("", "H100", "bound"): 10.0}


async def test_stranded_devices_by_reason(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=3)
    meter = UsageMeter(h.ledger, h.inventory, FileUsageStore(tmp_path), orphans_in_grace=lambda: 2)
    _put(h.ledger, "gpu1", WARM_HOLDER, LedgerState.WARM, T0)
    _put(h.ledger, "gpu2", WARM_HOLDER, LedgerState.ATTACHING, T0)
    assert meter.stranded() == {"warm": 1, "orphan-grace": 2, "outside": 0}


async def test_an_unreadable_record_stops_the_counting_not_the_manager(tmp_path: Path) -> None:
    h = await make_harness(tmp_path)
    (tmp_path / "usage.json").write_text('{"kind": "FabricDraUsage", "version": 9}')
    meter = UsageMeter(h.ledger, h.inventory, FileUsageStore(tmp_path))
    assert not await meter.try_resume()
    _put(h.ledger, "gpu0", "uid-a", LedgerState.BOUND, T0)
    meter.tick()
    await meter.flush()
    await meter.pause()
    assert not meter.counting and meter.totals() == {}
    # Nothing was written over it: an operator can still read (or move away) what it held.
    assert (tmp_path / "usage.json").read_text() == '{"kind": "FabricDraUsage", "version": 9}'


async def test_a_binding_no_ledger_entry_explains_counts_as_outside_once(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=2)
    h.fabric.bound.update({"gpu0": "node-0", "gpu1": "node-1"})
    await h.watch.refresh()
    clock = _Clock(T0)
    meter = UsageMeter(h.ledger, h.inventory, FileUsageStore(tmp_path), clock=clock)
    await meter.resume()
    # gpu1's entry is in the ledger, though the snapshot (rendered before) may not know it yet.
    _put(h.ledger, "gpu1", "uid-b", LedgerState.BOUND, T0)
    assert meter.stranded()["outside"] == 1
    clock.now += timedelta(seconds=10)
    meter.tick()
    assert meter.totals() == {("", "H100", "outside"): 10.0, ("", "H100", "bound"): 10.0}


async def test_without_the_claim_the_namespace_is_the_one_the_attach_named(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=2)
    clock = _Clock(T0)
    meter = UsageMeter(h.ledger, h.inventory, FileUsageStore(tmp_path), clock=clock)
    await meter.resume()
    _put(h.ledger, "gpu0", "uid-a", LedgerState.BOUND, T0, namespace="team-x")
    _put(h.ledger, "gpu1", WARM_HOLDER, LedgerState.WARM, T0, namespace="team-x")  # its last tenant
    clock.now += timedelta(seconds=10)
    meter.tick()
    # Warm is the pool's cost, not the last tenant's.
    assert meter.totals() == {("team-x", "H100", "bound"): 10.0, ("", "H100", "warm"): 10.0}


async def test_a_state_counts_until_it_changes_not_until_the_next_tick(tmp_path: Path) -> None:
    """Between two ticks (10 s apart): a warm refill's hot-add ends after 3 s, a warm device is
    taken by a claim after 4 s, a claim's device is detached and its entry removed after 6 s. Each
    state counts up to its change. Counted at ticks only, the refill's 3 s of hot-add were warm,
    the taken device's 4 s of warmth were lost, and so were the removed entry's 6 s."""
    h = await make_harness(tmp_path, devices=3)
    clock = _Clock(T0)
    meter = UsageMeter(h.ledger, h.inventory, FileUsageStore(tmp_path), clock=clock)
    _put(h.ledger, "gpu0", WARM_HOLDER, LedgerState.ATTACHING, T0)
    _put(h.ledger, "gpu1", WARM_HOLDER, LedgerState.WARM, T0)
    _put(h.ledger, "gpu2", "uid-c", LedgerState.BOUND, T0, namespace="team-c")
    await meter.resume()

    def change(device: str, seconds: float, claim: str, state: LedgerState, namespace: str | None) -> None:
        clock.now = T0 + timedelta(seconds=seconds)
        entry = h.ledger.get(device)
        assert entry is not None
        entry.claim_uid, entry.state, entry.namespace = claim, state, namespace
        h.ledger.put(entry)  # as the operation driver does: the entry changed in place, then put

    change("gpu0", 3, WARM_HOLDER, LedgerState.WARM, None)
    change("gpu1", 4, "uid-b", LedgerState.BOUND, "team-b")
    clock.now = T0 + timedelta(seconds=6)
    h.ledger.remove("gpu2")
    clock.now = T0 + timedelta(seconds=10)
    meter.tick()
    assert meter.totals() == {
        ("", "H100", "attaching"): 3.0,
        ("", "H100", "warm"): 7.0 + 4.0,
        ("team-b", "H100", "bound"): 6.0,
        ("team-c", "H100", "bound"): 6.0,
    }
    # A write counts up to the moment it is made, so its countedUntil covers every second in it.
    clock.now = T0 + timedelta(seconds=12)
    await meter.flush()
    record = await FileUsageStore(tmp_path).load()
    assert record.counted_until == T0 + timedelta(seconds=12)
    assert sum(record.totals.values()) == 3.0 + 11.0 + 6.0 + 6.0 + 2 * 2.0
