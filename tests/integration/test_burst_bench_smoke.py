"""``python -m bench --quick --only burst`` runs the burst section end to end at a small size (20
claims on 40 GPUs, 2 nodes: the warm-up, then the burst allocated and prepared through the plugins
as the kubelet calls them, the manager with its warm pool) and writes its figures and its SVG plot:
the command, its JSON and its figure, not speed (nothing here is timed)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.test_bench_smoke import run_quick

pytestmark = [pytest.mark.slow(seconds=60), pytest.mark.timeout(600)]


def test_quick_burst_section_readies_every_claim_and_draws_the_curve(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run_quick("burst", out, timeout=540)
    section = json.loads(out.read_text())["sections"]["burst"]
    assert "error" not in section, section.get("error")
    figures = section["figures"]
    assert figures["claims"] == 20 and figures["config"]["devices"] == 40
    assert figures["failed"] == 0, figures["failures"]
    assert figures["ready"] == figures["claim_to_ready"]["n"] == 20
    # every claim met the manager once: a warm hit, a move or a hot-add
    assert sum(figures["outcomes"].values()) == 20
    # the kubelet's prepare is a part of each claim's way to ready
    hops = figures["hops"]
    assert 0 < hops["prepare (kubelet)"]["max_ms"] <= figures["claim_to_ready"]["max_ms"]
    assert hops["allocation (API writes)"]["n"] == 20
    assert figures["first_arrival_to_last_ready_s"] > 0
    assert set(figures["cpu_seconds"]) >= {"manager", "emulator", "api_server", "plugins", "bench"}
    assert section["checks"][0]["name"] == "failed claims of the burst"
    # the plot beside the JSON: an SVG with the three curves and the target line
    plot = Path(figures["plot"])
    assert plot == tmp_path / "burst.svg"
    root = ET.fromstring(plot.read_text())
    assert len(root.findall("{http://www.w3.org/2000/svg}path")) == 3
    assert "target 15 s" in [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
