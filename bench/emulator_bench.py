"""Emulator benchmark: bind+unbind pairs per second and GET latency, ``instant`` profile.

A real ``fabric-dra emulator serve`` process with a generated topology (64 GPUs, 8 hosts), so
each client worker owns its own device and host and no request loses a conflict. A pair is
``#Zone.AddEndpoint`` + ``#Zone.RemoveEndpoint`` on the host's zone — the path the fabric
manager's zone backend takes — each durable (fsync) before its 204. GETs walk endpoints,
zones, systems, resource blocks and collections.

Client and server share the machine's two cores, so each figure is measured twice: with a lean
keep-alive HTTP/1.1 client (a few microseconds per request: what the emulator sustains), and
with httpx (what a Python client like the fabric manager sees, its own CPU cost included).

Targets: >= 300 pairs/s; GET p99 <= 10 ms.

``python -m bench.emulator_bench [--quick] [--json]``; :func:`run` returns the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.common import BenchContext, check, progress, rss_mib, summary_ms
from emulator.topology.generate import GenerateSpec, generate_topology_yaml
from fabric_dra_testbed.stack import Emulator as RunningEmulator
from fabric_dra_testbed.stack import Stack, zone_add, zone_remove

__all__ = ["run"]

_HOSTS = 8
_GPUS = 64


class _LeanConnection:
    """One keep-alive HTTP/1.1 connection that sends a request and reads its response, no more."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, auth: str
    ) -> None:
        self.reader, self.writer = reader, writer
        self.prefix = f"Host: {host}\r\nAuthorization: {auth}\r\n"

    @classmethod
    async def open(cls, emu: RunningEmulator) -> _LeanConnection:
        host_port = emu.url.split("://", 1)[1]
        host, port = host_port.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        token = base64.b64encode(f"{emu.username}:{emu.password}".encode()).decode()
        return cls(reader, writer, host_port, f"Basic {token}")

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> int:
        payload = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\n{self.prefix}Content-Length: {len(payload)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + payload)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length:
            await self.reader.readexactly(length)
        return int(status_line.split()[1])

    def close(self) -> None:
        self.writer.close()


def _progress(step: str) -> None:
    progress("emulator", step)


def _host(i: int) -> str:
    return "kind-worker" if i == 0 else f"kind-worker{i + 1}"


#: one request on one client's connection: (method, URI, JSON body) → the answer's status
_Request = Callable[..., Awaitable[int]]


@contextlib.asynccontextmanager
async def _clients(emu: RunningEmulator, workers: int, lean: bool) -> AsyncIterator[list[_Request]]:
    """One way of sending requests per worker: its own lean keep-alive connection, or one httpx
    client with a connection per worker; closed on exit."""
    if lean:
        connections = [await _LeanConnection.open(emu) for _ in range(workers)]
        try:
            yield [c.request for c in connections]
        finally:
            for connection in connections:
                connection.close()
        return
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    async with emu.async_client(limits=limits) as client:

        async def request(method: str, uri: str, body: dict[str, Any] | None = None) -> int:
            return (await client.request(method, uri, json=body)).status_code

        yield [request] * workers


async def _pairs(emu: RunningEmulator, workers: int, seconds: float, lean: bool) -> dict[str, Any]:
    """Bind+unbind pairs for ``seconds`` with ``workers`` concurrent clients on distinct devices."""
    durations: list[float] = []
    deadline = 0.0

    async def pair_loop(request: _Request, w: int) -> None:
        device, host = f"gpu{w}", _host(w % _HOSTS)
        bind, unbind = zone_add(host, device), zone_remove(host, device)
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            first = await request("POST", *bind)
            second = await request("POST", *unbind)
            if first != 204 or second != 204:
                raise RuntimeError(f"bind/unbind of {device} on {host} answered {first}/{second}")
            durations.append(time.perf_counter() - t0)

    async with _clients(emu, workers, lean) as requests:
        if not lean:  # httpx opens its connections on first use: open them before the clock
            await asyncio.gather(*(request("GET", "/redfish/v1/") for request in requests))
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()
        await asyncio.gather(*(pair_loop(request, w) for w, request in enumerate(requests)))
        elapsed = time.perf_counter() - start
    return {
        "client": "lean" if lean else "httpx",
        "workers": workers,
        "pairs": len(durations),
        "pairs_per_s": round(len(durations) / elapsed, 1),
        "pair_latency": summary_ms(durations),
    }


async def _gets(emu: RunningEmulator, workers: int, count: int, lean: bool) -> dict[str, Any]:
    uris = [
        "/redfish/v1/Fabrics/PCIe/Endpoints/gpu3",
        "/redfish/v1/Fabrics/PCIe/Zones/kind-worker2",
        "/redfish/v1/Systems/kind-worker",
        "/redfish/v1/CompositionService/ResourceBlocks/gpu7",
        "/redfish/v1/Fabrics/PCIe/Endpoints",
        "/redfish/v1/Chassis/switch0/PCIeDevices/gpu1/PCIeFunctions/0",
        "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem0",
        "/redfish/v1/",
    ]
    latencies: list[float] = []

    async def get_loop(request: _Request, w: int) -> None:
        for i in range(count // workers):
            uri = uris[(i + w) % len(uris)]
            t0 = time.perf_counter()
            status = await request("GET", uri)
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"GET {uri}: {status}")

    async with _clients(emu, workers, lean) as requests:
        await get_loop(requests[0], 0)  # warm the render cache
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*(get_loop(request, w) for w, request in enumerate(requests)))
        elapsed = time.perf_counter() - start
    return {
        "client": "lean" if lean else "httpx",
        "workers": workers,
        "gets_per_s": round(len(latencies) / elapsed, 1),
        **summary_ms(latencies),
    }


def measure(quick: bool = False) -> dict[str, Any]:
    seconds = 2.0 if quick else 6.0
    get_count = 800 if quick else 4000
    with tempfile.TemporaryDirectory(prefix="emulator-bench-") as tmp:
        tmp_dir = Path(tmp)
        topology = tmp_dir / "bench.yaml"
        topology.write_text(
            generate_topology_yaml(
                GenerateSpec(hosts=_HOSTS, gpus=_GPUS, nvme=0, nics=0, fpgas=0, cxl_devices=2)
            )
        )
        with Stack(tmp_dir) as stack:
            emu = stack.emulator(topology=topology)
            assert emu.process is not None
            rss_idle = rss_mib(emu.process.pid)
            pairs = []
            for lean in (True, False):
                for workers in (1, 8, 32):
                    _progress(f"bind+unbind pairs, {'lean' if lean else 'httpx'} client, {workers} worker(s)")
                    pairs.append(asyncio.run(_pairs(emu, workers, seconds, lean)))
            gets = []
            for lean in (True, False):
                for workers in (1, 8):
                    _progress(f"GETs, {'lean' if lean else 'httpx'} client, {workers} worker(s)")
                    gets.append(asyncio.run(_gets(emu, workers, get_count, lean)))
            rss_after = rss_mib(emu.process.pid)
            state_bytes = sum(
                (emu.state_dir / name).stat().st_size
                for name in ("fabric-state.json", "fabric-state.journal")
            )
    best = max(p["pairs_per_s"] for p in pairs if p["client"] == "lean")
    sequential_get = next(g for g in gets if g["client"] == "lean" and g["workers"] == 1)
    return {
        "benchmark": "emulator",
        "profile": "instant",
        "topology": {"hosts": _HOSTS, "gpus": _GPUS},
        "bind_unbind": pairs,
        "get": gets,
        "best_pairs_per_s": best,
        "get_p99_ms_sequential": sequential_get["p99_ms"],
        "targets": {
            "pairs_per_s>=300": best >= 300,
            "get_p99_ms<=10": sequential_get["p99_ms"] <= 10,
        },
        "emulator_rss_mib": {"idle": rss_idle, "after": rss_after},
        "state_file_bytes": state_bytes,
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    """The emulator's section of ``python -m bench`` (its speed target)."""
    figures = measure(ctx.quick)
    return {
        "figures": figures,
        "checks": [
            check(
                "emulator bind+unbind pairs/s (instant)",
                figures["best_pairs_per_s"],
                300,
                "/s",
                at_most=False,
            ),
            check("emulator GET p99 (sequential)", figures["get_p99_ms_sequential"], 10, "ms"),
        ],
    }


def _print_table(result: dict[str, Any]) -> None:
    print("emulator benchmark (instant profile, real process; clients on the same 2 cores)")
    header = f"{'client':<6} {'workers':>7}"
    print(f"{'bind+unbind':<12} {header} {'pairs/s':>9} {'pair p50 ms':>12} {'pair p99 ms':>12}")
    for row in result["bind_unbind"]:
        lat = row["pair_latency"]
        print(
            f"{'':<12} {row['client']:<6} {row['workers']:>7} {row['pairs_per_s']:>9} "
            f"{lat['p50_ms']:>12} {lat['p99_ms']:>12}"
        )
    print(f"{'GET':<12} {'client':<6} {'workers':>7} {'GETs/s':>9} {'p50 ms':>12} {'p99 ms':>12}")
    for row in result["get"]:
        print(
            f"{'':<12} {row['client']:<6} {row['workers']:>7} {row['gets_per_s']:>9} "
            f"{row['p50_ms']:>12} {row['p99_ms']:>12}"
        )
    targets = ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in result["targets"].items())
    print(f"targets: {targets}")
    rss = result["emulator_rss_mib"]
    print(f"emulator RSS: {rss['idle']} MiB idle, {rss['after']} MiB after the runs")


def main() -> None:
    parser = argparse.ArgumentParser(description="Benchmark the Redfish fabric emulator (instant profile).")
    parser.add_argument("--quick", action="store_true", help="shorter runs (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    result = measure(quick=args.quick)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result)


if __name__ == "__main__":
    main()
