"""The CPU probe each bench section is measured between: a section's figures are read with the
speed the machine ran Python at, before and after it (the same code's CPU per claim doubled
within half an hour on a shared 2-core VM)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from bench import __main__ as bench_main


def test_a_section_runs_between_two_probes_and_the_table_says_them(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([41.5, 83.0])
    monkeypatch.setattr(bench_main, "cpu_probe_ms", lambda: next(readings))

    class Section:
        @staticmethod
        def run(_ctx: Any) -> dict[str, Any]:
            return {"checks": [{"name": "x", "target": "<= 1", "measured": 0.5, "unit": "s", "pass": True}]}

    monkeypatch.setitem(bench_main.ALL_SECTIONS, "probe-test", ("probe_test_module", "a test section"))
    monkeypatch.setattr(importlib, "import_module", lambda _name: Section)
    result = bench_main._run_section("probe-test", None)  # type: ignore[arg-type]
    assert result["cpu_probe_ms"] == {"before": 41.5, "after": 83.0}
    table = bench_main._table({"probe-test": result})
    assert "probe-test 41.5 -> 83 ms" in table.splitlines()[-1]
