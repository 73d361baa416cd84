"""Correlated burst (issue 37): 1,000 claims arriving within 5 s across 10 nodes, on a fabric large
enough to hold them, with the warm pool on ``auto`` after a warm-up.

What runs (real processes on real sockets, :class:`bench.common.FabricStack` and the stack builder):
the API test server; ``fabric-dra emulator serve`` with the ``realistic`` latency profile (a GPU
hot-add is a Redfish task of 3 ± 1 s) on a generated topology of ``devices`` GPUs (16 a switch) and
``nodes`` hosts, each reaching every GPU; ``fabric-dra manager serve`` with the warm pool on
``auto`` (the warm bench's settings: ``bench.warm_bench``); the controller publishing the
ResourceSlices; one ``fabric-dra plugin`` per node; and the stand-in control plane
(``python -m kube_standin.cluster``: the ResourceClaim controller, the DRA scheduler, one kubelet
per node) — the path a pod takes in a real cluster, as the warm bench's pod replays take it.

Each claim is a pod asking for one GPU through a ResourceClaimTemplate (docs/manager.md's recipe:
``firstAvailable: [warm, any]`` and a preferred node affinity for nodes with a warm GPU); no node is
named. First a **warm-up**, as a cluster has before any burst: Poisson pods at ``warmup_rate`` per
second for ``warmup_seconds``, each held an exponential time and deleted, so the pool sizes itself
from demand it has seen. Then the **burst**: ``claims`` pods created at seeded arrival times within
``seconds`` (``poisson``: a Poisson process given its count, i.e. sorted uniform draws; ``even``:
evenly spaced), never deleted while measured.

A claim is *ready* when its pod is Running (the kubelet set it so once NodePrepareResources
answered: claim from template, allocation, binding, the kubelet's take-up, the plugin's prepare —
attach through the manager, the hot-add or warm hit, visibility in the node's sysfs, CDI,
checkpoint — and the status write), as the bench's watch saw it. *Claim-to-ready* is the pod's
creation to then; the hops are split in ``phases``. A claim fails when its pod is not Running
``settle_seconds`` after the last arrival; its reason is the last warning event of the pod (the
kubelet retries a failed prepare itself, with its back-off; the bench retries nothing).

Targets (issue 37): no claim failed; the last claim ready ≤ 15 s after the first arrival.

``python -m bench --only burst`` (the figure to ``bench/results/burst.svg``);
``python -m bench.burst_bench --help`` for one run with its own sizes and ``--plot FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    REPO_ROOT,
    BenchContext,
    FabricStack,
    check,
    cpu_seconds,
    host_name,
    machine,
    percentile,
    progress,
    summary_ms,
    work_dir,
)
from bench.stepplot import Marker, Series, cumulative, step_svg
from bench.warm_bench import (
    _MODES,
    Arrival,
    Workload,
    _counters,
    _create_warm_template,
    _follow,
    _metric,
    _phases,
    _pod_arrivals,
    _PodMilestones,
    _until_published,
    steady,
)
from plumbing.kube import KubeClient
from plumbing.kube.resources import EVENTS, PODS, RESOURCE_CLAIMS

__all__ = ["ARRIVAL_SHAPES", "BurstConfig", "burst_arrivals", "main", "measure", "plot", "run"]

TARGET_LAST_READY_S = 15.0
ARRIVAL_SHAPES = ("poisson", "even")
NAMESPACE = "default"
#: a burst pod is never deleted while measured: its hold outlasts any run
_FOREVER = 86_400.0
#: how often the manager's attaches in flight are read during the burst
_SAMPLE_SECONDS = 0.2
DEFAULT_PLOT = REPO_ROOT / "bench" / "results" / "burst.svg"


@dataclass(frozen=True)
class BurstConfig:
    claims: int = 1000
    seconds: float = 5.0
    nodes: int = 10
    devices: int = 1200
    arrivals: str = "poisson"
    seed: int = 37
    #: the warm-up before the burst: Poisson pods at this rate for this long, held exp(mean)
    warmup_seconds: float = 60.0
    warmup_rate: float = 1.0
    warmup_hold: float = 20.0
    #: a burst pod not Running this long after the last arrival has failed
    settle_seconds: float = 120.0


#: the smoke run (``--quick``): every path once, at a size the suite affords
QUICK = BurstConfig(
    claims=20, seconds=2.0, nodes=2, devices=40, warmup_seconds=4.0, warmup_hold=2.0, settle_seconds=60.0
)


def burst_arrivals(claims: int, seconds: float, shape: str, seed: int) -> list[float]:
    """Arrival offsets in [0, ``seconds``), ascending. ``poisson``: a Poisson process on the
    interval given that ``claims`` arrived in it — its arrival times are then ``claims`` uniform
    draws, sorted (the order statistics of the uniform distribution); ``even``: one every
    ``seconds / claims``. The same seed gives the same offsets."""
    if shape == "even":
        return [seconds * i / claims for i in range(claims)]
    if shape != "poisson":
        raise ValueError(f"arrival shape {shape!r} is not one of {', '.join(ARRIVAL_SHAPES)}")
    rng = random.Random(seed)
    return sorted(rng.uniform(0.0, seconds) for _ in range(claims))


# -- the run -----------------------------------------------------------------------------------------


def _pod_name(workload: Workload | str, index: int) -> str:
    """The pod :func:`bench.warm_bench._pod_arrivals` creates for arrival ``index`` of ``workload``."""
    return f"warm-{workload if isinstance(workload, str) else workload.name}-{index}"


async def _start_on_time(
    workload: Workload, start: Callable[[int, Arrival], Coroutine[Any, Any, None]], label: str
) -> tuple[list[asyncio.Task[None]], float]:
    """Start each arrival of ``workload`` at its time; returns the tasks (still running) and when
    the first was due (``time.perf_counter()``)."""
    tasks: list[asyncio.Task[None]] = []
    begin_wall = time.monotonic()
    begin = time.perf_counter()
    step = max(1, len(workload.arrivals) // 10)
    for index, arrival in enumerate(workload.arrivals):
        await asyncio.sleep(max(0.0, begin_wall + arrival.at - time.monotonic()))
        if index % step == 0:
            progress("burst", f"{label}: claim {index + 1} of {len(workload.arrivals)}")
        tasks.append(asyncio.create_task(start(index, arrival)))
    return tasks, begin + (workload.arrivals[0].at if workload.arrivals else 0.0)


async def _sample_in_flight(url: str, samples: list[tuple[float, float]]) -> None:
    """The manager's attach operations in flight (``fabric_dra_operations_in_flight``), every
    :data:`_SAMPLE_SECONDS`: each is a hot-add on its way (a warm hit is no operation)."""
    query = "name[]=fabric_dra_operations_in_flight"
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                text = (await http.get(f"{url}/metrics?{query}")).text
                for line in text.splitlines():
                    if line.startswith('fabric_dra_operations_in_flight{operation="attach"}'):
                        samples.append((time.perf_counter(), float(line.rsplit(" ", 1)[1])))
            await asyncio.sleep(_SAMPLE_SECONDS)


async def _warning_of(kube: KubeClient, names: set[str]) -> dict[str, str]:
    """Each pod of ``names``: the reason and message of its last warning event (the scheduler's
    ``FailedScheduling``, the kubelet's ``FailedPrepareDynamicResources``), or a note that it had none."""
    events, _ = await kube.list_all(EVENTS, NAMESPACE)
    found: dict[str, tuple[str, str]] = {}
    for event in events:
        regarding = event.get("regarding") or {}
        name = str(regarding.get("name"))
        if name in names and regarding.get("kind") == "Pod" and event.get("type") == "Warning":
            stamp = str(event.get("eventTime") or (event.get("metadata") or {}).get("creationTimestamp"))
            if name not in found or stamp >= found[name][0]:
                found[name] = (stamp, f"{event.get('reason')}: {event.get('note', '')}"[:300])
    return {n: found[n][1] if n in found else "no warning event: not Running in time" for n in names}


def _processes(stack: FabricStack) -> dict[str, list[int]]:
    fabric = stack.stack
    assert fabric is not None and stack.api is not None
    roles = fabric.roles
    return {
        "api_server": [stack.api.process.pid],
        "emulator": [stack.emulator.pid] if stack.emulator else [],
        "manager": [stack.manager.pid] if stack.manager else [],
        "controller": [roles["controller"].pid],
        "stand_in_cluster": [roles["cluster"].pid],
        "plugins": [p.pid for p in stack.plugins.values()],
        "bench": [os.getpid()],
    }


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}


@dataclass
class _Burst:
    """What the burst left: the pods' milestones, when the first arrival was due, the samples of
    attaches in flight, the tasks of the arrivals, and the window's CPU and counters."""

    pods: _PodMilestones
    names: list[str]
    #: each claim's arrival offset, and when the first was due (``time.perf_counter()``)
    offsets: list[float]
    due: float
    samples: list[tuple[float, float]]
    tasks: list[asyncio.Task[None]]
    cpu: dict[str, float]
    counters: dict[str, float]
    ended: float


async def _run_burst(
    stack: FabricStack, kube: KubeClient, config: BurstConfig, pods: _PodMilestones
) -> _Burst:
    assert stack.manager is not None
    offsets = burst_arrivals(config.claims, config.seconds, config.arrivals, config.seed)
    workload = Workload("burst", [Arrival(at, 0, _FOREVER) for at in offsets], 0.0, config.seconds, "burst")
    names = [_pod_name(workload, i) for i in range(config.claims)]
    pids = _processes(stack)
    before_counters, before_cpu = await _counters(stack), _cpu(pids)
    samples: list[tuple[float, float]] = []
    sampler = asyncio.create_task(_sample_in_flight(stack.manager.address, samples))
    tasks: list[asyncio.Task[None]] = []
    try:
        tasks, due = await _start_on_time(workload, _pod_arrivals(kube, NAMESPACE, workload, pods), "burst")
        progress("burst", f"every claim created; waiting up to {config.settle_seconds:g} s for them to run")
        waiting = asyncio.gather(*(pods.settled[n].wait() for n in names))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiting, config.settle_seconds)
        ended = time.perf_counter()
        cpu = {k: v - before_cpu[k] for k, v in _cpu(pids).items()}
        after = await _counters(stack)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    return _Burst(
        pods,
        names,
        offsets,
        due,
        samples,
        tasks,
        cpu,
        {k: after[k] - before_counters[k] for k in after},
        ended,
    )


async def _measure(stack: FabricStack, config: BurstConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    fabric, api = stack.stack, stack.api
    assert fabric is not None and api is not None and stack.manager_handle is not None
    nodes = [host_name(i) for i in range(config.nodes)]
    progress("burst", f"starting {config.nodes} plugins, the controller and the stand-in control plane")
    for node in nodes:
        stack.plugin(node)
    fabric.controller(stack.manager_handle, api)
    fabric.cluster(api, nodes)
    warmup = replace(
        steady(
            config.warmup_rate,
            config.warmup_seconds,
            config.warmup_hold,
            0.0,
            nodes=config.nodes,
            seed=config.seed,
        ),
        name="warmup",
    )
    warm_names = [_pod_name(warmup, i) for i in range(len(warmup.arrivals))]
    burst_names = [_pod_name("burst", i) for i in range(config.claims)]
    pods = _PodMilestones({n: asyncio.Event() for n in [*warm_names, *burst_names]})
    async with api.client() as kube:
        await _create_warm_template(kube, NAMESPACE)
        await _until_published(kube, config.nodes, 300.0, devices=config.devices)
        watchers = [
            asyncio.create_task(_follow(kube, PODS, NAMESPACE, pods.on_pod)),
            asyncio.create_task(_follow(kube, RESOURCE_CLAIMS, NAMESPACE, pods.on_claim)),
        ]
        warm_tasks: list[asyncio.Task[None]] = []
        burst: _Burst | None = None
        try:
            progress("burst", f"warm-up: {len(warmup.arrivals)} pods over {config.warmup_seconds:g} s")
            warm_tasks, _ = await _start_on_time(
                warmup, _pod_arrivals(kube, NAMESPACE, warmup, pods), "warm-up"
            )
            await asyncio.sleep(
                max(0.0, config.warmup_seconds - (warmup.arrivals[-1].at if warmup.arrivals else 0))
            )
            pool = {
                "warm_devices": await _metric(stack, "fabric_dra_warm_devices"),
                "warmup_pods_running": sum(1 for n in warm_names if pods.settled[n].is_set()),
                "warmup_outcomes": {
                    k: await _metric(stack, "fabric_dra_warm_claims_total", outcome=k)
                    for k in ("hit", "miss", "cold")
                },
            }
            progress("burst", f"warm-up done, the pool holds {pool['warm_devices']:g} devices: the burst")
            burst = await _run_burst(stack, kube, config, pods)
            failed = {n for n in burst_names if not pods.settled[n].is_set()}
            reasons = await _warning_of(kube, failed) if failed else {}
            for name, task in zip(burst_names, burst.tasks, strict=False):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    reasons[name] = f"creating the pod: {task.exception()}"[:300]
            retried = await _warning_of(kube, set(burst_names) - failed)
            for watcher in watchers:  # a watch that died would count every pod after it failed
                if watcher.done() and watcher.exception() is not None:
                    raise RuntimeError("the bench's watch ended") from watcher.exception()
        finally:
            for task in [*warm_tasks, *watchers, *(burst.tasks if burst else [])]:
                task.cancel()
            await asyncio.gather(
                *warm_tasks, *watchers, *(burst.tasks if burst else []), return_exceptions=True
            )
    assert burst is not None
    kubelet_retried = sum(1 for r in retried.values() if r.startswith("FailedPrepareDynamicResources"))
    return _figures(config, burst, pool, reasons, kubelet_retried), _curves(burst)


def _figures(
    config: BurstConfig, burst: _Burst, pool: dict[str, Any], reasons: dict[str, str], kubelet_retried: int
) -> dict[str, Any]:
    pods = burst.pods
    ready = [n for n in burst.names if n in pods.running]
    first = min(pods.created[n] for n in burst.names if n in pods.created)
    last_ready = max((pods.running[n] for n in ready), default=float("nan"))
    window = (last_ready if ready else burst.ended) - first
    # how late the bench sent each creation against its schedule (it shares the cores it measures)
    due = burst.due - burst.offsets[0]
    lag = [
        pods.created[n] - due - at
        for n, at in zip(burst.names, burst.offsets, strict=True)
        if n in pods.created
    ]
    delta = burst.counters
    in_flight = [n for t, n in burst.samples if t >= first]
    return {
        "config": asdict(config),
        "pool_at_burst": pool,
        "claims": config.claims,
        "ready": len(ready),
        "failed": len(reasons),
        "failures": dict(sorted(reasons.items())[:20]),
        "kubelet_retried_pods": kubelet_retried,
        "arrival_span_s": round(max(pods.created[n] for n in burst.names if n in pods.created) - first, 3),
        "arrival_lag": summary_ms(lag),
        "first_arrival_to_last_ready_s": round(last_ready - first, 3) if ready else None,
        "claim_to_ready": summary_ms([pods.running[n] - pods.created[n] for n in ready]),
        "kubelet_to_ready": summary_ms([pods.attach(n) for n in ready]),
        "phases": _phases({n: {"created": pods.created[n], **pods.seen.get(n, {})} for n in ready}),
        "outcomes": {k: int(delta[k]) for k in ("hit", "miss", "cold")},
        "hot_adds_in_flight_max": max(in_flight, default=0.0),
        "in_flight_samples": len(in_flight),
        "cpu_seconds": {k: round(v, 2) for k, v in burst.cpu.items()},
        "cpu_cores": {k: round(v / window, 2) for k, v in burst.cpu.items()} if window > 0 else {},
        "cpu_window_s": round(window, 2),
        "ready_at_s": {
            f"p{q}": round(percentile([pods.running[n] - first for n in ready], q), 3)
            for q in (50, 90, 99, 100)
        }
        if ready
        else {},
    }


def _curves(burst: _Burst) -> dict[str, Any]:
    pods = burst.pods
    first = min(pods.created[n] for n in burst.names if n in pods.created)
    return {
        "arrived": [pods.created[n] - first for n in burst.names if n in pods.created],
        "ready": [pods.running[n] - first for n in burst.names if n in pods.running],
        "in_flight": [(t - first, n) for t, n in burst.samples if t >= first],
    }


def plot(curves: dict[str, Any], path: Path, *, title: str, target: float = TARGET_LAST_READY_S) -> Path:
    """The burst's figure: claims arrived and ready against seconds since the first arrival, the
    manager's hot-adds in flight, and the target as a vertical line."""
    series = [
        Series("claims arrived (pod created)", cumulative(curves["arrived"]), "#7f8c8d", dashed=True),
        Series("claims ready (pod Running)", cumulative(curves["ready"]), "#2471a3"),
        Series(
            "attaches in flight (hot-adds of claims and of the warm pool)",
            [(t, n) for t, n in curves["in_flight"]],
            "#e67e22",
        ),
    ]
    svg = step_svg(
        series,
        title=title,
        x_label="seconds since the first arrival",
        y_label="claims",
        markers=[Marker(target, f"target {target:g} s")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg)
    return path


def measure(config: BurstConfig, *, root: Path, plot_to: Path | None = None) -> dict[str, Any]:
    """One burst on a fresh stack under ``root``; its figures, the plot written to ``plot_to``."""
    progress("burst", f"{config.devices} GPUs on {config.nodes} hosts, realistic profile, warm pool auto")
    load = os.getloadavg()
    with FabricStack(
        root, hosts=config.nodes, gpus=config.devices, latency="realistic", manager_args=_MODES["auto"]
    ) as stack:
        figures, curves = asyncio.run(_measure(stack, config))
    figures["load_average_before"] = [round(v, 2) for v in load]
    figures["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    if plot_to is not None:
        title = (
            f"{config.claims} claims in {config.seconds:g} s over {config.nodes} nodes, "
            f"{config.devices} GPUs (realistic), warm pool auto"
        )
        figures["plot"] = str(plot(curves, plot_to, title=title))
    return figures


def run(ctx: BenchContext) -> dict[str, Any]:
    """Section ``burst`` of ``python -m bench`` (only with ``--only``)."""
    config = QUICK if ctx.quick else BurstConfig()
    figures = measure(config, root=ctx.root / "burst", plot_to=DEFAULT_PLOT)
    last = figures["first_arrival_to_last_ready_s"]
    return {
        "figures": figures,
        "checks": [
            check("failed claims of the burst", figures["failed"], 0, "claims"),
            check(
                f"{config.claims} claims in {config.seconds:g} s: first arrival to last ready",
                last if last is not None else 1e9,
                TARGET_LAST_READY_S,
                "s",
            ),
        ],
    }


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    default = BurstConfig()
    parser = argparse.ArgumentParser(
        prog="python -m bench.burst_bench",
        description="A correlated burst of claims (pods with a claim template) through the stand-in "
        "scheduler and kubelets, the plugins, the manager (warm pool auto, after a warm-up) and the "
        "realistic emulator; prints the figures as JSON. Targets: 0 failed, the last claim ready "
        f"<= {TARGET_LAST_READY_S:g} s after the first arrival.",
    )
    parser.add_argument(
        "--claims",
        type=_positive(int),
        default=default.claims,
        help="claims (pods) in the burst (default %(default)s)",
    )
    parser.add_argument(
        "--seconds",
        type=_positive(float),
        default=default.seconds,
        help="the burst's arrivals span (default %(default)s)",
    )
    parser.add_argument(
        "--nodes",
        type=_positive(int),
        default=default.nodes,
        help="nodes, one plugin each (default %(default)s)",
    )
    parser.add_argument(
        "--devices",
        type=_positive(int),
        default=default.devices,
        help="GPUs in the emulated fabric, at least --claims (default %(default)s)",
    )
    parser.add_argument(
        "--arrivals",
        choices=ARRIVAL_SHAPES,
        default=default.arrivals,
        help="poisson: a Poisson process given its count (sorted uniform draws); even: evenly spaced "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=default.seed,
        help="seed of the arrivals and the warm-up (default %(default)s)",
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=default.warmup_seconds,
        help="warm-up before the burst (default %(default)s)",
    )
    parser.add_argument(
        "--warmup-rate",
        type=_positive(float),
        default=default.warmup_rate,
        help="warm-up pods per second, Poisson (default %(default)s)",
    )
    parser.add_argument(
        "--warmup-hold",
        type=_positive(float),
        default=default.warmup_hold,
        help="mean seconds a warm-up pod is held (default %(default)s)",
    )
    parser.add_argument(
        "--settle-seconds",
        type=_positive(float),
        default=default.settle_seconds,
        help="a pod not Running this long after the last arrival has failed (default %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="the smoke run's sizes: 20 claims, 40 GPUs, 2 nodes"
    )
    parser.add_argument(
        "--plot", type=Path, help="write the figure (SVG: claims arrived and ready over time) here"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep the processes' logs")
    args = parser.parse_args(argv)
    config = (
        QUICK
        if args.quick
        else replace(
            default,
            claims=args.claims,
            seconds=args.seconds,
            nodes=args.nodes,
            devices=args.devices,
            arrivals=args.arrivals,
            seed=args.seed,
            warmup_seconds=args.warmup_seconds,
            warmup_rate=args.warmup_rate,
            warmup_hold=args.warmup_hold,
            settle_seconds=args.settle_seconds,
        )
    )
    if config.devices < config.claims:
        parser.error(
            f"--devices {config.devices} cannot hold --claims {config.claims}: give at least as many"
        )
    if config.warmup_seconds < 0:
        parser.error("--warmup-seconds must be 0 or more")
    with contextlib.nullcontext(args.keep) if args.keep else work_dir("fdburst-") as root:
        figures = measure(config, root=root, plot_to=args.plot)
    figures["machine"] = machine()
    text = json.dumps(figures, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0 if figures["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
