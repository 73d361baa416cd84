"""The manager's ledger at 10,000 bindings, in ConfigMap shards on the API test server with the
real size limits (1 MiB of ConfigMap data, etcd's 1.5 MiB object, 3 MiB bodies).

Real processes: the API test server, the ``instant`` emulator with a generated topology of
100 hosts and 10,100 devices (10,000 GPUs, 100 NVMe drives), and
``fabric-dra manager serve --ledger configmap``. Measured:

- attach p50/p90/p99 (one device attached and detached again and again, through REST) with 10
  bindings in the ledger, and again with 10,000 (the issue's target: within 20 %);
- the bulk attach of 10,000 devices (64 at a time): operations per second;

The manager attaches only for a ResourceClaim that allocates the device (:mod:`fabric.state.claims`), so
every attach here has one, allocated as the scheduler leaves it; the claims are written before the
attaches they serve and are not part of any figure.
- the manager's RSS with 10 and with 10,000 bindings;
- start-up with 10,000 bindings: the manager restarted until ``/readyz`` (ledger loaded and the
  fabric read) and the load of the 256 shards alone (``Ledger.load`` in this process);
- the largest shard's bytes (of the 1 MiB a ConfigMap may hold);
- per attach+detach pair of the latency figures, the manager's Redfish requests by method and
  resource and the time they took (its ``fabric_dra_redfish_request_duration_seconds``): where a
  difference between 10 and 10,000 bindings comes from (the manager's reads, or the fabric's
  answer to the bind itself).

``python -m bench --only ledger``; ``python -m bench.ledger_bench [--quick]`` prints JSON
(``--quick``: 1,000 bindings).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import tracemalloc
import uuid
from typing import Any

from bench.common import (
    BenchContext,
    check,
    generate_topology,
    histogram_sums,
    host_name,
    progress,
    rss_mib,
    summary_ms,
    work_dir,
)
from fabric.state.ledger import (
    ConfigMapLedgerStore,
    Ledger,
    LedgerDocument,
    LedgerEntry,
    LedgerState,
    shard_names,
)
from fabric_dra_testbed.stack import Stack
from manager_api.client import ManagerClient
from manager_api.errors import FabricUnavailable, NotLeader, TooManyRequests
from manager_api.models import AttachmentState
from plumbing.kube.client import ApiError
from plumbing.kube.resources import CONFIGMAPS, NODES, RESOURCE_CLAIMS

__all__ = ["run"]

HOSTS = 100
NAMESPACE = "default"
LEDGER = "fabric-dra-manager-ledger"
#: the device attached and detached for the latency figures; never part of the bulk
PROBE = "gpu0"
#: the pool of the generated topology's GPUs (``fabric`` + the PCIe fabric's Id)
POOL = "fabric-pcie"


def _redfish_totals(url: str) -> dict[str, tuple[float, float]]:
    """``"GET Zone"`` → (requests, seconds) so far, from the manager's /metrics."""
    return histogram_sums(url, "fabric_dra_redfish_request_duration_seconds", ("method", "resource"))


def _per_pair(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], pairs: int
) -> dict[str, Any]:
    """Redfish requests and milliseconds per attach+detach pair between two :func:`_redfish_totals`."""
    out: dict[str, Any] = {}
    for key, (count, seconds) in sorted(after.items()):
        was = before.get(key, (0.0, 0.0))
        if count > was[0]:
            out[key] = {
                "requests": round((count - was[0]) / pairs, 2),
                "ms": round((seconds - was[1]) * 1000 / pairs, 2),
            }
    return out


def _uid() -> str:
    return str(uuid.uuid4())


async def _claims(stack_kube: Any, devices: list[str], concurrency: int = 32) -> list[str]:
    """One ResourceClaim per device, allocated it as the scheduler leaves a claim; their UIDs."""
    gate = asyncio.Semaphore(concurrency)
    async with stack_kube.client() as kube:

        async def one(device: str) -> str:
            async with gate:
                claim = await kube.create(
                    RESOURCE_CLAIMS,
                    {
                        "metadata": {"name": f"{device}-{uuid.uuid4().hex[:10]}", "namespace": NAMESPACE},
                        "spec": {
                            "devices": {
                                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                            }
                        },
                    },
                    NAMESPACE,
                )
                result = {"request": "gpu", "driver": "fabric-dra.io", "pool": POOL, "device": device}
                claim["status"] = {"allocation": {"devices": {"results": [result]}}}
                await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
                return str(claim["metadata"]["uid"])

        return list(await asyncio.gather(*(one(d) for d in devices)))


async def _latency(url: str, claims: list[str]) -> dict[str, Any]:
    """Attach (timed) and detach the probe once per claim; with the Redfish requests per pair."""
    before = _redfish_totals(url)
    attach = await _attach_times(url, claims)
    return {**summary_ms(attach), "redfish_per_pair": _per_pair(before, _redfish_totals(url), len(claims))}


async def _attach_times(url: str, claims: list[str]) -> list[float]:
    """Seconds of each attach of the probe, one per claim, each followed by its detach."""
    attach = []
    async with ManagerClient(url, timeout=60) as client:
        for claim in claims:
            started = time.perf_counter()
            await _attach_as_kubelet(client, PROBE, host_name(0), claim)
            attach.append(time.perf_counter() - started)
            # the next attach needs the probe idle again: wait the detach out (40 s per call at most)
            while (await client.detach(PROBE, host_name(0), claim, wait_seconds=40)).state is not (
                AttachmentState.DETACHED
            ):
                pass
    return attach


#: what a kubelet retries (NodePrepareResources fails, the kubelet calls again after its backoff):
#: the manager unavailable for a moment, a leader change, too many requests at once
_RETRIED = (FabricUnavailable, NotLeader, TooManyRequests)


async def _attach_as_kubelet(client: ManagerClient, device: str, node: str, claim: str) -> None:
    """One attach, retried as the kubelet would retry its prepare (up to 5 times, 1 s apart or as
    the manager says), so that one refused write does not end the benchmark."""
    for attempt in range(5):
        try:
            await client.attach(device, node, claim, wait_seconds=40)
            return
        except _RETRIED as err:
            if attempt == 4:
                raise
            progress("ledger", f"attach {device} retried as a kubelet would: {err}")
            await asyncio.sleep(err.retry_after or 1.0)


async def _bind(url: str, devices: list[str], claims: list[str], concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)
    async with ManagerClient(url, timeout=120) as client:

        async def one(index: int, device: str) -> None:
            async with gate:
                await _attach_as_kubelet(client, device, host_name(index % HOSTS), claims[index])

        started = time.perf_counter()
        await asyncio.gather(*(one(i, d) for i, d in enumerate(devices)))
        return time.perf_counter() - started


async def _create_nodes(stack_kube: Any) -> None:
    async with stack_kube.client() as kube:
        for index in range(HOSTS):
            await kube.create(NODES, {"metadata": {"name": host_name(index)}})


async def _shards(stack_kube: Any) -> tuple[float, int, int]:
    """(seconds to load the ledger, its entries, the largest shard's bytes)."""
    async with stack_kube.client() as kube:
        ledger = Ledger(ConfigMapLedgerStore(kube, name=LEDGER, namespace=NAMESPACE))
        started = time.perf_counter()
        await ledger.load()
        seconds = time.perf_counter() - started
        largest = 0
        for name in shard_names(LEDGER):
            obj = await kube.get(CONFIGMAPS, name, NAMESPACE)
            largest = max(largest, len(obj["data"]["ledger.json"]))
    return seconds, len(ledger.entries()), largest


def _entry(device: str, node: str, state: LedgerState = LedgerState.BOUND) -> LedgerEntry:
    return LedgerEntry(
        device=device,
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        node=node,
        host=node,
        claim_uid=_uid(),
        state=state,
        operation_id=f"op-{uuid.uuid4().hex[:12]}",
    )


async def _ledger_alone(server: Any, sizes: tuple[int, ...], writes: int) -> dict[str, Any]:
    """The ledger without the manager around it, in this process, on the API test server: for each
    size, the intent write an attach waits for (one entry put, committed) with that many entries
    already in the ledger, and the same write through one ConfigMap holding everything (the layout
    of earlier releases, which the server refuses beyond 1 MiB); then the load of the biggest
    ledger. The sizes take turns in blocks of 10 writes, so that the load of a shared machine
    falls on all of them alike."""
    out: dict[str, Any] = {}
    async with server.client() as kube:
        ledgers: dict[int, Ledger] = {}
        for size in sizes:
            ledger = Ledger(ConfigMapLedgerStore(kube, name=f"alone-{size}", namespace=NAMESPACE))
            await ledger.load()
            for i in range(size):
                ledger.put(_entry(f"dev{i}", host_name(i % HOSTS)))
            started = time.perf_counter()
            await ledger.commit()
            out[f"fill_{size}_s"] = round(time.perf_counter() - started, 2)
            ledgers[size] = ledger
        singles = {size: await _SingleConfigMap.create(kube, size) for size in sizes}
        sharded: dict[int, list[float]] = {size: [] for size in sizes}
        single: dict[int, list[float]] = {size: [] for size in sizes}
        for block in range(writes // 10):
            for size in sizes:
                ledger = ledgers[size]
                for i in range(10):
                    ledger.put(_entry("probe", host_name((block + i) % HOSTS), LedgerState.ATTACHING))
                    started = time.perf_counter()
                    await ledger.commit()
                    sharded[size].append(time.perf_counter() - started)
                    ledger.remove("probe")
                    await ledger.commit()
                one = singles[size]
                if one is not None:
                    single[size].extend([await one.intent_write(block + i) for i in range(10)])
        for size in sizes:
            out[f"intent_write_{size}"] = summary_ms(sharded[size])
            out[f"single_configmap_intent_write_{size}"] = (
                summary_ms(single[size]) if singles[size] is not None else "refused by the server"
            )
        biggest = max(sizes)
        loads = []
        for _ in range(3):
            started = time.perf_counter()
            reread = Ledger(ConfigMapLedgerStore(kube, name=f"alone-{biggest}", namespace=NAMESPACE))
            await reread.load()
            loads.append(time.perf_counter() - started)
            assert len(reread.entries()) == biggest
        out[f"load_{biggest}"] = summary_ms(loads)
        # once more under tracemalloc (slower): what the loaded ledger holds
        del reread
        gc.collect()
        tracemalloc.start()
        reread = Ledger(ConfigMapLedgerStore(kube, name=f"alone-{biggest}", namespace=NAMESPACE))
        await reread.load()
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[f"load_{biggest}_held_mib"] = round(held / 2**20, 1)
        out[f"load_{biggest}_peak_mib"] = round(peak / 2**20, 1)
    return out


class _SingleConfigMap:
    """The intent write of earlier releases: the whole ledger replaced in one ConfigMap."""

    def __init__(self, kube: Any, size: int, saved: dict[str, Any], entries: dict[str, LedgerEntry]) -> None:
        self.kube = kube
        self.name = f"single-{size}"
        self.version = saved["metadata"]["resourceVersion"]
        self.entries = entries

    @staticmethod
    def body(name: str, entries: dict[str, LedgerEntry], version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
        if version:
            meta["resourceVersion"] = version
        document = LedgerDocument(entries=entries).model_dump_json(indent=1)
        return {"metadata": meta, "data": {"ledger.json": document}}

    @classmethod
    async def create(cls, kube: Any, size: int) -> _SingleConfigMap | None:
        entries = {f"dev{i}": _entry(f"dev{i}", host_name(i % HOSTS)) for i in range(size)}
        try:
            saved = await kube.create(CONFIGMAPS, cls.body(f"single-{size}", entries, None), NAMESPACE)
        except ApiError:
            return None  # beyond 1 MiB of data, or 3 MiB of body: what stopped earlier releases
        return cls(kube, size, saved, entries)

    async def intent_write(self, index: int) -> float:
        self.entries["probe"] = _entry("probe", host_name(index % HOSTS), LedgerState.ATTACHING)
        started = time.perf_counter()
        saved = await self.kube.replace(CONFIGMAPS, self.body(self.name, self.entries, self.version))
        self.version = saved["metadata"]["resourceVersion"]
        return time.perf_counter() - started


def measure(quick: bool = False, *, alone_only: bool = False) -> dict[str, Any]:
    bindings = 1_000 if quick else 10_000
    pairs = 30 if quick else 100
    out: dict[str, Any] = {"bindings": bindings}
    with work_dir("ledger-bench-") as root, Stack(root) as stack:
        kube = stack.apiserver()
        progress("ledger", "the ledger alone")
        out["alone"] = asyncio.run(_ledger_alone(kube, (10, 2_000, bindings), 50 if quick else 200))
        if alone_only:
            return out
        # (bindings + 100) devices, GPUs first: the generator makes at most 10,000 of a kind
        gpus = min(bindings + 100, 10_000)
        nvme = bindings + 100 - gpus
        topology = generate_topology(root / "topology.yaml", hosts=HOSTS, gpus=gpus, nvme=nvme)
        asyncio.run(_create_nodes(kube))
        emulator = stack.emulator(latency="instant", topology=topology)
        begun = time.perf_counter()
        manager = stack.manager(
            emulator,
            kube=kube,
            namespace=NAMESPACE,
            ledger="configmap",
            insecure_no_auth=True,
            # no pod holds the claims here: no orphan reconciler; 10,000 over 100 nodes is 100 each.
            # The emulator renders the 10,100 endpoints inline in 20-40 s on the shared machine:
            # more than the 30 s a Redfish answer may take by default. The full re-read (every
            # 60 s by default) reads them again and the emulator answers nothing else meanwhile:
            # at this fabric size it stalls whatever attach runs then (the fabric's size, the
            # same at 10 bindings as at 10,000), so the run makes only the first one.
            args=["--orphan-grace-seconds", "0", "--redfish-timeout", "180", "--resync-seconds", "3600"],
            ready_timeout=1800,
        )
        devices = [*(f"gpu{i}" for i in range(1, gpus)), *(f"nvme{i}" for i in range(nvme))][:bindings]
        progress("ledger", f"manager ready in {time.perf_counter() - begun:.0f} s; 10 bindings")
        claims = asyncio.run(_claims(kube, devices[:10]))
        asyncio.run(_bind(manager.url, devices[:10], claims, 10))
        out["attach_at_10"] = asyncio.run(_latency(manager.url, asyncio.run(_claims(kube, [PROBE] * pairs))))
        out["manager_rss_mib_at_10"] = rss_mib(manager.role.pid)
        progress("ledger", f"attach at 10: {out['attach_at_10']}")
        progress("ledger", f"binding {bindings - 10} more")
        claims = asyncio.run(_claims(kube, devices[10:]))
        seconds = asyncio.run(_bind(manager.url, devices[10:], claims, 64))
        out["bulk_attach_per_s"] = round((bindings - 10) / seconds, 1)
        progress("ledger", f"bulk attach: {out['bulk_attach_per_s']}/s")
        probe_claims = asyncio.run(_claims(kube, [PROBE] * 2 * pairs))
        progress("ledger", f"{bindings} bindings")
        out[f"attach_at_{bindings}"] = asyncio.run(_latency(manager.url, probe_claims[:pairs]))
        out[f"manager_rss_mib_at_{bindings}"] = rss_mib(manager.role.pid)
        progress("ledger", f"attach at {bindings}: {out[f'attach_at_{bindings}']}")
        load_s, entries, largest = asyncio.run(_shards(kube))
        out["ledger_entries"] = entries
        out["ledger_load_s"] = round(load_s, 3)
        out["largest_shard_bytes"] = largest
        progress("ledger", "restart with the full ledger")
        manager.stop()
        started = time.perf_counter()
        manager.start()
        out["restart_to_ready_s"] = round(time.perf_counter() - started, 2)
        progress("ledger", f"restart to ready: {out['restart_to_ready_s']} s")
        out[f"manager_rss_mib_after_restart_at_{bindings}"] = rss_mib(manager.role.pid)
        out[f"attach_after_restart_at_{bindings}"] = asyncio.run(_latency(manager.url, probe_claims[pairs:]))
    return out


def run(ctx: BenchContext) -> dict[str, Any]:
    """Extra section ``ledger`` of ``python -m bench``."""
    figures = measure(ctx.quick)
    n = figures["bindings"]
    ratio = figures[f"attach_at_{n}"]["p50_ms"] / figures["attach_at_10"]["p50_ms"]
    return {
        "figures": figures,
        "checks": [
            check(f"attach p50 at {n} bindings / at 10", round(ratio, 2), 1.2, "x"),
            check(f"ledger entries after {n} attaches", figures["ledger_entries"], n, "", at_most=False),
            check("largest ledger shard", figures["largest_shard_bytes"], 1024 * 1024, "bytes"),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 bindings instead of 10,000")
    parser.add_argument("--alone", action="store_true", help="the ledger alone, without the manager")
    args = parser.parse_args()
    print(json.dumps(measure(args.quick, alone_only=args.alone), indent=2))


if __name__ == "__main__":
    main()
