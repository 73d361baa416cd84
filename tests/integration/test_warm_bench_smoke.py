"""``python -m bench --quick --only warm`` runs every part of the warm section — the cold, hit and
miss series, the node-pinned replays of the steady and bursty workloads, and the pods placed by
the stand-in scheduler — and writes their figures: the command and its JSON, not speed (the quick
run's holds are too short for the targets; nothing here is timed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_bench_smoke import run_quick

pytestmark = [pytest.mark.slow(seconds=90), pytest.mark.timeout(900)]


def test_quick_warm_section_replays_every_workload_and_the_pods(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run_quick("warm", out, timeout=840)
    section = json.loads(out.read_text())["sections"]["warm"]
    assert "error" not in section
    replays = section["figures"]["replay"]
    assert set(replays) == {"steady", "bursty", "pods_steady"}
    for key, by_mode in replays.items():
        figures = by_mode["auto"]
        assert "error" not in figures, (key, figures)
        assert figures["claims_measured"] == figures["attach_to_ready"]["n"] > 0
        assert 0.0 <= figures["hit_rate_percent"] <= 100.0
        assert figures["bound_device_seconds"] > 0 and figures["moves"] >= 0
    assert "node-pinned" in replays["steady"]["auto"]["workload"]
    assert "stand-in scheduler" in replays["pods_steady"]["auto"]["workload"]
    pods = replays["pods_steady"]["auto"]
    # attach-to-ready is a part of each pod's start, so no percentile of it can be above the start's
    for q in ("p50_ms", "p95_ms", "max_ms"):
        assert 0 < pods["attach_to_ready"][q] <= pods["pod_start"][q]
    assert {"created_to_claim", "kubelet_to_running"} <= set(pods["phases"])
    names = {row["name"] for row in section["checks"]}
    assert {
        "auto, steady, pods: attach-to-ready p50",
        "auto, steady, pods: attach-to-ready p95",
        "auto, steady, pods: hit rate",
        "auto, steady, pods: warm idle per claimed time",
    } <= names
