from __future__ import annotations

from datetime import UTC, datetime

from dra_driver.controller.devices import PublishPolicy, WithheldReason, to_dra_device
from manager_api.models import BindingState, DeviceDrain, DeviceType, DrainEffect, Health
from tests.support.controller import make_device

DRIVER = "fabric-dra.io"
PLAIN = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)


def test_a_gpu_carries_every_attribute_and_its_memory() -> None:
    conv = to_dra_device(make_device("gpu-0", switch="Switch1", port="P3"), PLAIN)
    assert conv.withheld is None and conv.device is not None
    attrs = conv.device["attributes"]
    assert attrs[f"{DRIVER}/type"] == {"string": "gpu"}
    assert attrs[f"{DRIVER}/vendor"] == {"string": "NVIDIA"}
    assert attrs[f"{DRIVER}/vendorID"] == {"string": "0x10de"}
    assert attrs[f"{DRIVER}/deviceID"] == {"string": "0x2330"}
    assert attrs[f"{DRIVER}/model"] == {"string": "H100 80GB HBM3"}
    assert attrs[f"{DRIVER}/serial"] == {"string": "SN-GPU-0"}
    assert attrs[f"{DRIVER}/fabric"] == {"string": "PCIe"}
    assert attrs[f"{DRIVER}/switch"] == {"string": "fabric-pcie/Switch1"}
    assert attrs[f"{DRIVER}/port"] == {"string": "P3"}
    assert attrs[f"{DRIVER}/pcieGen"] == {"int": 5}
    assert attrs[f"{DRIVER}/pcieWidth"] == {"int": 16}
    assert attrs[f"{DRIVER}/health"] == {"string": "OK"}
    assert f"{DRIVER}/uuid" not in attrs  # absent values are left out, not published empty
    assert conv.device["capacity"] == {f"{DRIVER}/memory": {"value": "80Gi"}}
    assert "taints" not in conv.device and "bindsToNode" not in conv.device


def test_switch_is_qualified_by_pool_so_two_fabrics_never_align() -> None:
    a = to_dra_device(make_device("a", pool="fabric-pcie", switch="Switch1"), PLAIN).device
    b = to_dra_device(make_device("b", pool="rack2-pcie", switch="Switch1"), PLAIN).device
    assert a is not None and b is not None
    assert a["attributes"][f"{DRIVER}/switch"] != b["attributes"][f"{DRIVER}/switch"]


def test_pci_ids_are_normalised() -> None:
    dev = to_dra_device(make_device("n", vendor_id="10DE", device_id="0X2330"), PLAIN).device
    assert dev is not None
    assert dev["attributes"][f"{DRIVER}/vendorID"] == {"string": "0x10de"}
    assert dev["attributes"][f"{DRIVER}/deviceID"] == {"string": "0x2330"}


def test_values_too_long_for_the_api_are_cut_not_sent() -> None:
    dev = to_dra_device(make_device("g", model="M" * 200, serial="S" * 65), PLAIN).device
    assert dev is not None
    assert len(dev["attributes"][f"{DRIVER}/model"]["string"].encode()) <= 64
    assert len(dev["attributes"][f"{DRIVER}/serial"]["string"].encode()) <= 64


def test_cxl_memory_chunk_has_capacity_and_no_pcie_link() -> None:
    dev = to_dra_device(make_device("cxl-0", type=DeviceType.CXL_MEMORY, pool="fabric-cxl"), PLAIN).device
    assert dev is not None
    assert dev["attributes"][f"{DRIVER}/type"] == {"string": "cxl-memory"}
    assert f"{DRIVER}/pcieGen" not in dev["attributes"]
    assert dev["capacity"][f"{DRIVER}/memory"] == {"value": "64Gi"}


def test_unhealthy_devices_are_tainted_where_taints_work() -> None:
    for health in (Health.WARNING, Health.CRITICAL):
        dev = to_dra_device(make_device("g", health=health), PLAIN).device
        assert dev is not None
        assert dev["taints"] == [
            {"key": f"{DRIVER}/unhealthy", "value": health.value, "effect": "NoSchedule"}
        ]
        assert dev["attributes"][f"{DRIVER}/health"] == {"string": health.value}


def test_unhealthy_devices_are_withheld_without_taints() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=False, binding_conditions=False)
    conv = to_dra_device(make_device("g", health=Health.CRITICAL), policy)
    assert conv.device is None and conv.withheld is WithheldReason.UNHEALTHY
    assert to_dra_device(make_device("h"), policy).device is not None


def test_a_drained_device_carries_the_drain_taint_or_is_withheld_without_taints() -> None:
    drain = DeviceDrain(
        reason="psu-swap",
        effect=DrainEffect.NO_EXECUTE,
        since=datetime(2026, 12, 1, tzinfo=UTC),
        drains=["switch/s1"],
    )
    dev = to_dra_device(make_device("g", health=Health.WARNING, drain=drain), PLAIN).device
    assert dev is not None
    assert dev["taints"] == [
        {"key": f"{DRIVER}/unhealthy", "value": "Warning", "effect": "NoSchedule"},
        {"key": f"{DRIVER}/drain", "value": "psu-swap", "effect": "NoExecute"},
    ]
    policy = PublishPolicy(driver=DRIVER, device_taints=False, binding_conditions=False)
    conv = to_dra_device(make_device("g", drain=drain), policy)
    assert conv.device is None and conv.withheld is WithheldReason.DRAINED


def test_unmanaged_unavailable_and_badly_named_devices_are_withheld() -> None:
    assert to_dra_device(make_device("u", managed=False), PLAIN).withheld is WithheldReason.UNMANAGED
    gone = to_dra_device(make_device("x", state=BindingState.UNAVAILABLE), PLAIN)
    assert gone.withheld is WithheldReason.UNAVAILABLE
    assert to_dra_device(make_device("Bad_Name"), PLAIN).withheld is WithheldReason.INVALID_NAME


def test_bound_devices_stay_published() -> None:
    bound = make_device("g", state=BindingState.BOUND, node="node-a", claim_uid="uid-1")
    assert to_dra_device(bound, PLAIN).device is not None


def test_binding_condition_mode_adds_bindsToNode_and_conditions() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True)
    dev = to_dra_device(make_device("g"), policy).device
    assert dev is not None
    assert dev["bindsToNode"] is True
    assert dev["bindingConditions"] == [f"{DRIVER}/Attached"]
    assert dev["bindingFailureConditions"] == [f"{DRIVER}/AttachFailed"]


def test_another_driver_name_qualifies_everything() -> None:
    policy = PublishPolicy(driver="gpu.example.com", device_taints=True, binding_conditions=True)
    dev = to_dra_device(make_device("g", health=Health.CRITICAL), policy).device
    assert dev is not None
    assert all(k.startswith("gpu.example.com/") for k in dev["attributes"])
    assert dev["taints"][0]["key"] == "gpu.example.com/unhealthy"
    assert dev["bindingConditions"] == ["gpu.example.com/Attached"]
