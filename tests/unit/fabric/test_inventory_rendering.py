"""The inventory re-renders only what changed and serves its JSON encoded once per version; what it
serves must always be the whole inventory as the API model says."""

from __future__ import annotations

import json
from pathlib import Path

from fabric.state.inventory import Inventory
from fabric.state.ledger import LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord
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
    await h.watch.refresh()
    outside = next(d for d in check().devices if d.name == "gpu2")
    assert (outside.state, outside.node, outside.managed) == (api.BindingState.BOUND, "node-1", False)

    version = inventory.version
    await h.watch.refresh()  # nothing changed: same version, same bytes
    assert inventory.version == version


async def test_a_change_to_one_device_rechecks_that_device_only(tmp_path: Path) -> None:
    """At 10,000 bindings an attach must not re-check the other 9,999 devices (docs/performance.md,
    "Ledger"): a change that names its device is flushed by looking at that device alone, and what
    is served is still the whole inventory."""
    h = await make_harness(tmp_path, hosts=2, devices=40)
    inventory = h.inventory
    before = inventory.snapshot()
    checked: list[str] = []
    original = inventory._view_changed

    def counting(record: DeviceRecord) -> bool:
        checked.append(record.name)
        return original(record)

    inventory._view_changed = counting  # type: ignore[method-assign]
    await h.attachments.attach(
        api.AttachRequest.model_construct(device="gpu7", node="node-1", claim_uid="c7"), wait=5
    )
    after = inventory.snapshot()
    assert checked and set(checked) == {"gpu7"}
    assert after.version > before.version
    assert [d.name for d in after.devices] == [d.name for d in before.devices]
    assert _served(inventory) == json.loads(after.model_dump_json(by_alias=True))

    checked.clear()
    inventory.changed()  # anything may have changed: every device is looked at again
    inventory.snapshot()
    assert sorted(checked) == sorted(d.name for d in before.devices)


async def test_a_ledger_entry_put_by_anyone_is_served_without_a_further_change(tmp_path: Path) -> None:
    """The ledger tells the inventory which device's entry changed: an entry put directly (a warm
    pool's, say) shows at once, not at the next unrelated change."""
    h = await make_harness(tmp_path, hosts=2, devices=3)
    version = h.inventory.snapshot().version
    h.ledger.put(
        LedgerEntry(
            device="gpu2",
            device_key="/redfish/v1/gpu2",
            node="node-0",
            host="node-0",
            claim_uid="",
            state=LedgerState.WARM,
            operation_id="op-1",
        )
    )
    served = h.inventory.snapshot()
    assert served.version > version
    gpu2 = next(d for d in served.devices if d.name == "gpu2")
    assert (gpu2.state, gpu2.node) == (api.BindingState.WARM, "node-0")


async def test_devices_are_kept_as_their_json_and_read_back_the_same(tmp_path: Path) -> None:
    """Each device is kept as the JSON it is served as, with the few facts the gauges, the usage
    meter and the log of foreign bindings count (no model per device): the models read back
    from that JSON are the devices rendered now, and the facts say what those devices say."""
    h = await make_harness(tmp_path, hosts=2, devices=6)
    inventory = h.inventory
    await h.attachments.attach(
        api.AttachRequest.model_construct(device="gpu1", node="node-0", claim_uid="c1"), wait=5
    )
    h.fabric.bound["gpu2"] = "node-1"  # bound outside fabric-dra
    await h.watch.refresh()

    snapshot = inventory.snapshot()
    rendered = [inventory.render_device(r) for r in sorted(inventory.devices(), key=lambda r: r.name)]
    assert snapshot.devices == rendered
    assert inventory.snapshot() is snapshot  # once per version
    assert [
        (f.name, f.state, f.managed, f.node, f.host, f.type, f.model, f.health) for f in inventory.facts()
    ] == [
        (d.name, d.state, d.managed, d.node, d.host, str(d.type), d.model, d.health) for d in snapshot.devices
    ]
    outside = [f.name for f in inventory.facts() if not f.managed and f.state is api.BindingState.BOUND]
    assert outside == ["gpu2"]
    assert inventory.nodes() == snapshot.nodes

    await h.attachments.detach("gpu1", "c1", "node-0", wait=5)
    inventory.flush()
    after = inventory.snapshot()
    assert after is not snapshot and after.version > snapshot.version
    assert next(d for d in after.devices if d.name == "gpu1").state is api.BindingState.FREE
