"""The usage meter counts open ledger entries in groups (by key, and by when they were last
counted), so that a tick costs the keys, not the entries. Held here against the definition — a
meter that walks every entry at every tick — over seeded random histories: entries put, changed
in place and removed between ticks, owners the claims informer sees late or loses, the ledger
loaded again, hours crossed, a resume before the models and owners are known."""

from __future__ import annotations

import asyncio
import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from fabric.bindings.usage import OUTSIDE, FileUsageStore, UsageBook, UsageKey, UsageMeter, _Keys
from fabric.bindings.warm_policy import model_of
from fabric.state.claims import ClaimView
from fabric.state.ledger import WARM_HOLDER, LedgerEntry, LedgerState
from plumbing.kube.dra import ResourceClaim
from tests.unit.fabric.fakes import make_harness

T0 = datetime(2026, 3, 1, 10, 40, tzinfo=UTC)


class _Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class _Claims:
    """What the manager's claim informer knows: claims it has seen, by UID."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self.synced.set()
        self.by_uid: dict[str, ResourceClaim] = {}

    def get(self, uid: str) -> ResourceClaim | None:
        return self.by_uid.get(uid)

    def show(self, uid: str, namespace: str, owner: str) -> None:
        claim = ResourceClaim.read(
            {
                "metadata": {
                    "name": f"c-{uid}",
                    "namespace": namespace,
                    "uid": uid,
                    "ownerReferences": [{"kind": "Job", "name": owner, "controller": True}],
                }
            }
        )
        assert claim is not None
        self.by_uid[uid] = claim


class _WalkingMeter(UsageMeter):
    """The definition: every tick walks every ledger entry, each counted from when it was last
    counted (or its ``updated_at``, first seen), with its keys as they are now."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ref: dict[str, tuple[_Keys, datetime]] = {}
        super().__init__(*args, **kwargs)

    async def resume(self) -> None:
        book = await self.store.load()
        now = self.clock()
        self._book, self._pending = book, UsageBook()
        self._last = book.counted_until if book.counted_until is not None else now
        self._resumed_at = now
        self._ref, self._unopened = {}, {}
        last = self._last
        if self._ready():
            self._ref = {e.device: (self._keys(e), max(last, e.updated_at)) for e in self.ledger.entries()}
        else:
            self._unopened = {
                e.device: (e.model_copy(deep=True), max(last, e.updated_at)) for e in self.ledger.entries()
            }

    def _ledger_changed(self, device: str | None) -> None:
        if device is None:
            self._ref, self._unopened = {}, {}
            return
        last = self._last
        if last is None or not self._ready():
            return
        now = self.clock()
        opened = self._ref.pop(device, None)
        loaded = self._unopened.pop(device, None)
        if opened is None and loaded is not None:
            opened = (self._keys(loaded[0]), loaded[1])
        if opened is not None:
            self._add(opened[0], max(opened[1], last), now)
        entry = self.ledger.get(device)
        if entry is not None:
            self._ref[device] = (self._keys(entry), now)

    def tick(self) -> None:
        last = self._last
        if last is None or not self._ready():
            return
        now = self.clock()
        if now <= last:
            return
        held: set[str] = set()
        for entry in self.ledger.entries():
            opened = self._ref.get(entry.device)
            start = max(last, opened[1] if opened is not None else entry.updated_at)
            keys = self._keys(entry)
            self._add(keys, start, now)
            self._ref[entry.device] = (keys, now)
            held.add(entry.claim_uid)
        for gone in [d for d in self._ref if self.ledger.get(d) is None]:
            del self._ref[gone]
        self._unopened = {}
        foreign_from = max(last, self._resumed_at or last)
        for device in self._outside():
            record = self.inventory.device(device.name)
            model = model_of(record) if record else device.model or str(device.type)
            self._pending.add(UsageKey("", model, "", OUTSIDE), foreign_from, now)
        self._pending.counted_until = self._last = now
        for uid in [u for u in self._owners if u not in held]:
            del self._owners[uid]


def _same_book(got: UsageBook, want: UsageBook) -> None:
    assert set(got.totals) == set(want.totals)
    for total, seconds in want.totals.items():
        assert math.isclose(got.totals[total], seconds, rel_tol=1e-9, abs_tol=1e-6), total
    assert set(got.hours) == set(want.hours)
    for hour, rows in want.hours.items():
        assert set(got.hours[hour]) == set(rows), hour
        for key, seconds in rows.items():
            assert math.isclose(got.hours[hour][key], seconds, rel_tol=1e-9, abs_tol=1e-6), (hour, key)
    assert got.counted_until == want.counted_until


@pytest.mark.parametrize("every_step", [False, True])
@pytest.mark.parametrize("seed", range(8))
async def test_grouped_counting_is_the_walk_over_every_entry(
    tmp_path: Path, seed: int, every_step: bool
) -> None:
    rng = random.Random(seed)
    h = await make_harness(tmp_path, devices=12)
    clock, claims = _Clock(T0), _Claims()
    grouped = UsageMeter(
        h.ledger, h.inventory, FileUsageStore(tmp_path / "g"), claims=cast(ClaimView, claims), clock=clock
    )
    walking = _WalkingMeter(
        h.ledger, h.inventory, FileUsageStore(tmp_path / "w"), claims=cast(ClaimView, claims), clock=clock
    )
    (tmp_path / "g").mkdir()
    (tmp_path / "w").mkdir()
    devices = [f"gpu{i}" for i in range(12)]
    uids = [f"uid-{i}" for i in range(8)]
    if rng.random() < 0.5:  # entries the ledger held before the meters started
        for device in rng.sample(devices, 5):
            entry = LedgerEntry(
                namespace="before",
                device=device,
                device_key=f"/x/{device}",
                node="node-0",
                host="node-0",
                claim_uid=rng.choice(uids),
                state=LedgerState.BOUND,
                operation_id="op",
            )
            h.ledger.put(entry)
            entry.updated_at = T0 - timedelta(seconds=rng.randrange(0, 600))
    if rng.random() < 0.3:  # resumed before the claims are listed: nothing counts until they are
        claims.synced.clear()
    await grouped.resume()
    await walking.resume()
    ticks = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.25:
            clock.now += timedelta(seconds=rng.choice([0, 0.5, 3, 17, 240, 1900]))
        elif op < 0.55:
            device = rng.choice(devices)
            warm = rng.random() < 0.25
            state = rng.choice(
                [LedgerState.WARM, LedgerState.ATTACHING, LedgerState.DETACHING]
                if warm
                else [LedgerState.BOUND, LedgerState.ATTACHING, LedgerState.DETACHING]
            )
            found = h.ledger.get(device)
            entry = (
                found
                if found is not None
                else LedgerEntry(
                    device=device,
                    device_key=f"/x/{device}",
                    node="node-1",
                    host="node-1",
                    claim_uid="x",
                    state=state,
                    operation_id="op",
                )
            )
            # changed in place, then put, as the operation driver does
            entry.claim_uid = WARM_HOLDER if warm else rng.choice(uids)
            entry.state, entry.namespace = state, rng.choice([None, "team-x", "team-y"])
            h.ledger.put(entry)
        elif op < 0.65:
            h.ledger.remove(rng.choice(devices))
        elif op < 0.75:
            uid = rng.choice(uids)
            if uid in claims.by_uid and rng.random() < 0.4:
                del claims.by_uid[uid]  # the claim deleted: an owner already learnt is kept
            else:
                claims.show(uid, rng.choice(["team-a", "team-b"]), rng.choice(["train", "serve"]))
        elif op < 0.78:
            for listener in h.ledger.listeners:
                listener(None)  # the whole ledger loaded again
        elif op < 0.80:
            claims.synced.set()
        else:
            grouped.tick()
            walking.tick()
            ticks += 1
            _same_book(grouped.book(), walking.book())
        if every_step:  # a book is read (and a tick made) after every step
            _same_book(grouped.book(), walking.book())
    clock.now += timedelta(seconds=5)
    claims.synced.set()
    _same_book(grouped.book(), walking.book())
    assert ticks > 20 and sum(walking.book().totals.values()) > 0
    assert set(grouped._owners) == set(walking._owners)


async def test_a_tick_over_10000_entries_adds_one_interval_per_key(tmp_path: Path) -> None:
    """10,000 bound entries of two namespaces, of devices the inventory does not hold and claims
    the informer has not seen: after the first tick, a tick adds one interval per key (two), not
    one per entry, makes no entry's keys again (what they lack is looked up, and still lacking),
    and each key's seconds are its entries times the time."""
    h = await make_harness(tmp_path, devices=2)
    clock = _Clock(T0)
    meter = UsageMeter(
        h.ledger, h.inventory, FileUsageStore(tmp_path), claims=cast(ClaimView, _Claims()), clock=clock
    )
    await meter.resume()
    for i in range(10_000):
        h.ledger.put(
            LedgerEntry(
                namespace=f"team-{i % 2}",
                device=f"gpu{i % 2}-{i}",
                device_key=f"/x/{i}",
                node="node-0",
                host="node-0",
                claim_uid=f"uid-{i}",
                state=LedgerState.BOUND,
                operation_id="op",
            )
        )
    clock.now += timedelta(seconds=5)
    meter.tick()
    adds: list[UsageKey] = []
    original = meter._pending.add

    def counting_add(key: UsageKey, *args: Any, **kwargs: Any) -> None:
        adds.append(key)
        original(key, *args, **kwargs)

    meter._pending.add = counting_add  # type: ignore[method-assign]
    made: list[LedgerEntry] = []
    key_list = meter.keys.key_list

    def counting_keys(entry: LedgerEntry) -> _Keys:
        made.append(entry)
        return key_list(entry)

    meter.keys.key_list = counting_keys  # type: ignore[method-assign]
    clock.now += timedelta(seconds=5)
    meter.tick()
    assert len(adds) == 2
    assert made == []
    assert meter.totals() == {
        ("team-0", "unknown", "bound"): 50_000.0,
        ("team-1", "unknown", "bound"): 50_000.0,
    }
