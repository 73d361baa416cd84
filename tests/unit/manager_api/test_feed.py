"""The inventory a feed keeps from change answers: what changed replaced in place, the rest the
very objects they were, and an answer older than what is kept (two reads crossing) left out."""

from __future__ import annotations

from fabric_dra_testbed.standins import make_device, make_inventory
from manager_api.feed import InventoryModel
from manager_api.models import Device, Health, Inventory, InventoryChanges


def _inventory() -> Inventory:
    inventory = make_inventory([make_device(f"gpu{i}") for i in range(5)], version=7)
    return inventory.model_copy(update={"epoch": 3})


def _changes(
    inventory: Inventory, version: int, devices: list[Device], removed: tuple[str, ...] = ()
) -> InventoryChanges:
    return InventoryChanges(
        epoch=3,
        since=inventory.version,
        version=version,
        devices=devices,
        removed=list(removed),
        pools=inventory.pools,
        nodes=inventory.nodes,
    )


def test_a_change_replaces_its_device_and_keeps_the_others_identical() -> None:
    first = _inventory()
    model = InventoryModel(first)
    before = list(model.inventory.devices)
    critical = first.devices[2].model_copy(update={"health": Health.CRITICAL})
    after = model.apply(_changes(first, 8, [critical]))
    assert after is not None and after.version == 8
    assert [d.name for d in after.devices] == [d.name for d in before]
    assert after.devices[2] is critical
    assert all(a is b for i, (a, b) in enumerate(zip(after.devices, before, strict=True)) if i != 2)
    assert model.devices()["gpu2"] is critical
    # the inventory handed out before is left as it was
    assert first.devices[2].health is Health.OK and before[2].health is Health.OK


def test_added_and_removed_devices_keep_the_name_order() -> None:
    first = _inventory()
    model = InventoryModel(first)
    after = model.apply(_changes(first, 8, [make_device("gpu10")], removed=("gpu1",)))
    assert after is not None
    assert [d.name for d in after.devices] == ["gpu0", "gpu10", "gpu2", "gpu3", "gpu4"]
    changed = after.devices[3].model_copy(update={"health": Health.WARNING})
    again = model.apply(_changes(after, 9, [changed]))
    assert again is not None and again.devices[3] is changed and again.devices[1] is after.devices[1]


def test_an_answer_older_than_what_is_kept_or_of_another_epoch_is_left_out() -> None:
    first = _inventory()
    model = InventoryModel(first)
    newer = first.devices[0].model_copy(update={"health": Health.CRITICAL})
    assert model.apply(_changes(first, 9, [newer])) is not None
    stale = first.devices[0].model_copy(update={"health": Health.WARNING})
    assert model.apply(_changes(first, 8, [stale])) is None
    other_epoch = _changes(first, 10, [stale]).model_copy(update={"epoch": 4})
    assert model.apply(other_epoch) is None
    assert model.inventory.version == 9 and model.devices()["gpu0"] is newer
