"""Correlated burst (issue 37): 1,000 claims arriving within 5 s across 10 nodes, on a fabric large
enough to hold them, with the warm pool on ``auto`` after a warm-up.

What runs (real processes on real sockets, :class:`bench.common.FabricStack` and the stack builder):
the API test server; ``fabric-dra emulator serve`` with the ``realistic`` latency profile (a GPU
hot-add is a Redfish task of 3 ± 1 s) on a generated topology of ``devices`` GPUs (16 a switch) and
``nodes`` hosts, each reaching every GPU; ``fabric-dra manager serve`` with the warm pool on
``auto`` (the warm bench's settings: ``bench.warm_bench``); the controller publishing the
ResourceSlices; one ``fabric-dra plugin`` per node.

First a **warm-up**, as a cluster has before any burst: Poisson claims at ``warmup_rate`` per second
for ``warmup_seconds``, each held an exponential time and released, so the pool sizes itself from
demand it has seen. Then the **burst**: ``claims`` claims at seeded arrival times within ``seconds``
(``poisson``: a Poisson process given its count, i.e. sorted uniform draws; ``even``: evenly
spaced), never released while measured. A claim takes one of two paths:

* ``claims`` (the default): allocated by the bench (:class:`_Allocator`: a GPU warm on the claim's
  node, else a free one, from the manager's device list read every second), written as the
  scheduler leaves it, then prepared through its node's plugin by the kubelet's protocol client,
  a failed prepare called again with the kubelet's back-off. *Ready*: NodePrepareResources
  answered (claim read, attach through the manager — warm hit or hot-add —, visibility in the
  node's sysfs, CDI, checkpoint).
* ``pods``: a pod per claim with a ResourceClaimTemplate (docs/manager.md's recipe:
  ``firstAvailable: [warm, any]`` and a preferred node affinity for nodes with a warm GPU) through
  the stand-in control plane (``python -m kube_standin.cluster``: claim controller, DRA scheduler,
  a kubelet per node), as the warm bench's pod replays. *Ready*: the pod Running, as the bench's
  watch saw it. At 1,000 pods the stand-in control plane, one Python process, is what the burst
  measures (docs/performance.md), hence not the default.

*Claim-to-ready* is the claim's arrival to ready, split in ``hops``. A claim that is not ready
``seconds + settle_seconds`` after it arrived (claims path) or ``settle_seconds`` after the last
arrival (pods path) has failed, with its last error (the kubelet's retries are the only ones).

Targets (issue 37): no claim failed; the last claim ready ≤ 15 s after the first arrival.

``python -m bench --only burst`` (the figure beside the JSON: ``bench/results/burst.svg``);
``python -m bench.burst_bench --help`` for one run with its own sizes and ``--plot FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    BenchContext,
    ClaimSpec,
    FabricStack,
    check,
    cpu_seconds,
    create_claims,
    host_name,
    machine,
    percentile,
    progress,
    summary_ms,
    work_dir,
)
from bench.stepplot import Marker, Series, cumulative, step_svg
from bench.warm_bench import (
    _MILESTONES,
    _MODES,
    Arrival,
    Workload,
    _counters,
    _create_warm_template,
    _follow,
    _metric,
    _pod_arrivals,
    _PodMilestones,
    _until_published,
    steady,
)
from kube_standin.kubelet_client import ClaimRef, DRAPluginClient, KubeletError
from plumbing.backoff import Backoff
from plumbing.kube import KubeClient
from plumbing.kube.resources import EVENTS, PODS, RESOURCE_CLAIMS

__all__ = [
    "ARRIVAL_SHAPES",
    "PATHS",
    "BurstConfig",
    "burst_arrivals",
    "main",
    "measure",
    "plot",
    "replot",
    "run",
]

TARGET_LAST_READY_S = 15.0
ARRIVAL_SHAPES = ("poisson", "even")
#: the ways a claim can take, each with what its arrival and its readiness are
PATHS = {
    "claims": ("claim created", "NodePrepareResources answered"),
    "pods": ("pod created", "pod Running"),
}
NAMESPACE = "default"
#: a burst pod is never deleted while measured: its hold outlasts any run
_FOREVER = 86_400.0
#: how often the manager's attaches in flight are read during the burst: a scrape costs the manager
#: ~18 ms of CPU however few series it asks for (py-spy during a burst: 9 % of its time at 5 a
#: second), and a hot-add lasts 3 ± 1 s, so twice a second finds the most in flight within a step
_SAMPLE_SECONDS = 0.5


@dataclass(frozen=True)
class BurstConfig:
    claims: int = 1000
    seconds: float = 5.0
    nodes: int = 10
    devices: int = 1200
    arrivals: str = "poisson"
    seed: int = 37
    #: ``claims``: claims allocated by the bench, prepared through the kubelet's protocol client;
    #: ``pods``: pods through the stand-in claim controller, scheduler and kubelets
    path: str = "claims"
    #: the warm-up before the burst: Poisson pods at this rate for this long, held exp(mean)
    warmup_seconds: float = 60.0
    warmup_rate: float = 1.0
    warmup_hold: float = 20.0
    #: how long the bench waits after the last arrival; a claim not ready by then (pods path), or
    #: ``seconds + settle_seconds`` after it arrived (claims path), has failed
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
    found = {
        "api_server": [stack.api.process.pid],
        "emulator": [stack.emulator.pid] if stack.emulator else [],
        "manager": [stack.manager.pid] if stack.manager else [],
        "controller": [fabric.roles["controller"].pid],
        "plugins": [p.pid for p in stack.plugins.values()],
        "bench": [os.getpid()],
    }
    if "cluster" in fabric.roles:
        found["stand_in_cluster"] = [fabric.roles["cluster"].pid]
    return found


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}


@dataclass
class _Claims:
    """What a path leaves of each claim of the burst: when it arrived, when it was ready, the time
    of each hop on its way, and why it failed (a failed claim is never ready)."""

    names: list[str]
    arrived: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    hops: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    #: claims whose prepare the kubelet had to call again before it answered
    retried: int = 0
    _settled: dict[str, asyncio.Event] = field(default_factory=dict)

    def _event(self, name: str) -> asyncio.Event:
        return self._settled.setdefault(name, asyncio.Event())

    def settled(self, name: str) -> None:
        """The claim is ready or failed: the bench stops waiting for it."""
        self._event(name).set()

    async def wait(self, name: str) -> object:
        return await self._event(name).wait()


@dataclass
class _Window:
    """The burst's window as the processes saw it: the manager's counters and CPU between its
    start and its end, and the attaches in flight sampled in between."""

    samples: list[tuple[float, float]]
    cpu: dict[str, float]
    counters: dict[str, float]
    ended: float


async def _window(
    stack: FabricStack,
    config: BurstConfig,
    start: Callable[[int, Arrival], Coroutine[Any, Any, None]],
    settled: Callable[[str], Coroutine[Any, Any, object]],
    names: list[str],
) -> tuple[_Window, list[asyncio.Task[None]], float]:
    """Start the burst's arrivals on time and wait until each claim of ``names`` is ``settled``
    (at most ``settle_seconds`` after the last arrival); the window's figures, the arrivals' tasks
    (the caller cancels them) and the time ``0 s`` of the schedule."""
    assert stack.manager is not None
    offsets = burst_arrivals(config.claims, config.seconds, config.arrivals, config.seed)
    workload = Workload(
        "burst",
        [Arrival(at, i % config.nodes, _FOREVER) for i, at in enumerate(offsets)],
        0.0,
        config.seconds,
        "burst",
    )
    pids = _processes(stack)
    before_counters, before_cpu = await _counters(stack), _cpu(pids)
    samples: list[tuple[float, float]] = []
    sampler = asyncio.create_task(_sample_in_flight(stack.manager.address, samples))
    try:
        tasks, due = await _start_on_time(workload, start, "burst")
        progress("burst", f"every claim arrived; waiting up to {config.settle_seconds:g} s for them")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(settled(n) for n in names)), config.settle_seconds)
        ended = time.perf_counter()
        cpu = {k: v - before_cpu[k] for k, v in _cpu(pids).items()}
        after = await _counters(stack)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    counters = {k: after[k] - before_counters[k] for k in after}
    return _Window(samples, cpu, counters, ended), tasks, due - offsets[0]


def _reason(error: str) -> str:
    """A failure's kind: its message without the claim, device, node and numbers that name it."""
    kind = re.sub(r"^claim [\w.-]+/[\w.-]+: ", "", error)
    kind = re.sub(r"\b(gpu|node |kind-worker|op-)[\w-]*", "<name>", kind)
    kind = re.sub(r'W/"[^"]*"|"[^"]*"', '"…"', kind)  # ETags and quoted values
    return re.sub(r"\d+", "N", kind)[:160]


def _figures(
    config: BurstConfig, claims: _Claims, window: _Window, begin: float, pool: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The burst's figures and its curves (seconds since the first arrival)."""
    offsets = burst_arrivals(config.claims, config.seconds, config.arrivals, config.seed)
    arrived = [n for n in claims.names if n in claims.arrived]
    ready = [n for n in claims.names if n in claims.ready]
    first = min((claims.arrived[n] for n in arrived), default=begin)
    last_ready = max((claims.ready[n] for n in ready), default=window.ended)
    span = last_ready - first
    # how late each arrival was sent against its schedule (the bench shares the cores it measures)
    lag = [
        claims.arrived[n] - begin - at
        for n, at in zip(claims.names, offsets, strict=True)
        if n in claims.arrived
    ]
    in_flight = [(t - first, n) for t, n in window.samples if t >= first]
    hop_names = sorted({h for hops in claims.hops.values() for h in hops})
    figures = {
        "config": asdict(config),
        "pool_at_burst": pool,
        "claims": config.claims,
        "ready": len(ready),
        "failed": config.claims - len(ready),
        "failures": dict(sorted(claims.failures.items())[:20]),
        "failure_reasons": dict(Counter(_reason(r) for r in claims.failures.values())),
        "kubelet_retried_claims": claims.retried,
        "arrival_span_s": round(max((claims.arrived[n] for n in arrived), default=first) - first, 3),
        "arrival_lag": summary_ms(lag),
        "first_arrival_to_last_ready_s": round(span, 3) if ready and len(ready) == config.claims else None,
        "first_arrival_to_last_ready_so_far_s": round(span, 3) if ready else None,
        "claim_to_ready": summary_ms([claims.ready[n] - claims.arrived[n] for n in ready]),
        "hops": {
            h: summary_ms([claims.hops[n][h] for n in ready if h in claims.hops.get(n, {})])
            for h in hop_names
        },
        "ready_at_s": {
            f"p{q}": round(percentile([claims.ready[n] - first for n in ready], q), 3)
            for q in (50, 90, 99, 100)
        }
        if ready
        else {},
        "outcomes": {k: int(window.counters[k]) for k in ("hit", "miss", "cold")},
        "hot_adds_in_flight_max": max((n for _, n in in_flight), default=0.0),
        "cpu_seconds": {k: round(v, 2) for k, v in window.cpu.items()},
        "cpu_cores": {k: round(v / span, 2) for k, v in window.cpu.items()} if span > 0 else {},
        "cpu_window_s": round(span, 2),
    }
    curves = {
        "arrived": [claims.arrived[n] - first for n in arrived],
        "ready": [claims.ready[n] - first for n in ready],
        "in_flight": in_flight,
    }
    return figures, curves


# -- the pods path: the stand-in control plane ------------------------------------------------------


async def _pods_burst(
    stack: FabricStack, kube: KubeClient, config: BurstConfig, pods: _PodMilestones
) -> tuple[_Claims, _Window, float]:
    names = [_pod_name("burst", i) for i in range(config.claims)]
    workload = Workload("burst", [], 0.0, config.seconds, "burst")
    start = _pod_arrivals(kube, NAMESPACE, workload, pods)

    async def settled(name: str) -> object:
        return await pods.settled[name].wait()

    window, tasks, begin = await _window(stack, config, start, settled, names)
    try:
        failed = {n for n in names if not pods.settled[n].is_set()}
        claims = _Claims(names, dict(pods.created), {n: pods.running[n] for n in names if n in pods.running})
        claims.failures = await _warning_of(kube, failed) if failed else {}
        for name, task in zip(names, tasks, strict=False):
            if task.done() and not task.cancelled() and task.exception() is not None:
                claims.failures[name] = f"creating the pod: {task.exception()}"[:300]
        retried = await _warning_of(kube, set(names) - failed)
        claims.retried = sum(1 for r in retried.values() if r.startswith("FailedPrepareDynamicResources"))
        for name in claims.ready:
            seen = {"created": pods.created[name], **pods.seen.get(name, {})}
            claims.hops[name] = {
                f"{a}_to_{b}": seen[b] - seen[a]
                for a, b in itertools.pairwise(_MILESTONES)
                if a in seen and b in seen
            }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return claims, window, begin


async def _measure_pods(stack: FabricStack, config: BurstConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pods path: a pod per claim through the claim controller, the stand-in scheduler and
    kubelets; the warm-up as pods too."""
    fabric, api = stack.stack, stack.api
    assert fabric is not None and api is not None and stack.manager_handle is not None
    nodes = [host_name(i) for i in range(config.nodes)]
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
    names = [_pod_name(warmup, i) for i in range(len(warmup.arrivals))]
    names += [_pod_name("burst", i) for i in range(config.claims)]
    pods = _PodMilestones({n: asyncio.Event() for n in names})
    async with api.client() as kube:
        await _create_warm_template(kube, NAMESPACE)
        await _until_published(kube, config.nodes, 300.0, devices=config.devices)
        watchers = [
            asyncio.create_task(_follow(kube, PODS, NAMESPACE, pods.on_pod)),
            asyncio.create_task(_follow(kube, RESOURCE_CLAIMS, NAMESPACE, pods.on_claim)),
        ]
        warm_tasks: list[asyncio.Task[None]] = []
        try:
            warm_tasks = await _warm_up(config, warmup, _pod_arrivals(kube, NAMESPACE, warmup, pods))
            pool = await _pool(stack)
            claims, window, begin = await _pods_burst(stack, kube, config, pods)
            for watcher in watchers:  # a watch that died would count every pod after it failed
                if watcher.done() and watcher.exception() is not None:
                    raise RuntimeError("the bench's watch ended") from watcher.exception()
        finally:
            for task in [*warm_tasks, *watchers]:
                task.cancel()
            await asyncio.gather(*warm_tasks, *watchers, return_exceptions=True)
    return _figures(config, claims, window, begin, pool)


async def _warm_up(
    config: BurstConfig, warmup: Workload, start: Callable[[int, Arrival], Coroutine[Any, Any, None]]
) -> list[asyncio.Task[None]]:
    progress("burst", f"warm-up: {len(warmup.arrivals)} claims over {config.warmup_seconds:g} s")
    tasks, _ = await _start_on_time(warmup, start, "warm-up")
    last = warmup.arrivals[-1].at if warmup.arrivals else 0.0
    await asyncio.sleep(max(0.0, config.warmup_seconds - last))
    return tasks


async def _pool(stack: FabricStack) -> dict[str, Any]:
    """What the warm pool held when the burst began, and how the warm-up's claims met it."""
    pool = {
        "warm_devices": await _metric(stack, "fabric_dra_warm_devices"),
        "warmup_outcomes": {
            k: await _metric(stack, "fabric_dra_warm_claims_total", outcome=k)
            for k in ("hit", "miss", "cold")
        },
    }
    progress("burst", f"warm-up done, the pool holds {pool['warm_devices']:g} devices: the burst")
    return pool


# -- the claims path: allocated claims, prepared through the kubelet's plugin protocol --------------


class _Allocator:
    """The bench's stand-in for the scheduler's allocation, from the manager's device list (read
    again every second, as a scheduler's informer follows the slices): a claim on a node takes a
    GPU warm there when there is one (what the allocator picks under the node-local publication,
    docs/manager.md), else a free one; a device is never given to two live claims."""

    def __init__(self, manager_url: str) -> None:
        self.url = manager_url
        self.taken: set[str] = set()
        self.warm: dict[str, list[str]] = {}
        self.free: list[str] = []

    async def refresh(self, http: httpx.AsyncClient) -> None:
        devices = (await http.get(f"{self.url}/api/v1/devices")).json()
        warm: dict[str, list[str]] = {}
        free: list[str] = []
        for device in sorted(devices, key=lambda d: str(d["name"])):
            if device["state"] == "warm" and device.get("node"):
                warm.setdefault(str(device["node"]), []).append(str(device["name"]))
            elif device["state"] == "free":
                free.append(str(device["name"]))
        self.warm, self.free = warm, free

    async def follow(self) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    await self.refresh(http)
                await asyncio.sleep(1.0)

    def take(self, node: str) -> str | None:
        for device in [*self.warm.get(node, []), *self.free]:
            if device not in self.taken:
                self.taken.add(device)
                return device
        return None


async def _prepare_like_a_kubelet(
    kubelet: DRAPluginClient, ref: ClaimRef, deadline: float
) -> tuple[str, int]:
    """NodePrepareResources until it succeeds, again after each failure with the kubelet's
    back-off (0.5 s doubling to 10 s) as its pod worker retries a pod; the last error once
    ``deadline`` passed ("" on success), and how many calls failed first."""
    backoff = Backoff(initial=0.5, maximum=10.0, jitter=0)
    failed = 0
    while True:
        try:
            error = (await kubelet.node_prepare_resources([ref]))[ref.uid].error
        except KubeletError as err:
            error = f"NodePrepareResources: {err}"
        if not error:
            return "", failed
        failed += 1
        pause = backoff.next()
        if time.perf_counter() + pause > deadline:
            return error, failed
        await asyncio.sleep(pause)


def _claim_arrivals(
    kube: KubeClient,
    clients: list[DRAPluginClient],
    allocator: _Allocator,
    record: _Claims,
    prefix: str,
    give_up: float,
) -> Callable[[int, Arrival], Coroutine[Any, Any, None]]:
    """What one arrival does on the claims path: the allocation (a GPU from the allocator, the
    claim created allocated and reserved as the scheduler leaves it), the kubelet's prepare on the
    arrival's node, then the hold and the unprepare. ``record`` gets its times and failure;
    ``give_up`` seconds after it arrived a claim not prepared has failed."""
    nodes = [host_name(i) for i in range(len(clients))]

    async def one(index: int, arrival: Arrival) -> None:
        name = f"{prefix}-{index}"
        arrived = record.arrived[name] = time.perf_counter()
        deadline = arrived + give_up
        node = nodes[arrival.node]
        try:
            while (device := allocator.take(node)) is None:
                if time.perf_counter() > deadline:
                    record.failures[name] = "unschedulable: no free GPU within the deadline"
                    return
                await asyncio.sleep(0.2)  # the scheduler tries the pod again when slices change
            (uid,) = await create_claims(kube, [ClaimSpec(name, node, device, namespace=NAMESPACE)])
            allocated = time.perf_counter()
            ref = ClaimRef(NAMESPACE, name, uid)
            error, failed = await _prepare_like_a_kubelet(clients[arrival.node], ref, deadline)
            done = time.perf_counter()
            record.retried += 1 if failed else 0
            record.hops[name] = {
                "allocation (API writes)": allocated - arrived,
                "prepare (kubelet)": done - allocated,
            }
            if error:
                record.failures[name] = error[:300]
                return
            record.ready[name] = done
        finally:
            record.settled(name)
        await asyncio.sleep(arrival.hold)
        await clients[arrival.node].node_unprepare_resources([ref])
        allocator.taken.discard(device)

    return one


async def _measure_claims(stack: FabricStack, config: BurstConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The claims path: claims allocated by the bench (:class:`_Allocator`), each prepared through
    its node's plugin by the kubelet's protocol client; the warm-up as claims too."""
    api, manager = stack.api, stack.manager
    assert api is not None and manager is not None
    clients = [await stack.plugins[host_name(i)].kubelet() for i in range(config.nodes)]
    allocator = _Allocator(manager.address)
    follower = asyncio.create_task(allocator.follow())
    warmup = steady(
        config.warmup_rate,
        config.warmup_seconds,
        config.warmup_hold,
        0.0,
        nodes=config.nodes,
        seed=config.seed,
    )
    names = [f"burst-{i}" for i in range(config.claims)]
    warm_record = _Claims([f"warmup-{i}" for i in range(len(warmup.arrivals))])
    record = _Claims(names)
    give_up = config.seconds + config.settle_seconds
    tasks: list[asyncio.Task[None]] = []
    try:
        async with api.client() as kube:
            await _until_published(kube, 0, 300.0, devices=config.devices)  # no Node objects: no kubelets
            tasks += await _warm_up(
                config, warmup, _claim_arrivals(kube, clients, allocator, warm_record, "warmup", give_up)
            )
            pool = await _pool(stack)
            start = _claim_arrivals(kube, clients, allocator, record, "burst", give_up)
            window, burst_tasks, begin = await _window(stack, config, start, record.wait, names)
            tasks += burst_tasks
    finally:
        for task in [*tasks, follower]:
            task.cancel()
        await asyncio.gather(*tasks, follower, return_exceptions=True)
        for client in clients:
            await client.close()
    for name in names:
        if name not in record.ready and name not in record.failures:
            record.failures[name] = "not prepared within the deadline (the kubelet was still trying)"
    return _figures(config, record, window, begin, pool)


def plot(
    curves: dict[str, Any],
    path: Path,
    *,
    title: str,
    target: float = TARGET_LAST_READY_S,
    kind: str = "claims",
) -> Path:
    """The burst's figure: claims arrived and ready against seconds since the first arrival, the
    manager's attaches in flight, and the target as a vertical line."""
    arrived, ready = PATHS[kind]
    series = [
        Series(f"claims arrived ({arrived})", cumulative(curves["arrived"]), "#7f8c8d", dashed=True),
        Series(f"claims ready ({ready})", cumulative(curves["ready"]), "#2471a3"),
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
        assert stack.stack is not None and stack.api is not None and stack.manager_handle is not None
        progress("burst", f"starting {config.nodes} plugins and the controller ({config.path} path)")
        for i in range(config.nodes):
            stack.plugin(host_name(i))
        stack.stack.controller(stack.manager_handle, stack.api)
        path = _measure_pods if config.path == "pods" else _measure_claims
        figures, curves = asyncio.run(path(stack, config))
    figures["load_average_before"] = [round(v, 2) for v in load]
    figures["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    # the curves, to the millisecond, so that the figure can be drawn again from the JSON (--replot)
    figures["curves"] = {
        "arrived": [round(t, 3) for t in curves["arrived"]],
        "ready": [round(t, 3) for t in curves["ready"]],
        "in_flight": [[round(t, 3), n] for t, n in curves["in_flight"]],
    }
    if plot_to is not None:
        figures["plot"] = str(replot(figures, plot_to))
    return figures


def replot(figures: dict[str, Any], path: Path) -> Path:
    """Draw the figure of a run's figures (what :func:`measure` returned, or its JSON) to ``path``."""
    config = BurstConfig(**figures["config"])
    title = (
        f"{config.claims} claims in {config.seconds:g} s over {config.nodes} nodes, "
        f"{config.devices} GPUs (realistic), warm pool auto, {config.path} path"
    )
    return plot(figures["curves"], path, title=title, kind=config.path)


def run(ctx: BenchContext) -> dict[str, Any]:
    """Section ``burst`` of ``python -m bench`` (only with ``--only``)."""
    config = QUICK if ctx.quick else BurstConfig()
    figures = measure(config, root=ctx.root / "burst", plot_to=ctx.results_dir / "burst.svg")
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
        description="A correlated burst of one-GPU claims, prepared through each node's plugin as the "
        "kubelet calls it (or, with --path pods, as pods through the stand-in scheduler and kubelets), "
        "against the manager (warm pool auto, after a warm-up) and the realistic emulator; prints the "
        f"figures as JSON. Targets: 0 failed, the last claim ready <= {TARGET_LAST_READY_S:g} s after "
        "the first arrival.",
    )
    parser.add_argument(
        "--claims",
        type=_positive(int),
        default=default.claims,
        help="claims in the burst (default %(default)s)",
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
        "--path",
        choices=sorted(PATHS),
        default=default.path,
        help="claims: claims allocated by the bench and prepared through each node's plugin as the "
        "kubelet calls it; pods: pods with a claim template through the stand-in claim controller, "
        "scheduler and kubelets (default %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="the smoke run's sizes: 20 claims, 40 GPUs, 2 nodes"
    )
    parser.add_argument(
        "--plot", type=Path, help="write the figure (SVG: claims arrived and ready over time) here"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep the processes' logs")
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="FIGURES",
        help="run nothing: draw the figure of an earlier run's --json to --plot",
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        if args.plot is None:
            parser.error("--replot needs --plot FILE")
        try:
            replot(json.loads(args.replot.read_text()), args.plot)
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"--replot {args.replot}: not the figures of a burst run ({err})")
        return 0
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
            path=args.path,
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
