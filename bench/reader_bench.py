"""What the bounded reader's pre-pass costs on real answers (``fabric/redfish/reader.py``).

Before ``json.loads`` builds anything, the reader counts the JSON values and the nesting outside
strings and looks for strings over 1,024 characters, at C speed. Measured on answers of the
``instant`` emulator (a real process) with a generated topology of 100 hosts and 4,000 GPUs
(``--quick``: 20 hosts, 800 GPUs): its expanded Endpoints and ResourceBlocks collections — the
largest answers a discovery pass reads — and one ComputerSystem, each parsed many times in this
process: the median of ``json.loads`` alone, of the pre-pass alone, and of ``reader.parse``
(pre-pass, UTF-8 decode, ``json.loads``). Target: the pre-pass costs at most half of
``json.loads`` on the largest answer.

``python -m bench --only reader``; ``python -m bench.reader_bench [--quick]`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.common import BenchContext, check, generate_topology, progress, work_dir
from fabric.redfish.reader import ANSWER_BUDGET, parse
from fabric.redfish.reader import _count as count_values
from fabric.redfish.reader import _may_hold_long_strings as may_hold_long_strings
from fabric_dra_testbed.stack import Stack

__all__ = ["run"]

ANSWERS = {
    "endpoints": "/redfish/v1/Fabrics/PCIe/Endpoints?$expand=.($levels=1)",
    "resource_blocks": "/redfish/v1/CompositionService/ResourceBlocks?$expand=.($levels=1)",
    "system": "/redfish/v1/Systems/kind-worker",
}


def _median_ms(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _pre_pass(data: bytes) -> None:
    count_values(data, ANSWER_BUDGET)
    may_hold_long_strings(data, ANSWER_BUDGET.string)


def measure(quick: bool) -> dict[str, Any]:
    hosts, gpus = (20, 800) if quick else (100, 4000)
    bodies: dict[str, bytes] = {}
    with work_dir("reader-bench") as work, Stack(work, logs_dir=work) as stack:
        topology = generate_topology(work / "topology.yaml", hosts=hosts, gpus=gpus, nvme=gpus // 10)
        progress("reader", f"emulator with {hosts} hosts and {gpus} GPUs")
        emulator = stack.emulator(topology=topology, auth=False)
        for name, uri in ANSWERS.items():
            bodies[name] = httpx.get(emulator.url + uri, timeout=300).content
    figures: dict[str, Any] = {"hosts": hosts, "gpus": gpus}
    for name, data in bodies.items():
        rounds = 15 if len(data) > 100_000 else 2000
        loads = _median_ms(lambda data=data: json.loads(data), rounds)  # type: ignore[misc]
        pre = _median_ms(lambda data=data: _pre_pass(data), rounds)  # type: ignore[misc]
        whole = _median_ms(lambda data=data: parse(data, ANSWER_BUDGET), rounds)  # type: ignore[misc]
        figures[name] = {
            "bytes": len(data),
            "values": parse(data, ANSWER_BUDGET).values,
            "json_loads_ms": round(loads, 3),
            "pre_pass_ms": round(pre, 3),
            "parse_ms": round(whole, 3),
            "pre_pass_share": round(pre / loads, 3),
        }
    return figures


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = measure(ctx.quick)
    largest = max((v for v in figures.values() if isinstance(v, dict)), key=lambda v: v["bytes"])
    return {
        "figures": figures,
        "checks": [
            check(
                f"pre-pass / json.loads, {largest['bytes'] / 1e6:.1f} MB answer",
                100 * largest["pre_pass_share"],
                50,
                "%",
            )
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(measure(args.quick), indent=2))


if __name__ == "__main__":
    main()
