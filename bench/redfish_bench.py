"""What the manager's Redfish client costs in CPU: per GET and per bind+unbind pair, against the
``instant`` emulator (a real process, sessions on, as in production).

Each measurement runs the client in a fresh process (``bench/redfish_client_child.py``): this
tree's, and, with a baseline commit, that commit's client from a ``git archive`` of it, in turns
(baseline, this tree, baseline, ...) against the same emulator, so that both meet the same machine
load. The figure is the median over the rounds of the client process's CPU (all its threads) per
GET and per pair. Target: at most 0.15 ms of CPU per GET (the manager's share of the 6 ms per
claim of issue 37 leaves about 1 ms for the ~7 Redfish requests of a claim).

``python -m bench.redfish_bench [--quick] [--baseline REF]`` prints JSON;
``FABRIC_DRA_BENCH_BASELINE=REF python -m bench --only redfish`` adds the baseline to the main
command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchContext, check, checkout_tree, progress, work_dir
from fabric_dra_testbed.stack import Stack

__all__ = ["run"]

CHILD = Path(__file__).with_name("redfish_client_child.py")
TARGET_MS_PER_GET = 0.15


def _child(tree: Path, url: str, credentials: Path, gets: int, pairs: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(CHILD), url, str(credentials), str(gets), str(pairs)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the client run of {tree} failed:\n{done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rounds": len(runs),
        "cpu_ms_per_get": round(statistics.median(r["cpu_ms_per_get"] for r in runs), 4),
        "cpu_ms_per_pair": round(statistics.median(r["cpu_ms_per_pair"] for r in runs), 4),
        "gets_per_s": round(statistics.median(r["gets_per_s"] for r in runs), 1),
        "pairs_per_s": round(statistics.median(r["pairs_per_s"] for r in runs), 1),
        "runs": runs,
    }


def measure(quick: bool, baseline: str | None) -> dict[str, Any]:
    gets, pairs, rounds = (300, 10, 1) if quick else (3000, 50, 3)
    figures: dict[str, Any] = {"gets_per_run": gets, "pairs_per_run": pairs * 4}
    with ExitStack() as stack, work_dir("redfish-bench") as work:
        trees = {"this tree": REPO_ROOT}
        if baseline:
            unpacked = stack.enter_context(tempfile.TemporaryDirectory(prefix="redfish-baseline-"))
            trees = {f"baseline {baseline}": checkout_tree(baseline, Path(unpacked)), **trees}
        fabric = stack.enter_context(Stack(work, logs_dir=work))
        emulator = fabric.emulator(latency="instant")
        credentials = emulator.state_dir / "credentials.json"
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for round_ in range(rounds):
            for name, tree in trees.items():
                progress("redfish", f"round {round_ + 1}/{rounds}: {name}")
                runs[name].append(_child(tree, emulator.url, credentials, gets, pairs))
        for name, results in runs.items():
            figures[name] = _summary(results)
    return figures


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = measure(ctx.quick, os.environ.get("FABRIC_DRA_BENCH_BASELINE") or None)
    ours = figures["this tree"]
    return {
        "figures": figures,
        "checks": [check("client CPU per Redfish GET", ours["cpu_ms_per_get"], TARGET_MS_PER_GET, "ms")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--baseline", metavar="REF", help="also measure the client of this commit")
    args = parser.parse_args()
    print(json.dumps(measure(args.quick, args.baseline), indent=2))


if __name__ == "__main__":
    main()
