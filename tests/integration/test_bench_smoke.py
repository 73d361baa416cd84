"""``python -m bench --quick`` runs and writes its figures: the command and its JSON, not speed
(figures come from the benchmark itself; nothing here is timed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow(seconds=20)


def run_quick(section: str, out: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench --quick --fork-roles --only <section> --json <out>``, checked to exit 0."""
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--fork-roles", "--only", section, "--json", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_quick_publish_section_writes_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = run_quick("publish", out, timeout=240)
    assert "figure" in result.stdout and "publish" in result.stdout  # the table

    document = json.loads(out.read_text())
    assert document["quick"] is True
    assert {"nproc", "cpu", "ram_gib", "python"} <= set(document["machine"])
    assert list(document["sections"]) == ["publish"]
    section = document["sections"]["publish"]
    assert "error" not in section
    figures = section["figures"]["128"]
    assert figures["published_devices"] == 128 and figures["pools_consistent"] is True
    assert isinstance(figures["publish_seconds"], float) and isinstance(figures["resync_writes"], int)
    assert section["checks"], "every section reports its targets"
    for row in section["checks"]:
        assert set(row) == {"name", "target", "measured", "unit", "pass"}
        assert isinstance(row["pass"], bool)
