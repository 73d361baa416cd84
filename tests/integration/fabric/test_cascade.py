"""Cascaded switches (issue 37): the emulator runs each packaged cascade — a spine with leaves, and
spines, aggregation switches and leaves — with hosts and devices on different leaves and one leaf
linked to nothing; the real manager discovers it, and the reach it publishes (reach groups, and the
slices and node labels the controller writes from them) is compared with a map written out by hand
from the cabling. An attach across leaves goes through end to end, one to the unlinked leaf from
elsewhere is refused, and a pulled cable (the emulator's ``LinkRemoved`` fault) changes reach on
the manager's next pass.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from dra_driver.explain import published
from dra_driver.selection.nodes import selector_matches
from emulator.topology import preset_path
from manager_api.client import ManagerClient
from manager_api.errors import BindRefused
from manager_api.models import AttachmentState, Inventory
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    Tls,
    manager_for,
    plugin_token,
    tls_emulator,
)
from tests.support.uids import claim_uid

DRIVER = "fabric-dra.io"
W1, W2, W3, W4, W5 = "kind-worker", "kind-worker2", "kind-worker3", "kind-worker4", "kind-worker5"

#: cascade-2tier: leaf0 (kind-worker, kind-worker2; gpu0 gpu1), leaf1 (kind-worker3; gpu2 nvme0) and
#: leaf2 (gpu3 nic0) under spine0; leaf3 (kind-worker4; gpu4 fpga0) linked to nothing
TWO_TIER = {
    "gpu0": {W1, W2, W3},
    "gpu1": {W1, W2, W3},
    "gpu2": {W1, W2, W3},
    "nvme0": {W1, W2, W3},
    "gpu3": {W1, W2, W3},
    "nic0": {W1, W2, W3},
    "gpu4": {W4},
    "fpga0": {W4},
}
#: cascade-3tier: spine0 and spine1 both over agg0 (leaf0: kind-worker, gpu0; leaf1: kind-worker2)
#: and agg1 (leaf2: gpu1 nvme0; leaf3: kind-worker3, gpu2 nic0); agg2 over leaf4 (kind-worker5)
#: and leaf5 (gpu3 fpga0) with no spine; leaf6 (kind-worker4; gpu4 nvme1) linked to nothing
THREE_TIER = {
    "gpu0": {W1, W2, W3},
    "gpu1": {W1, W2, W3},
    "nvme0": {W1, W2, W3},
    "gpu2": {W1, W2, W3},
    "nic0": {W1, W2, W3},
    "gpu3": {W5},
    "fpga0": {W5},
    "gpu4": {W4},
    "nvme1": {W4},
}
#: cascade-2tier after the cable between spine0 and leaf1 is pulled
TWO_TIER_CUT = TWO_TIER | {
    "gpu0": {W1, W2},
    "gpu1": {W1, W2},
    "gpu3": {W1, W2},
    "nic0": {W1, W2},
    "gpu2": {W3},
    "nvme0": {W3},
}


def reach_of(inventory: Inventory) -> dict[str, set[str]]:
    """Device → the nodes the manager says reach it (its reach group's, else its pool's)."""
    groups = {(p.pool, g.id): set(g.nodes) for p in inventory.pools for g in p.reach_groups}
    pools = {p.pool: set(p.nodes) for p in inventory.pools}
    return {d.name: groups[(d.pool, d.reach)] if d.reach else pools[d.pool] for d in inventory.devices}


def check_published(inventory: Inventory, nodes: tuple[str, ...], expected: dict[str, set[str]]) -> None:
    """Every slice the controller would write selects exactly the nodes that reach its devices."""
    slices, labelled = published(inventory, nodes, DRIVER)
    seen = set()
    for slice_ in slices:
        selector = slice_.spec.node_selector
        assert selector is not None, slice_.name
        selected = {n.name for n in labelled if selector_matches(selector, n)}
        for device in slice_.spec.devices:
            assert selected == expected[device.name], (slice_.name, device.name, selected)
            seen.add(device.name)
    assert seen == set(expected)


async def test_two_tier_reach_attach_across_leaves_and_a_pulled_cable(tmp_path: Path, tls: Tls) -> None:
    nodes = (W1, W2, W3, W4)
    with (
        tls_emulator(tmp_path / "fabric", tls, topology=preset_path("cascade-2tier")) as fabric,
        manager_for(fabric, tmp_path / "manager", "--resync-seconds", "0.5", nodes=nodes) as manager,
    ):
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN) as controller:
            inventory = await controller.inventory()
            assert reach_of(inventory) == TWO_TIER
            check_published(inventory, nodes, TWO_TIER)

            # across leaves: kind-worker (leaf0) gets gpu3 (leaf2) through spine0
            async with ManagerClient(manager.address, token=plugin_token(W1)) as plugin:
                uid = claim_uid("cascade-across")
                attached = await plugin.attach("gpu3", W1, uid, wait_seconds=30)
                assert attached.state is AttachmentState.ATTACHED
                assert fabric.bound_hosts() == {"gpu3": W1}
                # leaf3 is linked to nothing: its devices are for its own host only
                refused = claim_uid("cascade-unlinked")
                try:
                    await plugin.attach("gpu4", W1, refused, wait_seconds=30)
                except BindRefused as err:
                    assert "not reachable from node kind-worker" in str(err)
                else:
                    raise AssertionError("gpu4 attached to a host on another, unlinked leaf")
                detached = await plugin.detach("gpu3", W1, uid, wait_seconds=30)
                assert detached.state is AttachmentState.DETACHED
            async with ManagerClient(manager.address, token=plugin_token(W4)) as plugin:
                uid = claim_uid("cascade-own-leaf")
                assert (
                    await plugin.attach("gpu4", W4, uid, wait_seconds=30)
                ).state is AttachmentState.ATTACHED
                assert fabric.bound_hosts() == {"gpu4": W4}
                await plugin.detach("gpu4", W4, uid, wait_seconds=30)

            # the cable between spine0 and leaf1 is pulled: the next pass narrows reach
            fabric.inject({"Kind": "LinkRemoved", "Switch": "spine0", "Port": "ISL1"})
            inventory = await changed(controller, inventory, TWO_TIER_CUT)
            assert reach_of(inventory) == TWO_TIER_CUT
            check_published(inventory, nodes, TWO_TIER_CUT)
            # and back when it is plugged in again
            fabric.reset_faults()
            inventory = await changed(controller, inventory, TWO_TIER)
            assert reach_of(inventory) == TWO_TIER


async def changed(controller: ManagerClient, inventory: Inventory, wanted: dict[str, set[str]]) -> Inventory:
    """The inventory once its reach is ``wanted`` (passes run every 0.5 s), or the last one after
    30 s of new versions, for the caller's assertion to show."""
    deadline = time.monotonic() + 30
    while reach_of(inventory) != wanted and time.monotonic() < deadline:
        inventory = await controller.inventory(after=inventory.version, timeout_seconds=5)
        await asyncio.sleep(0)
    return inventory


async def test_three_tier_reach_through_two_spines(tmp_path: Path, tls: Tls) -> None:
    nodes = (W1, W2, W3, W4, W5)
    with (
        tls_emulator(tmp_path / "fabric", tls, topology=preset_path("cascade-3tier")) as fabric,
        manager_for(fabric, tmp_path / "manager", nodes=nodes) as manager,
    ):
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN) as controller:
            inventory = await controller.inventory()
        assert reach_of(inventory) == THREE_TIER
        check_published(inventory, nodes, THREE_TIER)
        # kind-worker2 (leaf1, under agg0) gets gpu1 (leaf2, under agg1): up to a spine and down
        async with ManagerClient(manager.address, token=plugin_token(W2)) as plugin:
            uid = claim_uid("cascade-3tier")
            assert (await plugin.attach("gpu1", W2, uid, wait_seconds=30)).state is AttachmentState.ATTACHED
            assert fabric.bound_hosts() == {"gpu1": W2}
            assert (await plugin.detach("gpu1", W2, uid, wait_seconds=30)).state is AttachmentState.DETACHED
