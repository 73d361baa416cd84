"""The plugin feed bench at a small size: both reads measured, every change seen by each (the
figures themselves belong in docs/performance.md, not here)."""

from __future__ import annotations

from bench.plugin_feed_bench import measure


def test_the_bench_measures_both_reads_over_every_change() -> None:
    figures = measure(devices=30, changes=3)
    assert figures["devices"] == 30 and figures["changes"] == 3
    for mode in ("full_read", "change_feed"):
        assert figures[mode]["cpu_ms_per_change_p50"] > 0
    assert figures["ratio_p50"] > 0
