"""Load with churn, the CI variant of ``python -m bench.churn`` (the same code): 60 claims over 6
emulated nodes and 24 devices (GPUs, NVMe, a NIC, an FPGA, CXL memory chunks), created and
deleted at random through the real processes — emulator, API test server, manager and one plugin
per node, driven by the kubelet-protocol client.

The hostile shares are higher than the benchmark's so that, with this seed, every kind of hostile
pod runs (the plans are drawn from the seed, so which pods are hostile is fixed; only timing varies).
"""

from __future__ import annotations

import pytest

from bench.churn import POD_KINDS, ChurnConfig, ChurnReport, PodPlan, run_churn

pytestmark = pytest.mark.slow(seconds=12)

CI = ChurnConfig(
    claims=60,
    nodes=6,
    devices=24,
    seed="ci",
    delete_before_prepare=0.06,
    delete_mid_prepare=0.06,
    stale_allocation=0.08,
    double_prepare=0.06,
    double_unprepare=0.06,
)


@pytest.fixture(scope="module")
def report() -> ChurnReport:
    return run_churn(CI)


def test_the_seed_plans_every_hostile_kind() -> None:
    nodes = [f"kind-worker{i}" for i in range(CI.nodes)]
    kinds = set()
    planned, index = 0, 0
    while planned < CI.claims:
        plan = PodPlan.draw(CI, index, nodes)
        kinds.add(plan.kind)
        planned, index = planned + len(plan.sizes), index + 1
    assert kinds == {"normal", *POD_KINDS}


def test_no_double_binding_and_no_stray_binding(report: ChurnReport) -> None:
    assert report.figures["binding_table_polls"] > 0 and report.figures["sysfs_polls"] > 0
    assert report.figures["double_bindings"] == 0, report.violations
    assert report.figures["stray_bindings"] == 0, report.violations
    assert report.violations == []


def test_nothing_leaks(report: ChurnReport) -> None:
    """Emulator, manager (devices, operations, ledger), host sysfs trees, CDI files, checkpoints
    and the API server are all empty after the run."""
    assert report.leaks == []


def test_every_claim_completed_or_failed_cleanly(report: ChurnReport) -> None:
    figures = report.figures
    assert report.broken == []
    assert figures["claims"] == CI.claims
    assert sum(figures["outcomes"].values()) == CI.claims
    assert set(figures["outcomes"]) <= {"completed", "failed-clean"}
    # claims deleted before the kubelet prepared them fail with the plugin's clear error
    assert figures["failed_clean_by_reason"].get("claim deleted", 0) >= 1
    assert figures["errors_seen_by_kind"].get("unexpected", 0) == 0
    assert figures["grpc_call_errors"] == {}
    assert figures["outcomes"]["completed"] >= CI.claims // 2


def test_every_pod_kind_ran_and_both_binding_styles_were_used(report: ChurnReport) -> None:
    assert set(report.figures["pod_kinds"]) == {"normal", *POD_KINDS}
    # zones (PCIe) and connections (CXL chunks); the single NIC and FPGA may go unpicked
    assert {"gpu", "nvme", "cxl-memory"} <= set(report.figures["attached_by_type"])
    assert report.figures["prepare_call"]["n"] >= CI.claims // 2
