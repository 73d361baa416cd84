"""``python -m bench --quick --only sharing`` runs every part of the sharing section against the real
manager — partitions on one GPU, random whole/partition claims, memory shares, random shares, the
crash-point sweep — and writes their figures: the command and its JSON, and the counts that must
be 0 whatever the machine (over-commit, GPUs on two nodes, leaks, orphan chunks). Nothing here is
timed: the latency rows are figures, not assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_bench_smoke import run_quick

pytestmark = [pytest.mark.slow(seconds=70), pytest.mark.timeout(600)]

#: rows that count what must never happen: 0 on any machine
_NEVER = (
    "counter over-commit, random whole/partition claims",
    "GPUs bound to two nodes, random whole/partition claims",
    "leaks after release, random whole/partition claims",
    "memory over-commit, random shares",
    "leaks after release, random shares",
    "orphan chunks after the crash-point sweep",
)


def test_quick_sharing_section_measures_every_part_against_the_real_manager(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run_quick("sharing", out, timeout=540)
    section = json.loads(out.read_text())["sections"]["sharing"]
    assert "error" not in section
    figures = section["figures"]
    assert figures["manager"] == "real"
    assert figures["not_measured"] == {}, figures["not_measured"]
    instant = figures["instant"]
    assert instant["partitions"]["held_at_once_min"] == 7
    assert instant["random_partitions"]["claims"] == instant["random_partitions"]["attach"]["n"] == 100
    assert instant["random_partitions"]["stale_sent"] == instant["random_partitions"]["stale_refused"] > 0
    assert instant["random_shares"]["stale_sent"] == instant["random_shares"]["stale_refused"] > 0
    assert figures["realistic"]["shares"]["attach"]["n"] > 0
    assert figures["crash_sweep"] and any(case["crashed"] for case in figures["crash_sweep"].values())
    rows = {row["name"]: row for row in section["checks"]}
    for name in _NEVER:
        assert rows[name]["measured"] == 0, rows[name]
