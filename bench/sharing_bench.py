"""GPU partitions and CXL memory shares through the fabric manager (issues 35, 36), real
processes throughout: ``fabric-dra emulator serve`` on a generated topology of 10 hosts, 20 GPUs
(H100s and A100s with their partition tables, L40S without) and two 256 GiB CXL memory pools,
and ``fabric-dra manager serve`` on it. The bench plays the scheduler: it picks placements and
pool shares from its own view, sends them to the manager through its REST API
(:class:`manager_api.client.ManagerClient`) and checks every answer against the fabric.

1. **Partitions, latency and density.** Seven ``1g.10gb`` claims (each its own claim) on one H100,
   one after another on one node, then released in random order; repeated. The first pays the
   fabric bind; the other six find the GPU bound to their node (no fabric write). Attach is the
   REST call from sending to ``attached`` (the manager's bind confirmed from the fabric); the
   node's own part (the plugin making the partition, CDI) is not in it. On the ``instant`` and
   the ``realistic`` profiles.
2. **1,000 random whole/partition claims** across 10 nodes: random profiles, random nodes, held a
   random time (so released in random order), at most ``_CONCURRENCY`` at once. The bench's
   allocator packs a node's partitioned GPUs first (first placement that fits, as the allocator
   tries devices in order), else opens a free GPU. One claim in twenty is also sent a *stale*
   placement (one the bench knows is held, or a GPU bound to another node): the manager must
   refuse it. Checked while running (every answer and a sampler every 100 ms): no two held
   placements of a GPU ``conflict`` (:mod:`manager_api.partitions`), no GPU bound to two nodes or
   serving partitions on a node it is not bound to (the manager's inventory against the emulator's
   binding table); after all are released, nothing left bound, held or in flight. Fragmentation:
   requests whose node's partitioned GPUs had the slices and counters free in total but no valid
   placement for the profile (lost to layout).
3. **Memory shares.** Attach (chunk created in the pool's MemoryDomain, connected to the node's
   host, both confirmed) and release p50/p99, by size, on both profiles; 1,000 random shares
   (log-uniform 64 MiB … 64 GiB, rounded up by the pool's grid as the allocator's request policy
   does) on 10 nodes and 2 pools, held a random time: over-commit checked on every answer and by
   the sampler (the manager's shares and the emulator's ``Pools`` never above the pool's size, the
   emulator's chunks never more than the manager's shares), utilisation per pool (time-weighted
   mean and peak of the bytes held), rounding loss (bytes the grid added). The pools' grid is
   DMTF's public-cxl mockup's, 64 MiB minimum and increment (the generator's default is 1 GiB).
   A **crash-point sweep**: for each of the manager's points an attach or a release of a share
   reaches, the manager is started armed, killed there, restarted, the interrupted call retried as
   the plugin retries it, the share released and its claim deleted; then the emulator's chunks
   that no share holds are counted (orphans), after the orphan reconciler's grace (1 s here).

``python -m bench --only sharing [--quick]``; ``python -m bench.sharing_bench [--quick]
[--stand-in]`` prints the figures as JSON. ``--stand-in`` runs parts 1-3 against the manager
stand-in (:mod:`fabric_dra_testbed.standins`) instead: figures of the bench's own logic, labelled
so, never of fabric-dra (the stand-in binds nothing on a fabric, so no fabric check applies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    BenchContext,
    check,
    cpu_seconds,
    generate_topology,
    host_name,
    progress,
    summary_ms,
)
from fabric_dra_testbed.stack import ApiServer, Emulator, Manager, Stack
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory, make_pool
from manager_api.client import ManagerClient
from manager_api.errors import FabricError
from manager_api.models import Attachment, AttachmentState, Device
from manager_api.partitions import (
    BUILTIN_TABLES,
    PartitionDevice,
    PartitionTable,
    conflict,
    parse_partition,
    partition_devices,
)
from plumbing.crashpoints import POINTS
from plumbing.kube import KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS

__all__ = ["measure", "run"]

MIB = 1 << 20
GIB = 1 << 30
_NODES = 10
_GPUS = 20
_POOLS = 2
#: DMTF's public-cxl mockup: MinMemoryChunkSizeMiB 64, MemoryChunkIncrementMiB 64
_GRID_MIB = 64
_MAX_CHUNKS = 512
_CONCURRENCY = 16
_STALE_EVERY = 20
_SAMPLE_SECONDS = 0.1
#: a random claim is held up to this long (uniform)
_HOLD_MAX = 0.2
_DRIVER = "fabric-dra.io"


def _topology(path: Path) -> Path:
    """10 hosts, 20 GPUs (partitionable H100s and A100s, L40S), two 256 GiB pools on DMTF's grid."""
    generate_topology(path, hosts=_NODES, gpus=_GPUS, cxl_pools=_POOLS, partitionable=True)
    document = yaml.safe_load(path.read_text())
    for switch in document["cxl"]["switches"]:
        for device in switch["devices"]:
            if "pool" in device:
                device["pool"] = {
                    "minChunkMiB": _GRID_MIB,
                    "incrementMiB": _GRID_MIB,
                    "maxChunks": _MAX_CHUNKS,
                }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _standin_inventory(topology: Path) -> InventoryServer:
    """The manager stand-in over the topology's GPUs and pools (``--stand-in`` only)."""
    document = yaml.safe_load(topology.read_text())
    tables = {k: m.get("partitions") for k, m in document["models"].items()}
    devices: list[Device] = []
    for switch in document["pcie"]["switches"]:
        for d in switch["devices"]:
            table = tables.get(d["model"])
            devices.append(make_device(d["id"], partition_table=BUILTIN_TABLES[table] if table else None))
    for switch in document["cxl"]["switches"]:
        for d in switch["devices"]:
            grid = d["pool"]["incrementMiB"] * MIB
            devices.append(make_pool(d["id"], 256 * GIB, min_chunk_bytes=grid, increment_bytes=grid))
    nodes = [host_name(i) for i in range(_NODES)]
    return InventoryServer(make_inventory(devices, pools={"fabric-pcie": nodes, "fabric-cxl": nodes})).start()


# -- talking to the manager and the fabric ---------------------------------------------------------


@dataclass
class Target:
    """The manager under test, and the emulator behind it (None for the stand-in)."""

    url: str
    emulator: Emulator | None
    label: str
    #: role → process id, for CPU figures (none for the stand-in: it runs in this process)
    pids: dict[str, int] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        """CPU seconds each role has used so far."""
        return {role: cpu_seconds(pid) for role, pid in self.pids.items()}

    async def fabric(self) -> dict[str, Any] | None:
        """The emulator's binding table (``Oem/FabricDRA/Bindings``), or None for the stand-in."""
        if self.emulator is None:
            return None
        async with self.emulator.async_client() as http:
            response = await http.get("/redfish/v1/Oem/FabricDRA/Bindings")
            response.raise_for_status()
            table: dict[str, Any] = response.json()
            return table


async def _attach(client: ManagerClient, device: str, node: str, claim: str, **share: Any) -> Attachment:
    """Attach and ask again while the manager answers ``attaching`` (as the plugin does)."""
    while True:
        answer = await client.attach(device, node, claim, wait_seconds=30, **share)
        if answer.state is not AttachmentState.ATTACHING:
            return answer


async def _attach_retrying(
    client: ManagerClient, device: str, node: str, claim: str, refusals: list[str], **share: Any
) -> float:
    """Attach, asking again after a refusal as the kubelet asks the plugin again (every 0.25 s, for
    at most 60 s; each refusal is appended to ``refusals``). Returns the seconds of the attempt
    that was accepted; raises the last refusal after 60 s."""
    first_try = time.perf_counter()
    while True:
        started = time.perf_counter()
        try:
            await _attach(client, device, node, claim, **share)
            return _timed(started)
        except FabricError as err:
            refusals.append(f"{type(err).__name__}: {err}")
            if time.perf_counter() - first_try > 60:
                raise
            await asyncio.sleep(0.25)


async def _detach(
    client: ManagerClient,
    device: str,
    node: str,
    claim: str,
    share_id: str | None = None,
    *,
    failures: list[str] | None = None,
) -> None:
    """Detach; a failure is asked again, as the kubelet asks the plugin's unprepare again (every
    0.25 s, for at most 60 s), and appended to ``failures``; raised after 60 s or without them."""
    first_try = time.perf_counter()
    while True:
        try:
            answer = await client.detach(device, node, claim, wait_seconds=30, share_id=share_id)
        except FabricError as err:
            if failures is None or time.perf_counter() - first_try > 60:
                raise
            failures.append(f"{type(err).__name__}: {err}")
            await asyncio.sleep(0.25)
            continue
        if answer.state is not AttachmentState.DETACHING:
            return


def _timed(started: float) -> float:
    return time.perf_counter() - started


def _tables(devices: list[Device]) -> dict[str, PartitionTable]:
    return {d.name: d.partition_table for d in devices if d.partition_table is not None}


async def _probe(target: Target, nodes: list[str]) -> dict[str, str | None]:
    """Whether the manager binds a partition and a share at all: None, or why not (its answer)."""
    out: dict[str, str | None] = {}
    async with ManagerClient(target.url, timeout=60) as client:
        devices = (await client.inventory()).devices
        tables = _tables(devices)
        gpu = next((g for g, t in sorted(tables.items()) if t.name == "h100-80gb"), None)
        if gpu is None:
            out["partitions"] = "the manager's inventory shows no GPU with the h100-80gb partition table"
        else:
            first = partition_devices(gpu, tables[gpu])[0]
            out["partitions"] = await _try(client, first.name, nodes[0], {})
        pool = next((d for d in devices if d.memory_pool is not None), None)
        if pool is None:
            out["shares"] = "the manager's inventory shows no memory pool (no device with memoryPool)"
        else:
            share = {"share_id": str(uuid.uuid4()), "memory_bytes": pool.memory_pool.min_chunk_bytes}  # type: ignore[union-attr]
            out["shares"] = await _try(client, pool.name, nodes[0], share)
    return out


async def _try(client: ManagerClient, device: str, node: str, share: dict[str, Any]) -> str | None:
    claim = str(uuid.uuid4())
    try:
        await _attach(client, device, node, claim, **share)
    except FabricError as err:
        return f"attach {device} to {node}: {type(err).__name__}: {err}"
    await _detach(client, device, node, claim, share.get("share_id"))
    return None


# -- 1. partitions: density and latency -------------------------------------------------------------


async def _partition_latency(target: Target, nodes: list[str], rounds: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    first: list[float] = []
    bound: list[float] = []
    release: list[float] = []
    release_last: list[float] = []
    density: list[int] = []
    refusals: list[str] = []
    detach_failures: list[str] = []
    double = 0
    async with ManagerClient(target.url, timeout=60) as client:
        tables = _tables((await client.inventory()).devices)
        gpu = next(g for g, t in sorted(tables.items()) if t.name == "h100-80gb")
        placements = [p for p in partition_devices(gpu, tables[gpu]) if p.profile.name == "1g.10gb"]
        for r in range(rounds):
            node = nodes[r % len(nodes)]
            held: list[tuple[str, str]] = []
            for index, placement in enumerate(placements):
                claim = str(uuid.uuid4())
                started = time.perf_counter()
                try:
                    await _attach(client, placement.name, node, claim)
                except FabricError as err:
                    refusals.append(f"{placement.name} on {node}: {type(err).__name__}: {err}")
                    continue
                (first if index == 0 else bound).append(_timed(started))
                held.append((placement.name, claim))
            density.append(len(held))
            fabric = await target.fabric()
            if fabric is not None:
                hosts = {b["Host"] for b in fabric["Bindings"] if b["Target"] == gpu}
                double += hosts != {node}
            rng.shuffle(held)
            for index, (name, claim) in enumerate(held):
                started = time.perf_counter()
                await _detach(client, name, node, claim, failures=detach_failures)
                (release_last if index == len(held) - 1 else release).append(_timed(started))
    return {
        "gpu": gpu,
        "placements": len(placements),
        "rounds": rounds,
        "held_at_once_min": min(density),
        "refused": len(refusals),
        "refusals_first": refusals[:3],
        "detach_failed_then_asked_again": len(detach_failures),
        "detach_failures_first": sorted(set(detach_failures))[:3],
        "gpu_not_bound_to_exactly_its_node": double if target.emulator is not None else None,
        "first_partition": summary_ms(first),
        "partition_gpu_already_bound": summary_ms(bound),
        "release_partition": summary_ms(release),
        "release_last_partition": summary_ms(release_last),
    }


# -- 2. random whole/partition claims ---------------------------------------------------------------


@dataclass
class _Gpu:
    name: str
    table: PartitionTable | None
    node: str | None = None
    whole: str | None = None
    held: dict[str, PartitionDevice] = field(default_factory=dict)  # claim → placement
    busy: int = 0  # attaches/detaches in flight that may change its binding


@dataclass
class _PartitionBook:
    """The bench's allocator (what the scheduler would do) and its tally."""

    gpus: dict[str, _Gpu]
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    lost_to_layout: int = 0
    waited: int = 0
    whole: int = 0
    partitions: int = 0
    opened: int = 0

    def pick(
        self, node: str, table: str | None, profile: str | None, *, first: bool
    ) -> tuple[_Gpu, PartitionDevice | None] | None:
        """A GPU (and placement) for the claim, or None: wait for a release. ``first``: the
        claim's first try, the one whose layout loss is counted."""
        if profile is None:
            free = [
                g
                for g in self.gpus.values()
                if g.node is None and not g.held and g.whole is None and not g.busy
            ]
            return (free[0], None) if free else None
        mine = [
            g for g in self.gpus.values() if g.node == node and g.held and g.table and g.table.name == table
        ]
        short = False
        for gpu in mine:
            assert gpu.table is not None
            held = list(gpu.held.values())
            options = [p for p in partition_devices(gpu.name, gpu.table) if p.profile.name == profile]
            fit = next((p for p in options if conflict(p, held) is None), None)
            if fit is not None:
                return gpu, fit
            short = short or _fits_by_total(options[0], held)
        self.lost_to_layout += short and first
        free = [
            g
            for g in self.gpus.values()
            if g.table
            and g.table.name == table
            and g.node is None
            and not g.held
            and g.whole is None
            and not g.busy
        ]
        if not free:
            return None
        gpu = free[0]
        assert gpu.table is not None
        placement = next(p for p in partition_devices(gpu.name, gpu.table) if p.profile.name == profile)
        self.opened += 1
        return gpu, placement


def _fits_by_total(candidate: PartitionDevice, held: list[PartitionDevice]) -> bool:
    """Whether the GPU has the slices, multiprocessors and memory ``candidate`` takes, counted in
    total (ignoring where they lie)."""
    table = candidate.table
    slices = table.memory_slices - sum(h.profile.memory_slices for h in held)
    sms = table.multiprocessors - sum(h.profile.multiprocessors for h in held)
    memory = int(table.memory_bytes) - sum(int(h.profile.memory_bytes) for h in held)
    p = candidate.profile
    return slices >= p.memory_slices and sms >= p.multiprocessors and memory >= int(p.memory_bytes)


@dataclass
class _Violations:
    over_commit: int = 0
    two_nodes: int = 0
    wrong_node: int = 0
    stale_accepted: int = 0
    stale_refused: int = 0
    #: refusals asked again after, by error code
    refused: dict[str, int] = field(default_factory=dict)
    #: claims still refused after 60 s of asking again (given up)
    given_up: int = 0
    #: failed detaches, each asked again
    detach_failures: list[str] = field(default_factory=list)
    samples: int = 0
    first: list[str] = field(default_factory=list)

    def asked_again_and_stale(self) -> dict[str, Any]:
        """The report's figures of refusals asked again, stale requests and samples (both runs)."""
        return {
            "manager_refused_then_asked_again": self.refused,
            "given_up_after_60_s": self.given_up,
            "detach_failed_then_asked_again": len(self.detach_failures),
            "detach_failures_first": sorted(set(self.detach_failures))[:3],
            "stale_sent": self.stale_accepted + self.stale_refused,
            "stale_refused": self.stale_refused,
            "stale_accepted": self.stale_accepted,
            "samples": self.samples,
        }

    def count(self, refusals: list[str]) -> None:
        """Refusals the bench asked again after (as the kubelet would), by their first words."""
        for what in refusals:
            key = what.split(":", 1)[0]
            self.refused[key] = self.refused.get(key, 0) + 1
            self.note(what)

    def note(self, what: str) -> None:
        if len(self.first) < 5:
            self.first.append(what)


async def _check_partitions(target: Target, client: ManagerClient, seen: _Violations) -> None:
    """One sample: the manager's holders never conflict, one GPU one node, against the fabric."""
    devices = (await client.inventory()).devices
    fabric = await target.fabric()
    tables = _tables(devices)
    seen.samples += 1
    for gpu in devices:
        if not gpu.partitions:
            continue
        held = [parse_partition(h.partition, tables) for h in gpu.partitions]
        placed = [p for p in held if p is not None]
        for i, p in enumerate(placed):
            why = conflict(p, placed[:i])
            if why is not None:
                seen.over_commit += 1
                seen.note(f"manager holds conflicting placements: {why}")
        if len({h.node for h in gpu.partitions}) > 1 or (
            gpu.node and {h.node for h in gpu.partitions} != {gpu.node}
        ):
            seen.two_nodes += 1
            seen.note(
                f"{gpu.name} serves partitions on {sorted({h.node for h in gpu.partitions})}, "
                f"bound to {gpu.node}"
            )
    if fabric is None:
        return
    hosts: dict[str, set[str]] = {}
    for b in fabric["Bindings"]:
        hosts.setdefault(b["Target"], set()).add(b["Host"])
    for name, on in hosts.items():
        if len(on) > 1:
            seen.two_nodes += 1
            seen.note(f"the emulator has {name} bound to {sorted(on)}")
    for gpu in devices:
        if gpu.partitions and gpu.name in hosts and hosts[gpu.name] != {h.node for h in gpu.partitions}:
            seen.wrong_node += 1
            seen.note(
                f"{gpu.name} bound to {sorted(hosts[gpu.name])} serves {[h.node for h in gpu.partitions]}"
            )


async def _sampler(check_once: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        await check_once()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _SAMPLE_SECONDS)


async def _random_partitions(
    target: Target, nodes: list[str], claims: int, seed: int, hold_max: float
) -> dict[str, Any]:
    rng = random.Random(seed)
    seen = _Violations()
    async with ManagerClient(target.url, timeout=120) as client:
        devices = [d for d in (await client.inventory()).devices if d.type == "gpu"]
        book = _PartitionBook({d.name: _Gpu(d.name, d.partition_table) for d in devices})
        tables = sorted({d.partition_table.name for d in devices if d.partition_table}, key=str)
        profiles = {t: [p.name for p in BUILTIN_TABLES[t].profiles] for t in tables}
        gate = asyncio.Semaphore(_CONCURRENCY)
        attach_s: list[float] = []

        async def one(index: int) -> None:
            node = rng.choice(nodes)
            whole = rng.random() < 0.2
            table = None if whole else rng.choice(tables)
            profile = None if table is None else rng.choice(profiles[table])
            hold = rng.uniform(0, hold_max)
            claim = str(uuid.uuid4())
            async with gate:
                async with book.changed:
                    tries = 0
                    while (picked := book.pick(node, table, profile, first=tries == 0)) is None:
                        tries += 1
                        book.waited += tries == 1
                        await book.changed.wait()
                    gpu, placement = picked
                    if placement is None:
                        gpu.whole, gpu.node = claim, node
                        book.whole += 1
                    else:
                        gpu.held[claim] = placement
                        gpu.node = node
                        book.partitions += 1
                    gpu.busy += 1
                device = gpu.name if placement is None else placement.name
                refusals: list[str] = []
                try:
                    attach_s.append(await _attach_retrying(client, device, node, claim, refusals))
                except FabricError as err:
                    seen.note(f"refused {device} on {node} for 60 s: {err}")
                    seen.given_up += 1
                    async with book.changed:
                        _forget(gpu, claim)
                        book.changed.notify_all()
                    return
                finally:
                    gpu.busy -= 1
                    seen.count(refusals)
                if index % _STALE_EVERY == 0:
                    await _stale_partition(client, book, gpu, placement, nodes, node, seen)
                await asyncio.sleep(hold)
                async with book.changed:
                    gpu.busy += 1
                await _detach(client, device, node, claim, failures=seen.detach_failures)
                async with book.changed:
                    gpu.busy -= 1
                    _forget(gpu, claim)
                    book.changed.notify_all()

        stop = asyncio.Event()
        sampler = asyncio.create_task(_sampler(lambda: _check_partitions(target, client, seen), stop))
        started, cpu = time.perf_counter(), target.cpu()
        await asyncio.gather(*(one(i) for i in range(claims)))
        seconds = _timed(started)
        cpu = {role: round(used - cpu[role], 1) for role, used in target.cpu().items()}
        stop.set()
        await sampler
        await _check_partitions(target, client, seen)
        leaks = await _leaks(target, client)
    return {
        "claims": claims,
        "whole": book.whole,
        "partitions": book.partitions,
        "gpus_opened_for_partitions": book.opened,
        "concurrency": _CONCURRENCY,
        "seconds": round(seconds, 1),
        "cpu_seconds": cpu,
        "attach": summary_ms(attach_s),
        "waited_for_a_release": book.waited,
        "lost_to_layout": book.lost_to_layout,
        "lost_to_layout_percent": round(100 * book.lost_to_layout / max(1, book.partitions), 2),
        **seen.asked_again_and_stale(),
        "counter_over_commit": seen.over_commit + seen.stale_accepted,
        "gpus_bound_to_two_nodes": seen.two_nodes + seen.wrong_node,
        "leaks_after_release": leaks,
        "first_problems": seen.first,
    }


def _forget(gpu: _Gpu, claim: str) -> None:
    gpu.held.pop(claim, None)
    if gpu.whole == claim:
        gpu.whole = None
    if gpu.whole is None and not gpu.held:
        gpu.node = None


async def _stale_partition(
    client: ManagerClient,
    book: _PartitionBook,
    gpu: _Gpu,
    placement: PartitionDevice | None,
    nodes: list[str],
    node: str,
    seen: _Violations,
) -> None:
    """A request a stale scheduler could send: the manager must refuse it (and nothing changes)."""
    other = next(n for n in nodes if n != node)
    if placement is None:
        device, on = gpu.name, other  # a bound whole GPU, for another node
    else:
        device, on = placement.name, node  # the very placement, held, for another claim
    claim = str(uuid.uuid4())
    try:
        await _attach(client, device, on, claim)
    except FabricError:
        seen.stale_refused += 1
        return
    seen.stale_accepted += 1
    seen.note(f"the manager accepted {device} on {on} while the bench's claim held it")
    await _detach(client, device, on, claim)


async def _leaks(target: Target, client: ManagerClient) -> dict[str, int]:
    """What is left after every claim was released: held or bound in the manager, bound, carved
    or in flight on the fabric."""
    devices = (await client.inventory()).devices
    out = {
        "manager_devices_not_free": sum(d.state != "free" for d in devices),
        "manager_partition_holders": sum(len(d.partitions) for d in devices),
        "manager_shares": sum(len(d.memory_pool.shares) for d in devices if d.memory_pool),
    }
    fabric = await target.fabric()
    if fabric is not None:
        out["fabric_bindings"] = len(fabric["Bindings"])
        out["fabric_in_flight"] = len(fabric.get("InFlight", []))
        out["fabric_chunks"] = sum(len(p.get("Chunks", [])) for p in fabric.get("Pools", []))
    return out


# -- 3. memory shares -------------------------------------------------------------------------------


def _rounded(asked: int, min_chunk: int, increment: int) -> int:
    """Up to the pool's request policy (validRange min, step), as the allocator rounds."""
    if asked <= min_chunk:
        return min_chunk
    return min_chunk + math.ceil((asked - min_chunk) / increment) * increment


async def _share_latency(target: Target, nodes: list[str], rounds: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    sizes = {"1GiB": GIB, "16GiB": 16 * GIB, "64GiB": 64 * GIB}
    attach: dict[str, list[float]] = {k: [] for k in sizes}
    release: dict[str, list[float]] = {k: [] for k in sizes}
    refusals: list[str] = []
    detach_failures: list[str] = []
    until_accepted: list[float] = []
    async with ManagerClient(target.url, timeout=120) as client:
        pool = next(d for d in (await client.inventory()).devices if d.memory_pool is not None)
        for _ in range(rounds):
            for label, size in sizes.items():
                node, claim, share = rng.choice(nodes), str(uuid.uuid4()), str(uuid.uuid4())
                first_try, before = time.perf_counter(), len(refusals)
                attach[label].append(
                    await _attach_retrying(
                        client, pool.name, node, claim, refusals, share_id=share, memory_bytes=size
                    )
                )
                if len(refusals) > before:  # refused first: the time until one was accepted
                    until_accepted.append(_timed(first_try))
                started = time.perf_counter()
                await _detach(client, pool.name, node, claim, share, failures=detach_failures)
                release[label].append(_timed(started))
    every_attach = [s for v in attach.values() for s in v]
    every_release = [s for v in release.values() for s in v]
    return {
        "pool": pool.name,
        "rounds": rounds,
        "refused_then_retried": len(refusals),
        "refusals_first": sorted(set(refusals))[:3],
        "attaches_refused_first": len(until_accepted),
        "detach_failed_then_asked_again": len(detach_failures),
        "detach_failures_first": sorted(set(detach_failures))[:3],
        "first_try_to_accepted": summary_ms(until_accepted),
        "attach": summary_ms(every_attach),
        "release": summary_ms(every_release),
        "attach_by_size": {k: summary_ms(v) for k, v in attach.items()},
        "release_by_size": {k: summary_ms(v) for k, v in release.items()},
    }


@dataclass
class _Pool:
    name: str
    size: int
    min_chunk: int
    increment: int
    held: int = 0
    #: bytes of shares attached and not being released: the manager holds at least these
    settled: int = 0
    peak: int = 0
    #: ∫ held dt, for the time-weighted mean
    area: float = 0.0
    since: float = 0.0

    def change(self, delta: int, now: float) -> None:
        self.area += self.held * (now - self.since)
        self.since = now
        self.held += delta
        self.peak = max(self.peak, self.held)


async def _check_shares(target: Target, client: ManagerClient, seen: _Violations) -> None:
    """One sample: no pool's shares above its size, in the manager and on the fabric, and no chunk
    on the fabric beyond the manager's shares."""
    devices = (await client.inventory()).devices
    fabric = await target.fabric()
    seen.samples += 1
    shares: dict[str, int] = {}
    for d in devices:
        if d.memory_pool is None:
            continue
        used = d.memory_pool.outside_bytes + sum(s.memory_bytes for s in d.memory_pool.shares)
        shares[d.name] = len(d.memory_pool.shares)
        if used > d.memory_pool.size_bytes:
            seen.over_commit += 1
            seen.note(f"the manager's shares of {d.name}: {used} of {d.memory_pool.size_bytes} bytes")
    if fabric is None:
        return
    for p in fabric.get("Pools", []):
        if p["UsedMiB"] > p["SizeMiB"]:
            seen.over_commit += 1
            seen.note(f"the emulator's {p['Device']}: {p['UsedMiB']} of {p['SizeMiB']} MiB carved")


async def _random_shares(
    target: Target, nodes: list[str], claims: int, seed: int, hold_max: float
) -> dict[str, Any]:
    rng = random.Random(seed)
    seen = _Violations()
    async with ManagerClient(target.url, timeout=120) as client:
        pools = {
            d.name: _Pool(
                d.name,
                d.memory_pool.size_bytes - d.memory_pool.outside_bytes,
                d.memory_pool.min_chunk_bytes,
                d.memory_pool.increment_bytes,
            )
            for d in (await client.inventory()).devices
            if d.memory_pool is not None
        }
        changed = asyncio.Condition()
        gate = asyncio.Semaphore(_CONCURRENCY)
        asked_total, rounded_total, waited = 0, 0, 0
        attach_s: list[float] = []
        low, high = math.log(64 * MIB), math.log(64 * GIB)
        origin = time.perf_counter()
        for p in pools.values():
            p.since = origin

        async def one(index: int) -> None:
            nonlocal asked_total, rounded_total, waited
            node = rng.choice(nodes)
            asked = int(math.exp(rng.uniform(low, high)))
            order = rng.sample(sorted(pools), len(pools))
            hold = rng.uniform(0, hold_max)
            claim, share = str(uuid.uuid4()), str(uuid.uuid4())
            async with gate:
                async with changed:
                    while True:
                        pool = next(
                            (
                                pools[n]
                                for n in order
                                if pools[n].held + _rounded(asked, pools[n].min_chunk, pools[n].increment)
                                <= pools[n].size
                            ),
                            None,
                        )
                        if pool is not None:
                            break
                        waited += 1
                        await changed.wait()
                    size = _rounded(asked, pool.min_chunk, pool.increment)
                    pool.change(size, time.perf_counter())
                    asked_total += asked
                    rounded_total += size
                refusals: list[str] = []
                try:
                    attach_s.append(
                        await _attach_retrying(
                            client, pool.name, node, claim, refusals, share_id=share, memory_bytes=size
                        )
                    )
                except FabricError as err:
                    seen.note(f"refused {size} bytes of {pool.name} on {node} for 60 s: {err}")
                    seen.given_up += 1
                    seen.count(refusals)
                    async with changed:
                        pool.change(-size, time.perf_counter())
                        changed.notify_all()
                    return
                seen.count(refusals)
                async with changed:
                    pool.settled += size
                    if index % _STALE_EVERY == 0:
                        await _stale_share(client, pool, nodes, seen)
                await asyncio.sleep(hold)
                async with changed:
                    pool.settled -= size
                await _detach(client, pool.name, node, claim, share, failures=seen.detach_failures)
                async with changed:
                    pool.change(-size, time.perf_counter())
                    changed.notify_all()

        stop = asyncio.Event()
        sampler = asyncio.create_task(_sampler(lambda: _check_shares(target, client, seen), stop))
        started, cpu = time.perf_counter(), target.cpu()
        await asyncio.gather(*(one(i) for i in range(claims)))
        seconds = _timed(started)
        cpu = {role: round(used - cpu[role], 1) for role, used in target.cpu().items()}
        stop.set()
        await sampler
        end = time.perf_counter()
        for p in pools.values():
            p.change(0, end)
        await _check_shares(target, client, seen)
        leaks = await _leaks(target, client)
    return {
        "claims": claims,
        "concurrency": _CONCURRENCY,
        "grid_mib": {n: p.increment // MIB for n, p in pools.items()},
        "seconds": round(seconds, 1),
        "cpu_seconds": cpu,
        "attach": summary_ms(attach_s),
        "waited_for_room": waited,
        **seen.asked_again_and_stale(),
        "over_commit": seen.over_commit + seen.stale_accepted,
        "utilisation_percent": {
            n: {
                "mean": round(100 * p.area / (end - origin) / p.size, 1),
                "peak": round(100 * p.peak / p.size, 1),
            }
            for n, p in pools.items()
        },
        "asked_gib": round(asked_total / GIB, 1),
        "rounding_loss_gib": round((rounded_total - asked_total) / GIB, 2),
        "rounding_loss_percent": round(100 * (rounded_total - asked_total) / max(1, rounded_total), 2),
        "leaks_after_release": leaks,
        "first_problems": seen.first,
    }


async def _stale_share(client: ManagerClient, pool: _Pool, nodes: list[str], seen: _Violations) -> None:
    """A share a stale scheduler could send: more than the pool has free — the manager must refuse.
    Called with the book locked: no share of the bench starts its release meanwhile, so the
    manager holds at least ``pool.settled``."""
    free = pool.size - pool.settled
    size = _rounded(free + 1, pool.min_chunk, pool.increment)
    if size > pool.size:
        return
    claim, share = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        await _attach(client, pool.name, nodes[0], claim, share_id=share, memory_bytes=size)
    except FabricError:
        seen.stale_refused += 1
        return
    seen.stale_accepted += 1
    seen.note(f"the manager accepted {size} bytes of {pool.name} with {free} free by the bench's count")
    await _detach(client, pool.name, nodes[0], claim, share)


# -- 3b. the crash-point sweep ----------------------------------------------------------------------


def _sweep_points() -> list[str]:
    """The manager's points a share's attach or release reaches: its sharing points, else the
    attach and detach points every binding passes."""
    own = [
        p for p in POINTS if p.startswith("manager.") and any(k in p for k in ("share", "chunk", "memory"))
    ]
    generic = [p for p in POINTS if p.startswith(("manager.attach.", "manager.detach."))]
    return own + [p for p in generic if p not in own]


async def _claim(kube: KubeClient, pool: Device, node: str, size: int) -> tuple[str, str, str]:
    """A claim allocated one share of ``pool`` on ``node`` as the scheduler leaves it:
    (name, uid, shareID)."""
    name, share = f"share-{uuid.uuid4().hex[:10]}", str(uuid.uuid4())
    request = {
        "name": "memory",
        "exactly": {
            "deviceClassName": "fabric-dra-cxl-memory",
            "capacity": {"requests": {"memory": str(size)}},
        },
    }
    created = await kube.create(
        RESOURCE_CLAIMS,
        {"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {"requests": [request]}}},
        "default",
    )
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "memory",
                        "driver": _DRIVER,
                        "pool": pool.pool,
                        "device": pool.name,
                        "shareID": share,
                        "consumedCapacity": {"memory": str(size)},
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
    }
    updated = await kube.replace(RESOURCE_CLAIMS, created, subresource="status")
    return name, str(updated["metadata"]["uid"]), share


def _chunk_targets(devices: list[Device]) -> set[str]:
    """The emulator's names (``<chassis>-chunk<k>``) of the chunks the manager's shares hold,
    from their URIs (``/redfish/v1/Chassis/<chassis>/MemoryDomains/0/MemoryChunks/<k>``)."""
    out = set()
    for d in devices:
        for s in d.memory_pool.shares if d.memory_pool else []:
            parts = (s.chunk or "").rstrip("/").split("/")
            if "Chassis" in parts and parts.index("Chassis") + 1 < len(parts):
                out.add(f"{parts[parts.index('Chassis') + 1]}-chunk{parts[-1]}")
    return out


async def _sweep(
    manager: Manager, emulator: Emulator, api: ApiServer, points: list[str], node: str
) -> dict[str, Any]:
    target = Target(manager.url, emulator, "manager")
    cases: dict[str, dict[str, Any]] = {}
    for point in points:
        progress("sharing", f"crash sweep: {point}")
        try:
            cases[point] = await _sweep_case(manager, target, api, point, node)
        except (FabricError, httpx.HTTPError, StopIteration) as err:
            cases[point] = {"error": f"{type(err).__name__}: {err}", "orphan_chunks": -1}
    return cases


async def _sweep_case(
    manager: Manager, target: Target, api: ApiServer, point: str, node: str
) -> dict[str, Any]:
    """One point: armed, crashed there (if the call reaches it), restarted, the call retried, the
    share released and its claim deleted; then the chunks no share holds."""
    manager.start(crash_at=[point], kill_previous=True)
    size = 4 * GIB
    async with ManagerClient(manager.url, timeout=60) as client, api.client() as kube:
        pool = next(d for d in (await client.inventory()).devices if d.memory_pool is not None)
        name, uid, share = await _claim(kube, pool, node, size)
        detaching = point.startswith("manager.detach.") or "release" in point or "delete" in point
        # Until the manager's informer has the claim it refuses: asked again, as the kubelet would.
        armed: list[str] = []
        if detaching:
            await _attach_retrying(client, pool.name, node, uid, armed, share_id=share, memory_bytes=size)
        call = (
            _detach(client, pool.name, node, uid, share, failures=armed)
            if detaching
            else _attach_retrying(client, pool.name, node, uid, armed, share_id=share, memory_bytes=size)
        )
        task: asyncio.Future[Any] = asyncio.ensure_future(call)
        deadline = time.monotonic() + 30
        while manager.role.alive() and time.monotonic() < deadline:
            done, _ = await asyncio.wait({task}, timeout=0.05)
            if done:
                break
        crashed = not manager.role.alive()
        outcome = "killed at the point" if crashed else "completed without reaching the point"
        if task.done() and task.exception() is not None:
            outcome = f"failed: {task.exception()}"
        elif not task.done() and not crashed:
            outcome = "still running after 30 s"
        with contextlib.suppress(FabricError, asyncio.CancelledError):
            task.cancel()
            await task
    manager.start()  # unarmed: the crash is over
    started = time.perf_counter()
    async with ManagerClient(manager.url, timeout=60) as client, api.client() as kube:
        refusals: list[str] = []
        if not detaching:  # the kubelet asks the plugin again, the plugin the manager
            await _attach_retrying(client, pool.name, node, uid, refusals, share_id=share, memory_bytes=size)
        await _detach(client, pool.name, node, uid, share)
        await kube.delete(RESOURCE_CLAIMS, name, "default")
        orphans, held, chunks = -1, set(), set()
        while time.perf_counter() - started < 30:
            held = _chunk_targets((await client.inventory()).devices)
            fabric = await target.fabric()
            chunks = {c["Target"] for p in (fabric or {}).get("Pools", []) for c in p.get("Chunks", [])}
            orphans = len(chunks - held)
            if not chunks and not (fabric or {}).get("InFlight"):
                break
            await asyncio.sleep(0.25)
    return {
        "crashed": crashed,
        "armed_call": outcome,
        "refused_while_armed": sorted(set(armed))[:2],
        "refused_after_restart": sorted(set(refusals))[:2],
        "orphan_chunks": orphans,
        "shares_left": len(held),
        "chunks_left": len(chunks),
        "converged_s": round(_timed(started), 2),
    }


# -- running it -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _real(
    root: Path, topology: Path, latency: str, *, kube: bool = False, args: tuple[str, ...] = ()
) -> Iterator[tuple[Target, Manager, Emulator, ApiServer | None]]:
    with Stack(root) as stack:
        api = stack.apiserver() if kube else None
        emulator = stack.emulator(topology=topology, latency=latency, auth=False)
        if api is not None:
            # with API access hosts map to Node objects; the API test server has none: a map does it
            hosts = {host_name(i): host_name(i) for i in range(_NODES)}
            (root / "node-map.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
            args = (*args, "--node-map", str(root / "node-map.yaml"))
        manager = stack.manager(emulator, kube=api, insecure_no_auth=True, args=args)
        pids = {"manager": manager.role.pid, "emulator": emulator.role.pid}
        yield Target(manager.url, emulator, "manager", pids), manager, emulator, api


def _profile_figures(
    target: Target, nodes: list[str], quick: bool, seed: int, probe: dict[str, str | None], *, full: bool
) -> dict[str, Any]:
    """Parts 1-3 on one stack: latency always, the random runs only where ``full``."""
    out: dict[str, Any] = {"probe": probe}
    claims = 100 if quick else 1000
    if probe["partitions"] is None:
        progress("sharing", f"{target.label}: partitions, seven on one GPU")
        out["partitions"] = asyncio.run(_partition_latency(target, nodes, 2 if quick else 12, seed))
        if full:
            progress("sharing", f"{target.label}: {claims} random whole/partition claims")
            out["random_partitions"] = asyncio.run(_random_partitions(target, nodes, claims, seed, _HOLD_MAX))
    if probe["shares"] is None:
        progress("sharing", f"{target.label}: memory share attach and release")
        out["shares"] = asyncio.run(_share_latency(target, nodes, 2 if quick else 15, seed))
        if full:
            progress("sharing", f"{target.label}: {claims} random memory shares")
            out["random_shares"] = asyncio.run(_random_shares(target, nodes, claims, seed, _HOLD_MAX))
    return out


def measure(
    quick: bool = False,
    root: Path | None = None,
    *,
    stand_in: bool = False,
    extra_points: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every part; ``extra_points``: crash points to sweep beyond those of :data:`POINTS` a share
    reaches (a point the manager has and the list does not yet name)."""
    with contextlib.ExitStack() as cleanup:
        if root is None:
            root = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="sharing-bench-")))
        root.mkdir(parents=True, exist_ok=True)
        topology = _topology(root / "topology.yaml")
        nodes = [host_name(i) for i in range(_NODES)]
        results: dict[str, Any] = {"manager": "stand-in" if stand_in else "real", "not_measured": {}}
        if stand_in:
            server = _standin_inventory(topology)
            cleanup.callback(server.stop)
            target = Target(server.url, None, "stand-in")
            results["instant"] = _profile_figures(
                target, nodes, quick, 35, asyncio.run(_probe(target, nodes)), full=True
            )
            results["not_measured"]["realistic"] = "the stand-in has no fabric: no profile applies"
            results["not_measured"]["crash_sweep"] = "the stand-in runs in the bench's own process"
            return results
        for latency in ("instant", "realistic"):
            progress("sharing", f"starting the {latency} emulator and the fabric manager")
            with _real(root / latency, topology, latency) as (target, _, _, _):
                probe = asyncio.run(_probe(target, nodes))
                results[latency] = _profile_figures(
                    target, nodes, quick, 35, probe, full=latency == "instant"
                )
        for what in ("partitions", "shares"):
            why = results["instant"]["probe"][what]
            if why is not None:
                results["not_measured"][what] = why
        if results["instant"]["probe"]["shares"] is None:
            points = _sweep_points()
            if quick:
                points = points[:3]
            points += [p for p in extra_points if p not in points]
            grace = ("--orphan-grace-seconds", "1", "--orphan-interval-seconds", "0.5")
            with _real(
                root / "sweep", topology, "instant" if quick else "realistic", kube=True, args=grace
            ) as (_, manager, emulator, api):
                assert api is not None
                results["crash_sweep"] = asyncio.run(_sweep(manager, emulator, api, points, nodes[0]))
        else:
            results["not_measured"]["crash_sweep"] = "the manager binds no memory share (above)"
    return results


def _checks(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the figures taken; what could not be taken is one row of its own (its count),
    with the reasons in ``figures["not_measured"]``."""
    instant, realistic = figures.get("instant", {}), figures.get("realistic", {})
    bound = "partition_gpu_already_bound"
    rows: list[tuple[str, Any, float, str, bool]] = [
        (
            "1g.10gb partitions held at once on one H100",
            instant.get("partitions", {}).get("held_at_once_min"),
            7,
            "",
            False,
        ),
        (
            "partition attach p50, GPU bound to the node (instant)",
            instant.get("partitions", {}).get(bound, {}).get("p50_ms"),
            100,
            "ms",
            True,
        ),
        (
            "partition attach p50, GPU bound to the node (realistic)",
            realistic.get("partitions", {}).get(bound, {}).get("p50_ms"),
            100,
            "ms",
            True,
        ),
    ]
    rnd, shares, sweep = (
        instant.get("random_partitions"),
        instant.get("random_shares"),
        figures.get("crash_sweep"),
    )
    if rnd:
        rows += [
            ("counter over-commit, random whole/partition claims", rnd["counter_over_commit"], 0, "", True),
            (
                "GPUs bound to two nodes, random whole/partition claims",
                rnd["gpus_bound_to_two_nodes"],
                0,
                "",
                True,
            ),
            (
                "leaks after release, random whole/partition claims",
                sum(rnd["leaks_after_release"].values()),
                0,
                "",
                True,
            ),
        ]
    if shares:
        rows += [
            ("memory over-commit, random shares", shares["over_commit"], 0, "", True),
            ("leaks after release, random shares", sum(shares["leaks_after_release"].values()), 0, "", True),
        ]
    if sweep:
        # a case that never converged (-1) counts as an orphan
        orphans = sum(c["orphan_chunks"] if c["orphan_chunks"] >= 0 else 1 for c in sweep.values())
        rows.append(("orphan chunks after the crash-point sweep", orphans, 0, "", True))
        left = sum(c.get("chunks_left", 1) for c in sweep.values())
        rows.append(("chunks left after the crash-point sweep's releases", left, 0, "", True))
    out = [
        check(name, value, target, unit, at_most=at_most)
        for name, value, target, unit, at_most in rows
        if value is not None
    ]
    out.append(
        check("figures not measured (see figures.not_measured)", len(figures.get("not_measured", {})), 0, "")
    )
    return out


def run(ctx: BenchContext) -> dict[str, Any]:
    """Extra section ``sharing`` of ``python -m bench``."""
    figures = measure(ctx.quick, ctx.root / "sharing")
    return {"figures": figures, "checks": _checks(figures)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer claims and rounds")
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="against the manager stand-in instead of the real manager: the bench's own logic, no fabric",
    )
    parser.add_argument(
        "--crash-points",
        default="",
        metavar="P,P",
        help="more manager crash points to sweep (comma-separated), beyond those plumbing.crashpoints lists",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="run in DIR and keep it (the processes' logs and state) instead of a temporary directory",
    )
    args = parser.parse_args()
    extra = tuple(p for p in args.crash_points.split(",") if p)
    figures = measure(args.quick, args.keep, stand_in=args.stand_in, extra_points=extra)
    print(json.dumps({"figures": figures, "checks": _checks(figures)}, indent=2))


if __name__ == "__main__":
    main()
