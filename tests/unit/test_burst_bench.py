"""The burst bench's arrival schedule (seeded, within the burst, Poisson given its count) and its
hand-written SVG step plot (well-formed, each curve a step path, the target line where it belongs)."""

from __future__ import annotations

import itertools
import json
import statistics
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.burst_bench import BurstConfig, _reason, burst_arrivals, replot
from bench.stepplot import Marker, Series, cumulative, nice_ticks, step_svg

_SVG = "{http://www.w3.org/2000/svg}"


def test_poisson_arrivals_are_seeded_sorted_and_within_the_burst() -> None:
    first = burst_arrivals(1000, 5.0, "poisson", 37)
    assert first == burst_arrivals(1000, 5.0, "poisson", 37), "the same seed gives the same schedule"
    assert first != burst_arrivals(1000, 5.0, "poisson", 38)
    assert len(first) == 1000 and first == sorted(first)
    assert all(0.0 <= t < 5.0 for t in first)
    # A Poisson process given its count: uniform over the interval, about 200 a second each second.
    per_second = [sum(1 for t in first if s <= t < s + 1) for s in range(5)]
    assert all(150 < n < 250 for n in per_second), per_second
    gaps = [b - a for a, b in itertools.pairwise(first)]
    # exponential-like gaps: mean 5 ms, standard deviation about the mean (evenly spaced would be 0)
    assert statistics.fmean(gaps) == pytest.approx(0.005, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.005, rel=0.15)


def test_even_arrivals_are_evenly_spaced_and_an_unknown_shape_is_refused() -> None:
    assert burst_arrivals(4, 2.0, "even", 1) == [0.0, 0.5, 1.0, 1.5]
    with pytest.raises(ValueError, match="not one of poisson, even"):
        burst_arrivals(4, 2.0, "bursty", 1)


def test_cumulative_counts_events_in_time_order() -> None:
    assert cumulative([2.0, 0.5, 1.0]) == [(0.5, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert cumulative([]) == []


def test_nice_ticks_cover_the_range_in_round_steps() -> None:
    assert nice_ticks(15.0) == [0.0, 5.0, 10.0, 15.0]
    assert nice_ticks(1000.0) == [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]
    assert nice_ticks(17.3)[-1] >= 17.3
    assert nice_ticks(0.0) == [0.0, 1.0]


def _plot() -> str:
    return step_svg(
        [
            Series("arrived", cumulative([0.0, 1.0, 2.0, 3.0]), "#777777", dashed=True),
            Series("ready <fast> & done", cumulative([4.0, 6.0, 9.0, 12.0]), "#2471a3"),
        ],
        title="4 claims",
        x_label="seconds since the first arrival",
        y_label="claims",
        markers=[Marker(15.0, "target 15 s")],
    )


def test_step_svg_is_well_formed_with_a_step_path_per_series_and_the_target_line() -> None:
    svg = _plot()
    assert svg == _plot(), "deterministic: the committed copy changes only with the figures"
    root = ET.fromstring(svg)
    assert root.tag == f"{_SVG}svg"
    paths = root.findall(f"{_SVG}path")
    assert len(paths) == 2
    ready = paths[1].attrib["d"]
    # the path climbs in steps: one horizontal and one vertical move per claim, then flat to the edge
    assert ready.startswith("M") and ready.count("V") == 4 and ready.count("H") == 5
    assert paths[0].attrib["stroke-dasharray"] and "stroke-dasharray" not in paths[1].attrib
    texts = [t.text for t in root.iter(f"{_SVG}text")]
    assert "target 15 s" in texts and "ready <fast> & done" in texts  # escaped in, read back whole
    # x axis 0..15 over the plot's 672 px from x=64: the target line sits at the right edge; the
    # legend (two lines) is under the plot, whose height is what is left of 440 px
    target = [line for line in root.findall(f"{_SVG}line") if line.attrib.get("stroke-dasharray") == "6 4"]
    assert [line.attrib["x1"] for line in target] == ["736"]
    assert [line.attrib["y2"] for line in target] == [str(440 - (56 + 2 * 18))]
    # the ready curve's last step (12 s) lies left of the target, four-fifths along
    last_h = ready.rsplit("H", 2)[1].split("V")[0]
    assert float(last_h) == pytest.approx(64 + 672 * 12 / 15)


def test_a_run_is_drawn_again_from_its_json(tmp_path: Path) -> None:
    config = asdict(BurstConfig(claims=3, seconds=1.0, nodes=2, devices=4))
    figures = {
        "config": config,
        "curves": {
            "arrived": [0.0, 0.4, 0.9],
            "ready": [3.1, 3.5, 4.2],
            "in_flight": [[0.2, 1], [0.6, 3], [4.0, 0]],
        },
    }
    path = replot(json.loads(json.dumps(figures)), tmp_path / "burst.svg")
    root = ET.fromstring(path.read_text())
    texts = [t.text for t in root.iter(f"{_SVG}text")]
    assert "3 claims in 1 s over 2 nodes, 4 GPUs (realistic), warm pool auto, claims path" in texts
    assert "claims ready (NodePrepareResources answered)" in texts
    assert len(root.findall(f"{_SVG}path")) == 3


def test_failures_are_counted_by_kind_not_by_claim() -> None:
    one = "claim default/burst-284: the fabric is still attaching gpu16 to node kind-worker5 for 41s"
    two = "claim default/burst-9: the fabric is still attaching gpu1100 to node kind-worker10 for 7s"
    assert _reason(one) == _reason(two) == "the fabric is still attaching <name> to <name> for Ns"
    assert _reason("unschedulable: no free GPU within the deadline").startswith("unschedulable")
    stale = 'claim default/burst-1: Zone.AddEndpoint failed: ZoneETag W/"1ea" is not the zone\'s ETag "2b"'
    assert _reason(stale) == 'Zone.AddEndpoint failed: ZoneETag "…" is not the zone\'s ETag "…"'
