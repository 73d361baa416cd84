"""The manager's restart at fleet scale: 10,100 devices, 10,000 bindings, the ledger in ConfigMaps.

Real processes: for each size, 10 bindings and 10,000, an API test server and an ``instant``
emulator with the same generated topology of 100 hosts and 10,100 devices (10,000 GPUs, 100 NVMe
drives), and ``fabric-dra manager serve --ledger configmap``. The bindings are made on the
emulator directly (``Zone.AddEndpoint`` on each host's zone) and their ledger entries written by
this process (``Ledger`` + ``ConfigMapLedgerStore``), so the fabric and the ledger agree as after a
bulk attach, without the minutes the bulk takes (bench.ledger_bench measures the bulk). A first
life of the manager on each fabric, untimed, reads it once: the lives measured are restarts,
against a service that has served a manager before. Then, for each manager measured — this
tree's and, with ``--baseline REF``, that commit's (a ``git archive`` of it, run with
``PYTHONPATH`` on the same emulators and API servers, in turns) — at both sizes:

- start to ``/readyz`` (ledger loaded and the fabric read) and the manager's RSS then, the other
  size's processes stopped meanwhile;
- the Redfish requests the start made (from its ``fabric_dra_redfish_request_duration_seconds``);
- attach p50/p90 of one probe device attached and detached ``pairs`` times through REST, each
  with a ResourceClaim allocating it (the manager refuses made-up claims), measured in turns of
  the two sizes (:func:`_probes` says why);
- a whole ``/metrics`` scrape, as Prometheus makes it, :data:`SCRAPES` times: what each scrape
  holds the manager's event loop for (the usage meter counts before every scrape).

The issue's targets (issue 37, "Restart and memory at scale"): start to ready at 10,000 bindings
≤ 15 s, RSS ≤ 256 MiB, attach p90 at 10,000 ≤ 1.2 times p90 at 10.

``python -m bench --only restart``; ``python -m bench.restart_bench [--quick] [--baseline REF]``
prints JSON (``--quick``: 1,000 bindings).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    BenchContext,
    check,
    checkout_tree,
    generate_topology,
    histogram_sums,
    host_name,
    progress,
    rss_mib,
    summary_ms,
    work_dir,
)
from bench.ledger_bench import (
    NAMESPACE,
    PROBE,
    _attach_times,
    _claims,
    _create_nodes,
    _per_pair,
    _redfish_totals,
)
from fabric.state.ledger import ConfigMapLedgerStore, Ledger, LedgerEntry, LedgerState
from fabric_dra_testbed.stack import Emulator, Stack, zone_add

__all__ = ["run"]

HOSTS = 100
LEDGER = "fabric-dra-manager-ledger"
TARGET_READY_S = 15.0
TARGET_RSS_MIB = 256.0
TARGET_P90_RATIO = 1.2
#: whole /metrics scrapes timed after the probe pairs
SCRAPES = 7
#: turns each size's probe pairs are measured in, the sizes alternating (:func:`_probes`)
ROUNDS = 8
#: a pause after resuming a manager before its turn's first attach
SETTLE_S = 1.0


async def _bind_direct(emulator: Emulator, pairs: list[tuple[str, str]], concurrency: int = 32) -> None:
    """Bind each (device, host) on the emulator itself, as a bulk attach would have left it."""
    auth = (emulator.username, emulator.password) if emulator.auth_enabled else None
    gate = asyncio.Semaphore(concurrency)
    # A connection per POST: a kept one the emulator closes as idle (its event loop busy writing
    # a large state, the keep-alive timer fires late) fails the POST sent into it as a ReadError,
    # and an AddEndpoint cannot be resent blindly. A new connection has no such race.
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=emulator.url, auth=auth, limits=limits, timeout=120) as http:

        async def one(device: str, host: str) -> None:
            uri, body = zone_add(host, device)
            async with gate:
                answer = await http.post(uri, json=body)
            if answer.status_code >= 300:
                raise RuntimeError(f"binding {device} to {host}: {answer.status_code} {answer.text[:200]}")

        await asyncio.gather(*(one(d, h) for d, h in pairs))


async def _fill_ledger(stack_kube: Any, pairs: list[tuple[str, str]]) -> None:
    """The ledger entries of those bindings, as the manager writes them once bound."""
    async with stack_kube.client() as kube:
        ledger = Ledger(
            ConfigMapLedgerStore(kube, name=LEDGER, namespace=NAMESPACE), max_entries_per_node=10**6
        )
        await ledger.load()
        for device, host in pairs:
            ledger.put(
                LedgerEntry(
                    device=device,
                    device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
                    node=host,
                    host=host,
                    claim_uid=str(uuid.uuid4()),
                    state=LedgerState.BOUND,
                    operation_id=f"op-{uuid.uuid4().hex[:12]}",
                    namespace=NAMESPACE,
                )
            )
        await ledger.commit()


def _requests(url: str) -> dict[str, float]:
    totals = histogram_sums(url, "fabric_dra_redfish_request_duration_seconds", ("method", "resource"))
    return {key: count for key, (count, _) in sorted(totals.items()) if count}


def _scrapes(url: str) -> dict[str, float]:
    """Wall time of whole /metrics scrapes, one after another (min, median, max in ms)."""
    times = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(SCRAPES):
            started = time.perf_counter()
            http.get("/metrics").raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "min_ms": round(times[0], 1),
        "median_ms": round(times[len(times) // 2], 1),
        "max_ms": round(times[-1], 1),
    }


def _start(stack: Stack, name: str, emulator: Emulator, kube: Any, tree: Path | None) -> dict[str, Any]:
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"} if tree is not None else None
    started = time.perf_counter()
    manager = stack.manager(
        emulator,
        name=name,
        kube=kube,
        namespace=NAMESPACE,
        ledger="configmap",
        insecure_no_auth=True,
        # no pod holds the claims here: no orphan reconciler; the periodic full re-read is not
        # what this measures (bench.ledger_bench says why it is put off)
        args=["--orphan-grace-seconds", "0", "--redfish-timeout", "180", "--resync-seconds", "3600"],
        env=env,
        ready_timeout=1800,
    )
    ready = time.perf_counter() - started
    return {"manager": manager, "ready_s": round(ready, 2), "rss_mib": rss_mib(manager.role.pid)}


def _idle(fabrics: dict[str, tuple[Any, Emulator, int]], managers: dict[str, Any], step: str) -> list[int]:
    """The managers and emulators of the sizes other than ``step`` (those running so far)."""
    return [p for s, m in managers.items() if s != step for p in (m.role.pid, fabrics[s][1].role.pid)]


@contextmanager
def _paused(*pids: int) -> Iterator[None]:
    """The processes stopped (SIGSTOP) while the other size is measured, then resumed: an idle
    manager's loops would otherwise take their turns on the two cores meanwhile."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def measure(
    quick: bool = False, baseline: str | None = None, pairs: int | None = None, *, baseline_only: bool = False
) -> dict[str, Any]:
    bindings = 1_000 if quick else 10_000
    pairs = pairs or (20 if quick else 50)
    out: dict[str, Any] = {"bindings": bindings, "devices": bindings + 100, "pairs": pairs, "rounds": ROUNDS}
    with ExitStack() as stack_exit, work_dir("restart-bench-") as root, Stack(root) as stack:
        trees: dict[str, Path | None] = {}
        if baseline:
            unpacked = stack_exit.enter_context(tempfile.TemporaryDirectory(prefix="restart-baseline-"))
            trees[f"baseline {baseline}"] = checkout_tree(baseline, Path(unpacked))
        if not baseline_only:
            trees["this tree"] = None
        gpus = min(bindings + 100, 10_000)
        nvme = bindings + 100 - gpus
        topology = generate_topology(root / "topology.yaml", hosts=HOSTS, gpus=gpus, nvme=nvme)
        devices = [*(f"gpu{i}" for i in range(1, gpus)), *(f"nvme{i}" for i in range(nvme))][:bindings]
        placed = [(d, host_name(i % HOSTS)) for i, d in enumerate(devices)]
        # One fabric per size, each with its own API server and emulator of the same 10,100
        # devices, so that the two sizes' probes can take turns (see _probes).
        fabrics: dict[str, tuple[Any, Emulator, int]] = {}
        for step, upto in (("10", 10), (str(bindings), bindings)):
            kube = stack.apiserver(name=f"apiserver-{step}")
            asyncio.run(_create_nodes(kube))
            emulator = stack.emulator(name=f"emulator-{step}", latency="instant", topology=topology)
            progress("restart", f"binding {upto} devices on the emulator of the {step}-binding fabric")
            asyncio.run(_bind_direct(emulator, placed[:upto]))
            # A restart meets a service that has served a manager before: a first life, untimed,
            # reads the fabric once (the emulator's renderings are then kept, as a service's
            # would be warm), and the lives measured below are restarts.
            others = [e.role.pid for _, e, _ in fabrics.values()]
            with _paused(*others):
                asyncio.run(_fill_ledger(kube, placed[:upto]))
                progress("restart", f"a first life of the manager on the {step}-binding fabric, untimed")
                _start(stack, f"manager-first-{step}", emulator, kube, None)["manager"].stop()
            fabrics[step] = (kube, emulator, upto)
        for label, tree in trees.items():
            managers: dict[str, Any] = {}
            figures: dict[str, dict[str, Any]] = {}
            try:
                for step, (kube, emulator, upto) in fabrics.items():
                    # every entry again before each start: a manager that forgot some (the baseline's
                    # reconciler did, before its first pass ended) must not change the next one's start
                    asyncio.run(_fill_ledger(kube, placed[:upto]))
                    name = "manager-base" if tree is not None else "manager"
                    progress("restart", f"{label}: start with {upto} bindings")
                    # the other fabric's processes stopped: a start alone on the machine, as before
                    with _paused(*_idle(fabrics, managers, step)):
                        started = _start(stack, f"{name}-{step}", emulator, kube, tree)
                    managers[step] = started.pop("manager")
                    started["start_requests"] = _requests(managers[step].url)
                    figures[step] = started
                _probes(fabrics, managers, figures, pairs)
                for step, started in figures.items():
                    with _paused(*_idle(fabrics, managers, step)):
                        started["metrics_scrape"] = _scrapes(managers[step].url)
                    shown = {k: v for k, v in started.items() if k != "start_requests"}
                    progress("restart", f"{label} at {fabrics[step][2]}: {json.dumps(shown)}")
                    out.setdefault(label, {})[f"at_{step}"] = started
            finally:
                for manager in managers.values():
                    manager.stop()
    for label in trees:
        figures = out[label]
        small, large = figures["at_10"]["attach"], figures[f"at_{bindings}"]["attach"]
        figures["attach_p90_ratio"] = round(large["p90_ms"] / small["p90_ms"], 2)
    return out


def _probes(
    fabrics: dict[str, tuple[Any, Emulator, int]],
    managers: dict[str, Any],
    figures: dict[str, dict[str, Any]],
    pairs: int,
) -> None:
    """Attach p50/p90 of each size's manager, measured in :data:`ROUNDS` turns: a turn of one size's
    pairs, then the other's, the order swapped every round, the idle size's manager and emulator
    stopped meanwhile. The machine's speed drifts over minutes (the same tree's p90 at 10 bindings
    spread from 8.0 to 13.2 ms over one afternoon's runs); measured one size after the other, a minute
    apart, the ratio took the drift with it. In turns, each size meets the same drift."""
    claims = {step: asyncio.run(_claims(kube, [PROBE] * pairs)) for step, (kube, _, _) in fabrics.items()}
    before = {step: _redfish_totals(manager.url) for step, manager in managers.items()}
    times: dict[str, list[float]] = {step: [] for step in fabrics}
    steps = list(fabrics)
    for turn in range(ROUNDS):
        for step in steps if turn % 2 == 0 else steps[::-1]:
            share = claims[step][turn * pairs // ROUNDS : (turn + 1) * pairs // ROUNDS]
            with _paused(*_idle(fabrics, managers, step)):
                # the loops whose timers came due while this manager was stopped run first
                time.sleep(SETTLE_S)
                times[step] += asyncio.run(_attach_times(managers[step].url, share))
    for step, manager in managers.items():
        per_pair = _per_pair(before[step], _redfish_totals(manager.url), pairs)
        figures[step]["attach"] = {**summary_ms(times[step]), "redfish_per_pair": per_pair}


def run(ctx: BenchContext) -> dict[str, Any]:
    """Extra section ``restart`` of ``python -m bench``."""
    figures = measure(ctx.quick, os.environ.get("FABRIC_DRA_BENCH_BASELINE") or None)
    n = figures["bindings"]
    ours = figures["this tree"]
    return {
        "figures": figures,
        "checks": [
            check(f"start to /readyz at {n} bindings", ours[f"at_{n}"]["ready_s"], TARGET_READY_S, "s"),
            check(f"manager RSS at {n} bindings", ours[f"at_{n}"]["rss_mib"], TARGET_RSS_MIB, "MiB"),
            check(f"attach p90 at {n} bindings / at 10", ours["attach_p90_ratio"], TARGET_P90_RATIO, "x"),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 bindings instead of 10,000")
    parser.add_argument("--baseline", metavar="REF", help="also measure the manager of this commit")
    parser.add_argument("--pairs", type=int, help="attach+detach pairs per latency figure")
    parser.add_argument("--baseline-only", action="store_true", help="measure the baseline's manager alone")
    args = parser.parse_args()
    print(
        json.dumps(measure(args.quick, args.baseline, args.pairs, baseline_only=args.baseline_only), indent=2)
    )


if __name__ == "__main__":
    main()
