"""The controller's one reconcile loop (:class:`dra_driver.controller.reconciler.Reconciler`), which
the slice publisher and the node labeller both run."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.controller.reconciler import Reconciler
from manager_api.feed import InventorySource
from manager_api.models import Inventory
from plumbing.backoff import Backoff


def _inventory(version: int) -> Inventory:
    return Inventory(version=version, pools=[], devices=[], nodes=[])


class _Flaky(Exception):
    pass


async def test_a_burst_of_triggers_is_one_pass_on_the_newest_inventory() -> None:
    feed = InventorySource()
    seen: list[int] = []

    async def reconcile(inventory: Inventory) -> None:
        seen.append(inventory.version)

    loop = Reconciler(
        reconcile, retried=(_Flaky,), on_failure=lambda e, d: None, debounce=0.05, backoff=Backoff(0.01, 0.02)
    )
    async with asyncio.TaskGroup() as tasks:
        runner = tasks.create_task(loop.run(feed))
        follower = tasks.create_task(loop.follow(feed))
        for version in (1, 2, 3):
            await feed.put(_inventory(version))
            loop.trigger()
        await asyncio.sleep(0.3)
        runner.cancel()
        follower.cancel()
    assert seen == [3]


async def test_a_failed_pass_runs_again_after_a_growing_delay_and_other_errors_end_the_loop() -> None:
    feed = InventorySource()
    await feed.put(_inventory(7))
    failures: list[float] = []
    passes = 0

    async def reconcile(inventory: Inventory) -> None:
        nonlocal passes
        passes += 1
        if passes <= 3:
            raise _Flaky("not yet")
        raise RuntimeError("a bug")

    loop = Reconciler(
        reconcile,
        retried=(_Flaky,),
        on_failure=lambda err, delay: failures.append(delay),
        debounce=0.0,
        backoff=Backoff(initial=0.01, maximum=1.0, factor=2.0, jitter=0),
    )
    loop.trigger()
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(loop.run(feed), timeout=5)
    assert passes == 4
    assert failures == sorted(failures) and failures[0] < failures[-1]


async def test_no_pass_runs_before_there_is_an_inventory() -> None:
    feed = InventorySource()
    passes: list[int] = []

    async def reconcile(inventory: Inventory) -> None:
        passes.append(inventory.version)

    loop = Reconciler(
        reconcile, retried=(), on_failure=lambda e, d: None, debounce=0.0, backoff=Backoff(0.01, 0.02)
    )
    runner = asyncio.create_task(loop.run(feed))
    loop.trigger()
    await asyncio.sleep(0.05)
    assert passes == []
    await feed.put(_inventory(1))
    loop.trigger()
    await asyncio.sleep(0.05)
    runner.cancel()
    assert passes == [1]
