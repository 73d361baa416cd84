"""The table of device attributes (manager_api.devices) is the one declaration the API model, the
inventory and the ResourceSlice publisher are derived from."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller.devices import (
    ATTRIBUTE_NAMES,
    CAPACITY_NAMES,
    SLICE_ATTRIBUTES,
    PublishPolicy,
    to_dra_device,
)
from fabric.state.model import DeviceRecord, DiscoveredAttributes
from manager_api.devices import (
    BindingStyle,
    DeviceAttributes,
    DeviceIdentity,
    DeviceType,
    Health,
    PCIeErrorCounts,
)
from manager_api.models import Device
from tests.unit.fabric.fakes import make_harness

DRIVER = "fabric-dra.io"
#: a value for every field of the table of device attributes
SAMPLE: dict[str, Any] = {
    "type": DeviceType.NVME,
    "vendor": "Samsung",
    "vendor_id": "0x144d",
    "device_id": "0xa80a",
    "model": "PM1733",
    "serial": "S1",
    "uuid": "u-1",
    "memory_bytes": 2**30,
    "capacity_bytes": 2**40,
    "pcie_generation": 4,
    "pcie_width": 4,
    "switch": "Switch1",
    "port": "P1",
    "health": Health.WARNING,
    "pcie_errors": PCIeErrorCounts(correctable=3, fatal=1),
}


def test_the_api_device_is_identity_then_the_attribute_table_then_who_holds_it() -> None:
    names = list(Device.model_fields)
    head = [*DeviceIdentity.model_fields, *DeviceAttributes.model_fields]
    assert names[: len(head)] == head
    assert set(DiscoveredAttributes.model_fields) - set(DeviceAttributes.model_fields) == {
        "available",
        "identities",
        "reset_target",
        # a GPU's partition table: rendered as Device.partition_table, never a slice attribute
        "partition_table",
    }


def test_slice_attributes_come_in_the_documented_order() -> None:
    ranks = [attribute.rank for _, attribute in SLICE_ATTRIBUTES]
    assert ranks == list(range(len(ranks)))  # no rank twice, none skipped
    documented = Path(__file__).parents[2].joinpath("docs/architecture.md").read_text()
    listed = documented.split("**Device attributes**", 1)[1].split("capacity", 1)[0]
    positions = [listed.index(f"`{name}`") for name in ATTRIBUTE_NAMES]
    assert positions == sorted(positions)
    assert CAPACITY_NAMES == ("memory", "storage")


async def test_the_inventory_shows_every_attribute_discovery_found(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=1, devices=1)
    record = h.inventory.devices()[0]
    found = DiscoveredAttributes(**SAMPLE, identities=frozenset({"/redfish/v1/x"}))
    values = {f.name: getattr(record, f.name) for f in fields(DeviceRecord)}
    rendered = h.inventory.render_device(DeviceRecord(**{**values, "attributes": found}))
    for name in DeviceAttributes.model_fields:
        assert getattr(rendered, name) == getattr(found, name), name
    assert rendered.binding_style is BindingStyle.ZONE


@pytest.mark.parametrize("style", [*BindingStyle, ""])
def test_a_binding_style_is_a_plain_string_on_the_wire(style: str) -> None:
    device = Device(
        name="d", pool="p", fabric="f", type=DeviceType.GPU, binding_style=style, redfish_uri="/r"
    )
    assert f'"bindingStyle":"{style}"' in device.model_dump_json(by_alias=True)
    assert Device.model_validate_json(device.model_dump_json(by_alias=True)).binding_style == style


def test_an_unknown_binding_style_is_refused() -> None:
    with pytest.raises(ValueError, match="BindingStyle"):
        Device(
            name="d", pool="p", fabric="f", type=DeviceType.GPU, binding_style="teleport", redfish_uri="/r"
        )


def test_the_sample_names_every_attribute() -> None:
    assert set(SAMPLE) == set(DeviceAttributes.model_fields)


def test_every_marked_field_is_published() -> None:
    device = Device(
        name="d", pool="fabric-pcie", fabric="PCIe", **SAMPLE, binding_style="zone", redfish_uri="/r"
    )
    published = to_dra_device(device, PublishPolicy(DRIVER, device_taints=True, binding_conditions=False))
    assert published.device is not None
    assert list(published.device["attributes"]) == [f"{DRIVER}/{name}" for name in ATTRIBUTE_NAMES]
    assert list(published.device["capacity"]) == [f"{DRIVER}/{name}" for name in CAPACITY_NAMES]
