"""A device whose attach keeps failing is taken out of allocation (issue 16, defect 2): counted
per device, N in a row or one that retrying cannot cure, for a doubling while; published with
an attach-failed NoSchedule taint where taints are kept, else withheld."""

from __future__ import annotations

from dra_driver.controller.devices import PublishPolicy, WithheldReason, to_dra_device
from dra_driver.controller.quarantine import ManagerCounts, Quarantine
from manager_api.feed import InventoryFeed
from manager_api.models import Inventory
from tests.support.controller import make_device, make_inventory

DRIVER = "fabric-dra.io"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_three_failures_in_a_row_take_a_device_out_for_a_doubling_while() -> None:
    clock = Clock()
    changes: list[int] = []
    q = Quarantine(threshold=3, initial=60.0, maximum=200.0, clock=clock, on_change=lambda: changes.append(1))
    assert q.attach_failed("p", "gpu-0", "BindFailed", "no") is None
    assert q.attach_failed("p", "gpu-0", "BindFailed", "no") is None
    assert q.active() == {} and changes == []
    out = q.attach_failed("p", "gpu-0", "BindFailed", "the fabric refused")
    assert out is not None and out.failures == 3 and out.until == clock.now + 60.0
    assert set(q.active()) == {("p", "gpu-0")} and len(changes) == 1
    assert q.attach_failed("p", "gpu-0", "BindFailed", "again") is None  # already out: not counted
    clock.now += 61.0
    assert q.active() == {}  # the while is over (without a loop, active() reads the clock)
    for _ in range(2):
        assert q.attach_failed("p", "gpu-0", "BindFailed", "no") is None
    second = q.attach_failed("p", "gpu-0", "BindFailed", "no")
    assert second is not None and second.until == clock.now + 120.0  # doubled
    clock.now += 121.0
    for _ in range(2):
        q.attach_failed("p", "gpu-0", "BindFailed", "no")
    third = q.attach_failed("p", "gpu-0", "BindFailed", "no")
    assert third is not None and third.until == clock.now + 200.0  # capped at the maximum


def test_a_permanent_failure_is_enough_and_a_busy_device_never_counts() -> None:
    q = Quarantine(threshold=3, clock=Clock())
    assert q.attach_failed("p", "gpu-1", "DeviceUnhealthy", "Critical") is not None
    for _ in range(10):
        assert q.attach_failed("p", "gpu-2", "DeviceBusy", "held by another claim") is None
    assert set(q.active()) == {("p", "gpu-1")}


def test_a_successful_attach_ends_the_quarantine_and_clears_the_count() -> None:
    q = Quarantine(threshold=2, clock=Clock())
    q.attach_failed("p", "gpu-0", "BindFailed", "no")
    q.attach_succeeded("p", "gpu-0")
    assert q.attach_failed("p", "gpu-0", "BindFailed", "no") is None  # the count started again
    assert q.attach_failed("p", "gpu-0", "BindFailed", "no") is not None
    q.attach_succeeded("p", "gpu-0")
    assert q.active() == {}


def test_a_quarantined_device_is_tainted_where_taints_are_kept_and_withheld_where_not() -> None:
    device = make_device("gpu-0")
    tainted = to_dra_device(
        device, PublishPolicy(DRIVER, device_taints=True, binding_conditions=True), "BindFailed"
    )
    assert tainted.device is not None
    assert tainted.device["taints"] == [
        {"key": f"{DRIVER}/attach-failed", "value": "BindFailed", "effect": "NoSchedule"}
    ]
    withheld = to_dra_device(
        device, PublishPolicy(DRIVER, device_taints=False, binding_conditions=True), "BindFailed"
    )
    assert withheld.device is None and withheld.withheld is WithheldReason.ATTACH_FAILED
    odd = to_dra_device(
        device, PublishPolicy(DRIVER, device_taints=True, binding_conditions=True), "not a label!"
    )
    assert odd.device is not None and odd.device["taints"][0]["value"] == "AttachFailed"


def test_the_plain_flow_quarantines_with_a_NoExecute_taint() -> None:
    """There the pod is bound to the failing device already: NoSchedule would not move it, the
    device-taint eviction controller acts on NoExecute."""
    policy = PublishPolicy(
        driver=DRIVER, device_taints=True, binding_conditions=False, evict_quarantined=True
    )
    device = to_dra_device(make_device("gpu-0"), policy, quarantined="BindFailed").device
    assert device is not None
    assert device["taints"] == [
        {"key": f"{DRIVER}/attach-failed", "value": "BindFailed", "effect": "NoExecute"}
    ]


def test_the_plain_flow_counts_the_managers_failures_from_the_inventory() -> None:
    clock = Clock()
    q = Quarantine(threshold=3, initial=60.0, clock=clock)
    counts = ManagerCounts(InventoryFeed(None), q)  # type: ignore[arg-type]  # observe() reads no feed

    def inventory(failures: int, error: str | None = "BindFailed") -> Inventory:
        device = make_device("gpu-0").model_copy(
            update={"attach_failures": failures, "attach_error": error if failures else None}
        )
        return make_inventory([device])

    pool = make_device("gpu-0").pool
    assert counts.observe(inventory(2)) == [] and q.active() == {}
    assert counts.observe(inventory(0)) == []  # an attach succeeded: the count starts again
    assert counts.observe(inventory(2)) == [] and q.active() == {}
    (out,) = counts.observe(inventory(3))
    assert (out.pool, out.device, out.reason, out.failures) == (pool, "gpu-0", "BindFailed", 3)
    assert set(q.active()) == {(pool, "gpu-0")}
    assert counts.observe(inventory(3)) == []  # the same inventory again counts nothing
