"""The inventory's change feed (``GET /api/v1/inventory/changes``) of a real manager in front of the
real emulator: it answers only the devices that changed, long-polls like ``?after=``, and answers
``410 ResyncRequired`` once a cursor is older than its bounded history or of another incarnation
(a restarted manager)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from manager_api.client import ManagerClient
from manager_api.errors import ResyncRequired
from manager_api.models import BindingState
from tests.integration.fabric.conftest import CONTROLLER_TOKEN, NODES, FabricAdmin, manager_for
from tests.support.uids import claim_uid


async def test_the_feed_answers_what_changed_and_resyncs_when_it_cannot(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    node = NODES[0]
    with manager_for(fabric, tmp_path / "first", "--change-history-versions", "3") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN) as client:
            inventory = await client.inventory()
            assert inventory.epoch is not None and len(inventory.devices) > 2
            epoch = inventory.epoch

            # nothing changed: the long poll ends empty at its timeout, at the same version
            idle = await client.inventory_changes(epoch=epoch, since=inventory.version, timeout_seconds=0.3)
            assert (idle.version, idle.devices, idle.removed) == (inventory.version, [], [])
            assert [p.pool for p in idle.pools] == [p.pool for p in inventory.pools]

            # one attach: the waiting poll wakes with that device alone, as the inventory shows it
            poll = asyncio.create_task(
                client.inventory_changes(epoch=epoch, since=inventory.version, timeout_seconds=30)
            )
            await asyncio.sleep(0.2)
            assert not poll.done()
            await client.attach("gpu0", node, claim_uid("feed-1"), wait_seconds=20)
            changes = await asyncio.wait_for(poll, 10)
            assert changes.version > inventory.version and changes.since == inventory.version
            assert [d.name for d in changes.devices] == ["gpu0"] and changes.removed == []
            assert changes.devices[0].state in (BindingState.ATTACHING, BindingState.BOUND)
            caught_up = await client.inventory_changes(epoch=epoch, since=changes.version, timeout_seconds=0)
            after_attach = caught_up.version
            full = {d.name: d for d in (await client.inventory()).devices}
            assert full["gpu0"].state is BindingState.BOUND
            # every change since the first read, merged: still gpu0 only, as the full read shows it
            merged = await client.inventory_changes(epoch=epoch, since=inventory.version, timeout_seconds=0)
            assert [d.name for d in merged.devices] == ["gpu0"]
            assert merged.devices[0] == full["gpu0"]

            # more versions than the history holds (3): the first cursor is refused, a recent one is not
            for turn in range(3):
                await client.detach("gpu0", node, claim_uid(f"feed-{turn + 1}"), wait_seconds=20)
                await client.attach("gpu0", node, claim_uid(f"feed-{turn + 2}"), wait_seconds=20)
            with pytest.raises(ResyncRequired, match="no longer known"):
                await client.inventory_changes(epoch=epoch, since=after_attach, timeout_seconds=5)
            latest = await client.inventory()
            recent = await client.inventory_changes(epoch=epoch, since=latest.version, timeout_seconds=0)
            assert recent.devices == []
            # a cursor of another epoch is refused at once, not waited on
            with pytest.raises(ResyncRequired):
                await client.inventory_changes(epoch=epoch + 1, since=latest.version, timeout_seconds=30)
            await client.detach("gpu0", node, claim_uid("feed-4"), wait_seconds=20)
            last = (await client.inventory()).version

    # a restarted manager counts in a new epoch: the old cursor is refused, a fresh read works
    with manager_for(fabric, tmp_path / "second") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN) as client:
            with pytest.raises(ResyncRequired):
                await client.inventory_changes(epoch=epoch, since=last, timeout_seconds=5)
            again = await client.inventory()
            assert again.epoch is not None and again.epoch != epoch
            fresh = await client.inventory_changes(epoch=again.epoch, since=again.version, timeout_seconds=0)
            assert fresh.devices == [] and fresh.version == again.version
