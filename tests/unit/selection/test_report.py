"""Explanations: every device gets the reason that decided about it."""

from __future__ import annotations

import time

from dra_driver.selection.allocator import Allocator, ClaimToAllocate
from dra_driver.selection.report import explain_node
from tests.unit.selection.fixtures import claim_spec, device_class, gpu, gpus, node, nvme, pool_slice

CLASSES = {"fabric-gpu": device_class()}


def test_three_gpus_on_two_gpu_switches_names_the_groups() -> None:
    slices = [
        pool_slice([gpu("gpu-0", "sw1"), gpu("gpu-1", "sw1"), gpu("gpu-2", "sw2"), gpu("gpu-3", "sw2")])
    ]
    claim = ClaimToAllocate(
        "default", "three", claim_spec([gpus(3)], [{"matchAttribute": "fabric-dra.io/switch"}])
    )
    report = explain_node(Allocator(slices, CLASSES), [claim], node())
    assert not report.satisfiable
    assert report.summary == (
        "needs 3 devices with equal fabric-dra.io/switch (requests: gpus); switch sw1 has 2, switch sw2 has 2"
    )
    (request,) = report.requests
    assert request.fitting == []
    assert {v.reason for v in request.rejected} == {"constraint"}
    assert "only 2 fitting device(s) share the value sw1, 3 needed" in request.rejected[0].detail


def test_each_rejection_reason_is_reported() -> None:
    devices = [
        gpu("fits", "sw1"),
        nvme("disk"),
        gpu("taken", "sw1"),
        gpu("tainted", "sw1", taints=[{"key": "fabric-dra.io/unhealthy", "effect": "NoSchedule"}]),
        {"name": "noattr", "attributes": {"type": {"string": "gpu"}}},
    ]
    other_node = pool_slice([gpu("elsewhere", "sw9")], name="node-b-local", pool="node-b", nodeName="node-b")
    allocated = {("fabric-dra.io", "fabric-pcie", "taken"): "default/holder"}
    selector = 'device.attributes["fabric-dra.io"].model == "H100"'
    claim = ClaimToAllocate("default", "c", claim_spec([gpus(1, selectors=[selector])]))
    report = explain_node(
        Allocator([pool_slice(devices), other_node], CLASSES, allocated), [claim], node("node-a")
    )
    (request,) = report.requests
    reasons = {v.device: (v.reason, v.detail) for v in request.rejected}
    assert request.fitting == ["fabric-pcie/fits"]
    assert (
        reasons["fabric-pcie/disk"][0] == "selector"
        and "class fabric-gpu selector #0" in reasons["fabric-pcie/disk"][1]
    )
    assert reasons["fabric-pcie/taken"] == ("allocated", "allocated to claim default/holder")
    assert reasons["fabric-pcie/tainted"][0] == "taint"
    assert (
        reasons["fabric-pcie/noattr"][0] == "selector-error"
        and "no such key: model" in reasons["fabric-pcie/noattr"][1]
    )
    assert reasons["node-b/elsewhere"] == ("unreachable", "slice node-b-local serves node node-b only")
    # the error device comes after the first fit in search order, so allocation still succeeds
    assert report.satisfiable and request.chosen == ["fabric-pcie/fits"]


def test_cel_error_first_in_order_stops_allocation_and_says_so() -> None:
    devices = [{"name": "noattr", "attributes": {"type": {"string": "gpu"}}}, gpu("fits", "sw1")]
    claim = ClaimToAllocate(
        "default",
        "c",
        claim_spec([gpus(1, selectors=['device.attributes["fabric-dra.io"].model == "H100"'])]),
    )
    report = explain_node(Allocator([pool_slice(devices)], CLASSES), [claim], node())
    assert not report.satisfiable
    assert (
        report.error is not None
        and "fabric-pcie/noattr: CEL runtime error: no such key: model" in report.error
    )
    assert report.summary.startswith("allocation stopped:")


def test_shortfall_is_counted() -> None:
    claim = ClaimToAllocate("default", "c", claim_spec([gpus(5)]))
    report = explain_node(
        Allocator([pool_slice([gpu("a", "sw1"), gpu("b", "sw1")])], CLASSES), [claim], node()
    )
    assert report.summary == "request gpus needs 5 device(s), 2 fit"


def test_a_thousand_devices_are_explained_in_a_fraction_of_the_time_budget() -> None:
    devices = [gpu(f"gpu-{i}", f"sw{i // 4}") for i in range(1000)]
    slices = [pool_slice(devices[i : i + 128], name=f"s{i:04d}", count=8) for i in range(0, 1000, 128)]
    claim = ClaimToAllocate(
        "default",
        "c",
        claim_spec(
            [gpus(5, selectors=['device.capacity["fabric-dra.io"].memory.isGreaterThan(quantity("1Gi"))'])],
            [{"matchAttribute": "fabric-dra.io/switch"}],
        ),
    )
    started = time.perf_counter()
    report = explain_node(Allocator(slices, CLASSES), [claim], node())
    elapsed = time.perf_counter() - started
    assert not report.satisfiable
    assert "switch sw0 has 4" in report.summary
    assert len(report.requests[0].rejected) == 1000
    print(f"explained 1000 devices in {elapsed:.3f}s")
