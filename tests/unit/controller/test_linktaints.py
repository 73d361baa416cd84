"""A device whose PCIe link keeps erring is tainted ``<driver>/link-errors`` (issue 38): the one
judgement the plugin makes too (``dra_driver.linkerrors``), with the controller's stricter
thresholds — one correctable error never, a rate sustained past the hold at once; a fatal or
non-fatal error at once; lifted after the hold-down — withheld where taints are dropped."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dra_driver.controller.devices import PublishPolicy, WithheldReason, to_dra_device
from dra_driver.controller.linktaints import LinkTaints
from dra_driver.controller.settings import ControllerSettings
from dra_driver.linkerrors import ErrorKind, ErrorThresholds, LinkErrors
from manager_api.devices import PCIeErrorCounts
from manager_api.models import Inventory
from tests.support.controller import make_device, make_inventory

DRIVER = "fabric-dra.io"
#: 2 correctable errors allowed a 2 s window, sustained for 3 s, lifted after 4 s quiet
THRESHOLDS = ErrorThresholds(
    correctable_per_minute=60, window_seconds=2, sustain_seconds=3, recover_seconds=4
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _inventory(version: int, **counts: int) -> Inventory:
    device = make_device("gpu-0", pcie_errors=PCIeErrorCounts(**counts))
    return make_inventory([device]).model_copy(update={"version": version})


def test_one_correctable_error_never_taints_a_sustained_rate_does_and_the_hold_down_lifts_it() -> None:
    clock = Clock()
    changes: list[int] = []
    links = LinkTaints(THRESHOLDS, clock=clock, on_change=lambda: changes.append(1))
    links.observe(_inventory(1, correctable=100))  # the first reading is history
    assert links.active() == {}
    clock.now += 1
    links.observe(_inventory(2, correctable=101))  # one error
    for _ in range(10):
        clock.now += 1
        links.judge()
    assert links.active() == {} and changes == []

    correctable = 101
    for step in range(12):  # 3 errors every half second: 12 in a 2 s window, far above the 2 allowed
        clock.now += 0.5
        correctable += 3
        links.observe(_inventory(3 + step, correctable=correctable))
        if clock.now - 1011.5 < 3:
            assert links.active() == {}, "not before the rate has held for the sustain time"
    assert links.active() == {("fabric-pcie", "gpu-0"): "PCIeCorrectable"} and len(changes) == 1

    clock.now += 3.9  # quiet, within the hold-down
    links.judge()
    assert links.active() != {}
    clock.now += 2.1 + 0.1
    links.judge()
    assert links.active() == {} and len(changes) == 2


def test_a_fatal_error_taints_at_once_and_outranks_correctable_ones() -> None:
    clock = Clock()
    links = LinkTaints(THRESHOLDS, clock=clock)
    links.observe(_inventory(1))
    clock.now += 1
    links.observe(_inventory(2, non_fatal=1))
    assert links.active() == {("fabric-pcie", "gpu-0"): "PCIeNonFatal"}
    clock.now += 1
    links.observe(_inventory(3, non_fatal=1, fatal=1))
    assert links.active() == {("fabric-pcie", "gpu-0"): "PCIeFatal"}
    clock.now += 10
    links.judge()
    assert links.active() == {}
    links.observe(make_inventory([]).model_copy(update={"version": 4}))  # the device is gone: forgotten
    assert links.active() == {}


def test_cleared_counters_start_again_and_are_no_fault() -> None:
    errors = LinkErrors.first(THRESHOLDS, PCIeErrorCounts(correctable=50, fatal=3), 0.0)
    errors.read(PCIeErrorCounts(), 1.0)
    assert errors.fault(1.0) is None
    errors.read(PCIeErrorCounts(fatal=1), 2.0)
    fault = errors.fault(2.0)
    assert fault is not None and fault.kind is ErrorKind.FATAL and "1 new uncorrectable (fatal)" in fault.why


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute", "None"])
def test_the_taint_carries_the_fault_and_the_chosen_effect(effect: str) -> None:
    policy = PublishPolicy(
        driver=DRIVER, device_taints=True, binding_conditions=False, link_taint_effect=effect
    )
    out = to_dra_device(make_device("gpu-0"), policy, link_fault="PCIeFatal")
    assert out.device is not None
    assert out.device["taints"] == [{"key": f"{DRIVER}/link-errors", "value": "PCIeFatal", "effect": effect}]


def test_withheld_where_taints_are_dropped_unless_the_effect_is_none() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=False, binding_conditions=False)
    assert to_dra_device(make_device("gpu-0"), policy, link_fault="PCIeCorrectable").withheld is (
        WithheldReason.LINK_ERRORS
    )
    shown = PublishPolicy(
        driver=DRIVER, device_taints=False, binding_conditions=False, link_taint_effect="None"
    )
    out = to_dra_device(make_device("gpu-0"), shown, link_fault="PCIeCorrectable")
    assert out.device is not None and "taints" not in out.device


def test_settings_refuse_thresholds_where_one_correctable_error_would_taint() -> None:
    base = {"manager_url": "http://m:8080"}
    assert ControllerSettings.model_validate(base).link_thresholds().allowed_in_window == 10
    with pytest.raises(ValidationError, match="one correctable error must never taint"):
        ControllerSettings.model_validate(
            {**base, "link_correctable_per_minute": 1, "link_window_seconds": 30}
        )
