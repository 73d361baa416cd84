"""The per-node change feed (``GET /api/v1/inventory/changes?node=N``) of a real manager in front of
the real emulator: a node's long poll wakes for its own devices only (arriving, leaving, moved to
or from it), its answer still brings the cursor to the current version, and a plugin's token asks
for its own node only. Then a plugin's feed against a manager without the filter (the stand-in,
which ignores ``node`` as managers before it do) falls back to every change."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from manager_api.client import ManagerClient
from manager_api.errors import PermissionDenied
from manager_api.feed import InventoryFeed
from manager_api.models import Health
from tests.integration.fabric.conftest import CONTROLLER_TOKEN, NODES, FabricAdmin, manager_for, plugin_token
from tests.support.uids import claim_uid


async def test_a_node_is_woken_by_its_own_devices_only_and_sees_them_leave(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    a, b = NODES[0], NODES[1]
    with manager_for(fabric, tmp_path) as manager:
        async with (
            ManagerClient(manager.address, token=CONTROLLER_TOKEN) as controller,
            ManagerClient(manager.address, token=plugin_token(a)) as plugin_a,
            ManagerClient(manager.address, token=plugin_token(b)) as plugin_b,
        ):
            inventory = await controller.inventory()
            assert inventory.epoch is not None
            epoch, start = inventory.epoch, inventory.version

            # a plugin asks for its own node only; the controller for any
            with pytest.raises(PermissionDenied, match="its own node"):
                await plugin_a.inventory_changes(epoch=epoch, since=start, timeout_seconds=0, node=b)
            idle = await controller.inventory_changes(epoch=epoch, since=start, timeout_seconds=0, node=b)
            assert (idle.node, idle.version, idle.devices) == (b, start, [])

            # an attach on a: a's poll wakes with gpu0, b's keeps waiting
            poll_a = asyncio.create_task(
                plugin_a.inventory_changes(epoch=epoch, since=start, timeout_seconds=30, node=a)
            )
            poll_b = asyncio.create_task(
                plugin_b.inventory_changes(epoch=epoch, since=start, timeout_seconds=30, node=b)
            )
            await asyncio.sleep(0.2)
            assert not poll_a.done() and not poll_b.done()
            await controller.attach("gpu0", a, claim_uid("node-feed-1"), wait_seconds=20)
            woken_a = await asyncio.wait_for(poll_a, 10)
            assert woken_a.node == a and [d.name for d in woken_a.devices] == ["gpu0"]
            assert woken_a.since == start and woken_a.version > start
            # the manager has moved on (the unfiltered feed says so) and b's poll still waits
            every = await controller.inventory_changes(epoch=epoch, since=start, timeout_seconds=0)
            assert [d.name for d in every.devices] == ["gpu0"] and every.version > start
            await asyncio.sleep(0.3)
            assert not poll_b.done()

            # an attach on b wakes b's poll with gpu1 alone, at the current version: the versions
            # of a's attach are passed over, never read again
            await controller.attach("gpu1", b, claim_uid("node-feed-2"), wait_seconds=20)
            woken_b = await asyncio.wait_for(poll_b, 10)
            assert [d.name for d in woken_b.devices] == ["gpu1"] and woken_b.since == start
            assert woken_b.version > every.version
            current = (await controller.inventory()).version
            caught_up = await plugin_b.inventory_changes(
                epoch=epoch, since=woken_b.version, timeout_seconds=0, node=b
            )
            # at most gpu1 again (its attach finishing after the poll woke), and the current version
            assert {d.name for d in caught_up.devices} <= {"gpu1"} and caught_up.version == current

            # gpu0 moves from a to b: a's feed sees it leave, b's sees it arrive
            cursor_a = (
                await plugin_a.inventory_changes(
                    epoch=epoch, since=woken_a.version, timeout_seconds=0, node=a
                )
            ).version
            cursor_b = caught_up.version
            await controller.detach("gpu0", a, claim_uid("node-feed-1"), wait_seconds=20)
            await controller.attach("gpu0", b, claim_uid("node-feed-3"), wait_seconds=20)
            left = await plugin_a.inventory_changes(epoch=epoch, since=cursor_a, timeout_seconds=0, node=a)
            arrived = await plugin_b.inventory_changes(epoch=epoch, since=cursor_b, timeout_seconds=0, node=b)
            assert [d.name for d in left.devices] == ["gpu0"] and left.devices[0].node == b
            assert [d.name for d in arrived.devices] == ["gpu0"] and arrived.devices[0].node == b
            # a third node saw none of it
            third = await controller.inventory_changes(
                epoch=epoch, since=start, timeout_seconds=0, node=NODES[2]
            )
            assert third.devices == [] and third.version == left.version == arrived.version

            await controller.detach("gpu0", b, claim_uid("node-feed-3"), wait_seconds=20)
            await controller.detach("gpu1", b, claim_uid("node-feed-2"), wait_seconds=20)


async def test_a_plugin_feed_falls_back_on_a_manager_without_the_node_filter() -> None:
    inventory = make_inventory([make_device(f"gpu{i}") for i in range(3)])
    with InventoryServer(inventory) as manager:
        async with ManagerClient(manager.url) as client:
            feed = InventoryFeed(client, node="node-a", poll_timeout=5)
            first = await feed.read(0)
            assert first is not None and feed.node == "node-a"
            # a change of a device on no node: a filtering manager would not send it, this one does
            critical = make_device("gpu2", health=Health.CRITICAL)
            manager.set_inventory(make_inventory([*inventory.devices[:2], critical]))
            changed = await feed.read()
            assert changed is not None and feed.devices()["gpu2"].health is Health.CRITICAL
            # the answer did not name the node: the feed follows every change from then on
            assert feed.node is None
            manager.set_inventory(
                make_inventory([make_device("gpu0", health=Health.WARNING), *changed.devices[1:]])
            )
            again = await feed.read()
            assert again is not None and feed.devices()["gpu0"].health is Health.WARNING
