"""The load test's own checks can fail: each is fed what a double binding, a stray binding or a
leak looks like. In-process, no servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from bench.churn import (
    Churn,
    ChurnConfig,
    ClaimRecord,
    Window,
    binding_violations,
    classify_error,
    host_tree_contents,
    topology_counts,
    waves,
)
from manager_api.models import Device, DeviceType


def _binding(target: str, host: str) -> dict[str, Any]:
    return {"Target": target, "Host": host}


def test_a_binding_inside_its_claims_window_is_explained() -> None:
    windows = {"gpu0": [Window("c1", "kind-worker", start=10.0, end=20.0)]}
    assert binding_violations([_binding("gpu0", "kind-worker")], windows, 12.0, 12.5) == []
    # the read began before the unprepare returned: still explained
    assert binding_violations([_binding("gpu0", "kind-worker")], windows, 19.9, 20.5) == []


def test_a_binding_outside_every_window_or_on_another_node_is_stray() -> None:
    windows = {"gpu0": [Window("c1", "kind-worker", start=10.0, end=20.0)]}
    late = binding_violations([_binding("gpu0", "kind-worker")], windows, 20.1, 20.2)
    assert [v.category for v in late] == ["stray-binding"]
    elsewhere = binding_violations([_binding("gpu0", "kind-worker2")], windows, 12.0, 12.1)
    assert [v.category for v in elsewhere] == ["stray-binding"]
    unknown = binding_violations([_binding("nvme0", "kind-worker")], windows, 12.0, 12.1)
    assert "nvme0 bound to kind-worker" in unknown[0].message


def test_a_target_on_two_hosts_is_a_double_binding() -> None:
    windows = {"gpu0": [Window("c1", "kind-worker", 0.0, None), Window("c2", "kind-worker2", 0.0, None)]}
    found = binding_violations(
        [_binding("gpu0", "kind-worker"), _binding("gpu0", "kind-worker2")], windows, 1, 2
    )
    assert [v.category for v in found] == ["double-binding"]
    twice = binding_violations([_binding("gpu0", "kind-worker")] * 2, windows, 1, 2)
    assert [v.category for v in twice] == ["double-binding"]


def _device(name: str) -> Device:
    return Device(
        name=name,
        pool="fabric-pcie",
        fabric="PCIe",
        type=DeviceType.GPU,
        binding_style="zone",
        redfish_uri="/x",
    )


def test_two_claims_holding_one_device_at_once_is_a_double_binding() -> None:
    gpu = _device("gpu0")
    churn = Churn(cast(Any, None), ChurnConfig(), [gpu])
    first = ClaimRecord("c1", "kind-worker", [gpu], "normal")
    second = ClaimRecord("c2", "kind-worker2", [gpu], "stale-allocation")
    churn._hold_start(first, 1.0)
    churn._hold_start(second, 2.0)
    assert [v.category for v in churn.violations] == ["double-binding"]
    # after the first let go, the second may have it
    churn.violations.clear()
    churn._hold_end(first)
    churn._hold_end(second)
    churn._hold_start(second, 3.0)
    assert churn.violations == []


def test_claim_outcomes() -> None:
    record = ClaimRecord("c1", "n", [], "normal")
    assert record.outcome == "broken"  # never unprepared
    record.unprepared = True
    assert record.outcome == "failed-clean"
    record.prepared_after = 0.1
    assert record.outcome == "completed"
    record.broken = True
    assert record.outcome == "broken"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("ResourceClaim churn/p1 not found; it was deleted before the kubelet prepared it", "claim deleted"),
        ("claim churn/p1: device gpu4 is in use (held by n/u): ...; the kubelet will retry", "device in use"),
        ("claim churn/p1: the fabric is still attaching gpu1; it goes on", "still working"),
        ("preparing claim churn/p1 failed: KeyError('x')", "unexpected"),
        ("unpreparing claim churn/p1 failed: RuntimeError('boom')", "unexpected"),
        ("claim preparation failed unexpectedly", "unexpected"),
    ],
)
def test_errors_are_classified(error: str, kind: str) -> None:
    assert classify_error(error) == kind


def test_host_tree_contents_sees_pci_and_cxl_entries(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    assert all(v == [] for v in host_tree_contents(sys_root).values())
    pci = sys_root / "bus/pci/devices/0000:41:00.0"
    pci.mkdir(parents=True)
    (pci / "serial").write_text("48B02D0000A1F000\n")
    cxl = sys_root / "bus/cxl/devices"
    (cxl / "mem0").mkdir(parents=True)
    (cxl / "mem0/serial").write_text("0xc0ffee000001\n")
    (cxl / "region0").mkdir()
    (cxl / "region0/target0").write_text("mem0\n")
    found = host_tree_contents(sys_root)
    assert found["pci"] == ["48b02d0000a1f000"]
    assert found["cxl-regions"] == ["c0ffee000001"]
    assert found["memdevs"] == ["mem0"]


def test_topology_counts_and_waves() -> None:
    counts = topology_counts(200)
    pcie = counts["gpus"] + counts["nvme"] + counts["nics"] + counts["fpgas"]
    assert pcie + counts["cxl-devices"] * counts["chunks"] == 200
    assert counts["cxl-devices"] == 4
    small = topology_counts(24)
    assert small["cxl-devices"] == 1 and small["gpus"] + small["nvme"] + small["nics"] + small["fpgas"] == 20
    assert waves(["a", "b", "c"], 0) == [["a", "b", "c"]]
    assert waves(["a", "b", "c"], 2) == [["a", "b"], ["c"]]


def test_the_live_check_leaves_out_entries_still_being_created(tmp_path: Path) -> None:
    """A region whose memdev serial cannot be read yet (being added or removed) is not a device
    in a host's tree for the double-binding check; the leak check at the end still sees it."""
    sys_root = tmp_path / "sys"
    (sys_root / "bus/cxl/devices/region0").mkdir(parents=True)
    (sys_root / "bus/pci/devices/0000:41:00.0").mkdir(parents=True)
    live = host_tree_contents(sys_root, identified_only=True)
    assert live["cxl-regions"] == [] and live["pci"] == []
    final = host_tree_contents(sys_root)
    assert final["cxl-regions"] == ["region0"] and final["pci"] == ["0000:41:00.0"]
