"""Explanations: every device gets the reason that decided about it."""

from __future__ import annotations

import time
from typing import Any

from dra_driver.selection.allocated import AllocatedState, Share
from dra_driver.selection.allocator import Allocator, ClaimToAllocate
from dra_driver.selection.model import ResourceSlice
from dra_driver.selection.quantity import parse_quantity
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


# -- shared counters and consumable capacity -------------------------------------------------

MIG_CLASS = {"fabric-gpu": device_class("fabric-gpu", 'device.driver == "fabric-dra.io"')}


GPU3_COUNTERS = {"memory": {"value": "80Gi"}, **{f"memory-slice-{i}": {"value": "1"} for i in range(8)}}


def _placement(name: str, first: int, size: int, memory: str) -> dict[str, Any]:
    consumed = {
        "memory": {"value": memory},
        **{f"memory-slice-{i}": {"value": "1"} for i in range(first, first + size)},
    }
    return {"name": name, "consumesCounters": [{"counterSet": "gpu-3", "counters": consumed}]}


def _counter_slices(*extra: dict[str, Any]) -> list[ResourceSlice]:
    """gpu-3 as NVIDIA models a GPU: one counter set in its own slice, a device per profile
    placement consuming its memory slices."""
    counters = ResourceSlice.model_validate(
        {
            "metadata": {"name": "gpu-3-counters"},
            "spec": {
                "driver": "fabric-dra.io",
                "pool": {"name": "node-a-gpus", "generation": 1, "resourceSliceCount": 2},
                "nodeName": "node-a",
                "sharedCounters": [{"name": "gpu-3", "counters": GPU3_COUNTERS}],
            },
        }
    )
    devices = [
        _placement("gpu-3-mig-1g10gb-19-2", 2, 1, "10Gi"),
        _placement("gpu-3-mig-2g20gb-14-2", 2, 2, "20Gi"),
        _placement("gpu-3-mig-3g40gb-9-4", 4, 4, "40Gi"),
        *extra,
    ]
    return [
        counters,
        pool_slice(devices, name="gpu-3-devices", pool="node-a-gpus", count=2, nodeName="node-a"),
    ]


def _verdicts(report: Any) -> dict[str, tuple[str, str]]:
    (request,) = report.requests
    return {v.device: (v.reason, v.detail) for v in request.rejected}


def test_counter_exhaustion_names_the_counter_and_the_claim_holding_it() -> None:
    held = AllocatedState(
        devices={("fabric-dra.io", "node-a-gpus", "gpu-3-mig-1g10gb-19-2"): "team-a/trainer"}
    )
    claim = ClaimToAllocate("default", "c", claim_spec([gpus(1)]))
    allocator = Allocator(_counter_slices(), MIG_CLASS, held)
    report = explain_node(allocator, [claim], node("node-a"))
    verdicts = _verdicts(report)
    assert verdicts["node-a-gpus/gpu-3-mig-1g10gb-19-2"] == ("allocated", "allocated to claim team-a/trainer")
    assert verdicts["node-a-gpus/gpu-3-mig-2g20gb-14-2"] == (
        "counters",
        "gpu-3: memory-slice-2 in use by claim team-a/trainer",
    )
    assert report.satisfiable and report.requests[0].chosen == ["node-a-gpus/gpu-3-mig-3g40gb-9-4"]


def test_counter_partly_in_use_says_how_much() -> None:
    held = AllocatedState(
        devices={
            ("fabric-dra.io", "node-a-gpus", "gpu-3-mig-3g40gb-9-4"): "team-a/trainer",
            ("fabric-dra.io", "node-a-gpus", "gpu-3-mig-1g10gb-19-2"): "team-b/notebook",
        }
    )
    big = '"size" in device.attributes["fabric-dra.io"]'
    whole = {
        "name": "gpu-3-whole",
        "attributes": {"size": {"string": "whole"}},
        "consumesCounters": [{"counterSet": "gpu-3", "counters": {"memory": {"value": "40Gi"}}}],
    }
    slices = _counter_slices(whole)
    claim = ClaimToAllocate("default", "c", claim_spec([gpus(1, selectors=[big])]))
    report = explain_node(Allocator(slices, MIG_CLASS, held), [claim], node("node-a"))
    assert _verdicts(report)["node-a-gpus/gpu-3-whole"] == (
        "counters",
        # holders in slice order
        "gpu-3: memory 50 GiB of 80 GiB in use by claims team-b/notebook, team-a/trainer; 40 GiB needed",
    )
    assert not report.satisfiable and report.summary == "request gpus needs 1 device(s), 0 fit"


def _cxl_pool(step: str | None = None) -> list[ResourceSlice]:
    policy: dict[str, Any] = {"default": "64Gi", "validRange": {"min": "32Gi", "max": "256Gi"}}
    if step:
        policy["validRange"]["step"] = step
    device = {
        "name": "cxl-pool-1",
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "256Gi", "requestPolicy": policy}},
    }
    return [pool_slice([device], name="cxl", pool="cxl", allNodes=True)]


def _shares(**by_claim: str) -> AllocatedState:
    device = ("fabric-dra.io", "cxl", "cxl-pool-1")
    return AllocatedState(
        shares={
            device: [
                Share(
                    claim.replace("__", "/"),
                    f"0000000{i}-0000-4000-8000-000000000000",
                    {"memory": parse_quantity(q)},
                )
                for i, (claim, q) in enumerate(by_claim.items())
            ]
        }
    )


def _memory_claim(amount: str) -> ClaimToAllocate:
    request = {
        "name": "mem",
        "exactly": {"deviceClassName": "fabric-gpu", "capacity": {"requests": {"memory": amount}}},
    }
    return ClaimToAllocate("default", "c", claim_spec([request]))


def test_capacity_misfit_says_what_is_in_use_what_is_asked_and_by_whom() -> None:
    allocator = Allocator(_cxl_pool(), MIG_CLASS, _shares(team_a__db="64Gi", team_b__cache="116Gi"))
    report = explain_node(allocator, [_memory_claim("96Gi")], node())
    assert not report.satisfiable
    assert _verdicts(report)["cxl/cxl-pool-1"] == (
        "capacity",
        "cxl-pool-1: 180 GiB of 256 GiB in use; 96 GiB asked "
        "(held by claims team_a/db 64 GiB, team_b/cache 116 GiB)",
    )
    # the same request fits while less is in use, and gets its share
    report = explain_node(
        Allocator(_cxl_pool(), MIG_CLASS, _shares(team_a__db="64Gi")), [_memory_claim("96Gi")], node()
    )
    assert report.satisfiable
    (entry,) = report.allocations[0]["allocation"]["devices"]["results"]
    assert entry["consumedCapacity"] == {"memory": "96Gi"} and len(entry["shareID"]) == 36


def test_capacity_misfit_shows_the_requestpolicy_rounding_and_its_limits() -> None:
    allocator = Allocator(_cxl_pool(step="32Gi"), MIG_CLASS, _shares(team_a__db="192Gi"))
    report = explain_node(allocator, [_memory_claim("90Gi")], node())
    assert _verdicts(report)["cxl/cxl-pool-1"] == (
        "capacity",
        "cxl-pool-1: 192 GiB of 256 GiB in use; 96 GiB asked "
        "(90 GiB requested, rounded up by the requestPolicy) (held by claim team_a/db 192 GiB)",
    )
    report = explain_node(Allocator(_cxl_pool(), MIG_CLASS), [_memory_claim("300Gi")], node())
    assert _verdicts(report)["cxl/cxl-pool-1"] == (
        "capacity",
        "cxl-pool-1: 300 GiB asked, outside the requestPolicy (min 32 GiB, max 256 GiB)",
    )
