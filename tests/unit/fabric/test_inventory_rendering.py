"""The inventory re-renders only what changed and serves its JSON encoded once per version; what it
serves must always be the whole inventory as the API model says."""

from __future__ import annotations

import json
from pathlib import Path

from fabric.inventory import Inventory
from manager_api import models as api
from tests.unit.fabric.fakes import make_harness


def _served(inventory: Inventory) -> dict[str, object]:
    data: dict[str, object] = json.loads(inventory.snapshot_json())
    return data


async def test_served_json_is_the_whole_inventory_after_every_change(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=2, devices=3)
    inventory = h.inventory

    def check() -> api.Inventory:
        snapshot = inventory.snapshot()
        assert _served(inventory) == json.loads(snapshot.model_dump_json(by_alias=True))
        assert api.Inventory.model_validate_json(inventory.snapshot_json()) == snapshot
        return snapshot

    first = check()
    assert [d.state for d in first.devices] == [api.BindingState.FREE] * 3

    await h.attachments.attach(
        api.AttachRequest.model_construct(device="gpu1", node="node-0", claim_uid="c1"), wait=5
    )
    bound = check()
    assert bound.version > first.version
    gpu1 = next(d for d in bound.devices if d.name == "gpu1")
    assert (gpu1.state, gpu1.node, gpu1.claim_uid) == (api.BindingState.BOUND, "node-0", "c1")

    await h.attachments.detach("gpu1", "c1", "node-0", wait=5)
    freed = check()
    assert next(d for d in freed.devices if d.name == "gpu1").state is api.BindingState.FREE

    h.fabric.bound["gpu2"] = "node-1"  # bound outside fabric-dra, seen by the next pass
    await inventory.refresh()
    outside = next(d for d in check().devices if d.name == "gpu2")
    assert (outside.state, outside.node, outside.managed) == (api.BindingState.BOUND, "node-1", False)

    version = inventory.version
    await inventory.refresh()  # nothing changed: same version, same bytes
    assert inventory.version == version
