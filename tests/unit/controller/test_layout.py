"""The layout that stays put (:mod:`dra_driver.controller.layout`), the patch of a change
(:mod:`dra_driver.controller.patch`) and the delta it starts from (:mod:`dra_driver.controller.delta`):

- a device added, removed or changed moves no other device between slices;
- over random sequences of adds, removes, health changes and drains, the patched pools are exactly
  what a whole build from the same last layout gives, every layout is valid (each published device in
  exactly one slice of its node selection, no slice past its limit or empty), planning only the
  patched slices brings the store where planning every slice does, and a controller that starts over
  the stored slices writes nothing.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from dra_driver.controller.delta import device_delta
from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.layout import cut, slice_limit, sticky_chunks, stored_layouts
from dra_driver.controller.patch import patch_pools
from dra_driver.controller.render_memo import RenderMemo
from dra_driver.controller.slices import DesiredPool, DeviceMarks, NormalCache, desired_pools, plan_pool
from manager_api.models import Device, DeviceDrain, DrainEffect, Health, Inventory
from tests.support.controller import make_device, make_inventory

DRIVER = "layout.fabric-dra.io"
POOL = "fabric-pcie"
POLICY = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)


def dev(name: str) -> dict[str, Any]:
    return {"name": name}


def names(chunks: list[list[dict[str, Any]]]) -> list[list[str]]:
    return [[str(d["name"]) for d in chunk] for chunk in chunks]


def test_an_added_device_goes_where_there_is_room_and_moves_no_other() -> None:
    before = names(cut([dev(f"d{i:03d}") for i in range(130)], taintable=True))
    assert [len(c) for c in before] == [64, 64, 2]
    devices = [dev(f"d{i:03d}") for i in range(130)] + [dev("d0005a")]
    after = names(sticky_chunks(devices, before, taintable=True))
    assert after[0] == before[0] and after[1] == before[1]
    assert after[2] == ["d0005a", "d128", "d129"]


def test_a_removed_device_leaves_a_gap_and_a_full_selection_gets_a_new_slice() -> None:
    before = names(cut([dev(f"d{i:03d}") for i in range(128)], taintable=True))
    devices = [dev(f"d{i:03d}") for i in range(128) if i != 3]
    after = names(sticky_chunks(devices, before, taintable=True))
    assert after == [[n for n in before[0] if n != "d003"], before[1]]
    grown = names(sticky_chunks([*devices, dev("d003"), dev("e")], after, taintable=True))
    assert grown == [before[0], before[1], ["e"]]  # the gap first, then a new slice


def test_a_slice_past_its_limit_gives_up_its_last_devices() -> None:
    before = [[f"d{i:03d}" for i in range(128)]]
    devices = [dev(f"d{i:03d}") for i in range(128)]
    devices[0] = {"name": "d000", "taints": [{"key": "k", "effect": "NoSchedule"}]}
    after = sticky_chunks(devices, before, taintable=False)
    assert [len(c) for c in after] == [64, 64]
    assert all(len(c) <= slice_limit(c, False) for c in after)


# -- random sequences -----------------------------------------------------------------------


def gpu(i: int, **kw: Any) -> Device:
    return make_device(f"gpu-{i:04d}", switch=f"Switch{i % 3}", **kw)


class Store:
    """The stored slices of one pool, as an API server keeps them (uid, resourceVersion)."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.normal = NormalCache()
        self._rv = 0

    def apply(self, desired: DesiredPool, only: set[int] | None = None) -> int:
        plan = plan_pool(POOL, desired, dict(self.slices), driver=DRIVER, normal_of=self.normal, only=only)
        if plan is None:
            return 0
        for write in [*plan.writes, *plan.writes_after]:
            self._rv += 1
            meta = {**write.obj["metadata"], "uid": write.name, "resourceVersion": str(self._rv)}
            self.slices[write.name] = {**write.obj, "metadata": meta}
            if write.normal is not None:
                self.normal.remember(self.slices[write.name], write.normal)
        for name, _ in [*plan.deletes_first, *plan.deletes]:
            self.slices.pop(name, None)
        return len(plan.writes) + len(plan.writes_after) + len(plan.deletes)


def step(rng: random.Random, devices: list[Device], fresh: list[int]) -> list[Device]:
    """One random change of a few devices: health, drain, add, remove."""
    out = list(devices)
    touched: set[str] = set()  # each device once: a change and its undo would be no change at all
    for _ in range(rng.randint(1, 4)):
        what = rng.random()
        i = rng.randrange(len(out))
        if out[i].name in touched:
            continue
        touched.add(out[i].name)
        if what < 0.35:
            health = Health.CRITICAL if out[i].health is Health.OK else Health.OK
            out[i] = out[i].model_copy(update={"health": health})
        elif what < 0.5:
            drain = DeviceDrain(
                reason="maintenance", effect=DrainEffect.NO_SCHEDULE, since=datetime.now(UTC), drains=["x"]
            )
            out[i] = out[i].model_copy(update={"drain": None if out[i].drain else drain})
        elif what < 0.75 and len(out) > 70:
            del out[i]
        else:
            fresh[0] += 1  # a name between two others: it sorts into the middle of the pool
            out.append(make_device(f"{out[i].name}x{fresh[0]}", switch=f"Switch{i % 3}"))
    return sorted(out, key=lambda d: d.name)  # the feed's order: by name


def check_valid(pool: DesiredPool) -> None:
    seen: set[str] = set()
    for chunk, placement in zip(pool.chunks, pool.placements, strict=True):
        assert chunk or len(pool.chunks) == 1, "an empty slice"
        assert len(chunk) <= slice_limit(chunk, POLICY.device_taints)
        for device in chunk:
            assert device["name"] not in seen, f"{device['name']} twice"
            seen.add(device["name"])
        assert "nodeSelector" in placement
    assert pool.where() == {str(d["name"]): i for i, c in enumerate(pool.chunks) for d in c}


@pytest.mark.parametrize("seed", range(6))
def test_random_changes_patch_what_a_whole_build_gives_and_a_restart_writes_nothing(seed: int) -> None:
    rng = random.Random(seed)
    devices = [gpu(i) for i in range(rng.randint(60, 200))]
    fresh = [1000]
    memo = RenderMemo()
    inventory = make_inventory(devices, pools={POOL: ["node-a", "node-b"]})
    pools = desired_pools(inventory, POLICY, memo=memo)
    store = Store()
    store.apply(pools[POOL])
    patched_steps = 0
    for _ in range(40):
        after = Inventory.model_construct(
            **{**dict(inventory), "devices": step(rng, list(inventory.devices), fresh)}
        )
        whole = desired_pools(after, POLICY, before={POOL: pools[POOL].layout()})
        kept = {n: i for i, c in enumerate(pools[POOL].chunks) for n in (str(d["name"]) for d in c)}
        count = len(pools[POOL].chunks)
        patched = patch_pools(pools, after, device_delta(inventory, after), POLICY, DeviceMarks(), memo)
        if patched is None:
            pools, only = desired_pools(after, POLICY, memo=memo, before={POOL: pools[POOL].layout()}), None
        else:
            patched_steps += 1
            pools, only = patched.pools, patched.changed.get(POOL, set())
            assert names(pools[POOL].chunks) == names(whole[POOL].chunks)
            assert pools[POOL].chunks == whole[POOL].chunks and pools[POOL].withheld == whole[POOL].withheld
        check_valid(pools[POOL])
        if len(pools[POOL].chunks) == count:
            # no device that is still published changed its slice
            moved = {n for n, i in pools[POOL].where().items() if n in kept and kept[n] != i}
            assert not moved, moved
        # planning only the patched slices brings the store where planning all of them does
        twin = Store()
        twin.slices, twin.normal = dict(store.slices), NormalCache()
        store.apply(pools[POOL], only)
        twin.apply(pools[POOL])
        assert {k: v["spec"] for k, v in store.slices.items()} == {
            k: v["spec"] for k, v in twin.slices.items()
        }
        # a controller that starts over the stored slices writes nothing
        restarted = desired_pools(after, POLICY, before=stored_layouts(store.slices))
        assert Store.apply(_copy(store), restarted[POOL]) == 0
        inventory = after
    assert patched_steps > 10


def _copy(store: Store) -> Store:
    twin = Store()
    twin.slices = dict(store.slices)
    return twin


def test_a_delta_is_the_devices_changed_added_and_removed() -> None:
    rng = random.Random(7)
    inventory = make_inventory([gpu(i) for i in range(500)])
    fresh = [1000]
    for _ in range(200):
        after = Inventory.model_construct(
            **{**dict(inventory), "devices": step(rng, list(inventory.devices), fresh)}
        )
        delta = device_delta(inventory, after)
        assert {id(d) for d in delta.new} == {id(d) for d in after.devices} - {
            id(d) for d in inventory.devices
        }
        assert {id(d) for d in delta.old} == {id(d) for d in inventory.devices} - {
            id(d) for d in after.devices
        }
        inventory = after
    assert len(device_delta(inventory, inventory)) == 0
