"""``python -m bench [--quick] [--json FILE] [--only SECTION ...]`` (also ``make bench``).

Runs every benchmark section on this machine — plus the emulator's own figures
— prints one table (target, measured, pass/miss) and writes every figure as JSON (default
``bench/results/latest.json``). Real processes on real sockets throughout; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchContext, cpu_probe_ms, machine, work_dir
from fabric_dra_testbed.stack import ROLE_MODULES
from plumbing.forkserver import ForkServer
from plumbing.procs import use_fork_server

#: section name → (module, what it measures); the order they run in
SECTIONS: dict[str, tuple[str, str]] = {
    "latency": ("bench.latency", "1. prepare/unprepare latency, instant emulator, per phase"),
    "throughput": ("bench.throughput", "2. claims/s at concurrency 1/8/32/64, one node and 10 nodes"),
    "overhead": ("bench.overhead", "3. no-op framework overhead vs the kubernetes-pydra baseline"),
    "publish": ("bench.publish_bench", "4. ResourceSlice publishing, 128 / 1,280 / 10,000 devices"),
    "memory": ("bench.memory", "5. RSS of plugin (idle, after 1,000 cycles), manager, emulator"),
    "realistic": ("bench.realistic", "6. attach-to-ready, realistic emulator, fabric-dra's share"),
    "emulator": ("bench.emulator_bench", "emulator bind+unbind pairs/s and GET p99, instant"),
    "wild": ("bench.wild_bench", "stale endpoint links: 200 zone + 50 connection attach/detach cycles"),
}
#: run only when named with --only
EXTRA_SECTIONS: dict[str, tuple[str, str]] = {
    "manager": ("bench.manager_bench", "manager attach/detach through REST, discovery passes"),
    "apiserver": ("bench.apiserver_bench", "API test server: validation cost, 10,000 devices over HTTP"),
    "ledger": ("bench.ledger_bench", "manager ledger at 10,000 bindings: attach p50, start-up, RSS"),
    "restart": ("bench.restart_bench", "manager start at 10 and 10,000 bindings: /readyz, RSS, attach p90"),
    "warm": ("bench.warm_bench", "pod start cold vs warm (hit, miss), realistic emulator"),
    "reader": ("bench.reader_bench", "the bounded reader's pre-pass against json.loads, real answers"),
    "redfish": ("bench.redfish_bench", "the manager's Redfish client: CPU per GET and per bind+unbind"),
    "sharing": ("bench.sharing_bench", "GPU partitions and CXL memory shares through the manager"),
    "burst": ("bench.burst_bench", "1,000 claims within 5 s over 10 nodes, 1,200 GPUs, warm pool auto"),
    "reach": ("bench.reach_bench", "reachability at 10,100 devices and 632 switches, flat and cascaded"),
    "controller": ("bench.controller_bench", "controller CPU and slices written per change, 10,100 devices"),
    "plugin-feed": ("bench.plugin_feed_bench", "plugin CPU per inventory change, change feed vs full read"),
}
ALL_SECTIONS = {**SECTIONS, **EXTRA_SECTIONS}
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "latest.json"


def _run_section(name: str, ctx: BenchContext) -> dict[str, Any]:
    module = importlib.import_module(ALL_SECTIONS[name][0])
    probe_before = cpu_probe_ms()
    started = time.monotonic()
    try:
        result: dict[str, Any] = module.run(ctx)
    except Exception as err:  # one broken section must not hide the others' figures
        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err}", "checks": []}
    result["seconds"] = round(time.monotonic() - started, 1)
    result["cpu_probe_ms"] = {"before": probe_before, "after": cpu_probe_ms()}
    return result


def _table(results: dict[str, dict[str, Any]]) -> str:
    rows = [("section", "figure", "target", "measured", "result")]
    for name, result in results.items():
        if "error" in result:
            rows.append((name, "(section failed)", "", result["error"][:60], "ERROR"))
        for c in result.get("checks", []):
            measured = f"{c['measured']:g} {c['unit']}".strip()
            rows.append((name, c["name"], c["target"], measured, "pass" if c["pass"] else "MISS"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    probes = [
        f"{name} {p['before']:g} -> {p['after']:g} ms"
        for name, result in results.items()
        if (p := result.get("cpu_probe_ms"))
    ]
    if probes:
        lines.append(
            "\nCPU probe before -> after each section (bench.common.cpu_probe_ms; higher: a slower "
            "machine, and its figures with it): " + "; ".join(probes)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark fabric-dra on this machine: one table of targets, figures as JSON.",
        epilog="sections: "
        + "; ".join(f"{k} ({v[1]})" for k, v in SECTIONS.items())
        + "; only with --only: "
        + "; ".join(f"{k} ({v[1]})" for k, v in EXTRA_SECTIONS.items()),
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations: a smoke test, not figures")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"where to write the figures (default {DEFAULT_JSON})"
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(ALL_SECTIONS), metavar="SECTION", help="run these sections only"
    )
    parser.add_argument(
        "--fork-roles",
        action="store_true",
        help="start the roles as forks of one process that imported them once, as the test suite "
        "does: cheaper starts for a smoke run (figures of a role's start are then not a new interpreter's)",
    )
    args = parser.parse_args(argv)
    wanted = [s for s in ALL_SECTIONS if s in (args.only or SECTIONS)]

    results: dict[str, dict[str, Any]] = {}
    forks = ForkServer(ROLE_MODULES) if args.fork_roles else None
    use_fork_server(forks)
    with contextlib.ExitStack() as cleanup, work_dir("fdbench-") as root:
        if forks is not None:
            cleanup.callback(forks.close)
        ctx = BenchContext(quick=args.quick, root=root, results_dir=args.json.parent)
        try:
            for name in wanted:
                print(f"bench: section {name} — {ALL_SECTIONS[name][1]}", file=sys.stderr, flush=True)
                results[name] = _run_section(name, ctx)
        finally:
            ctx.close()

    document = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "sections": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(_table(results))
    print(f"\nfigures: {args.json}")
    failed = [n for n, r in results.items() if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
