"""What every benchmark section shares: statistics, checks against targets, process memory, the
plugin's phase metrics, the machine, and the real processes a section runs against.

Everything here starts *real* processes on real sockets through the one stack builder
(:mod:`fabric_dra_testbed.stack`): the API test server, ``fabric-dra emulator serve``, ``fabric-dra manager
serve`` and one ``fabric-dra plugin`` per node, driven through the kubelet-protocol client of
:mod:`kube_standin.kubelet_client` the way the kubelet drives them. Figures come from here, never
from timed tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric_dra_testbed.stack import ApiServer, Emulator, Manager, Plugin, Role, Stack, free_port
from kube_standin.kubelet_client import DRAPluginClient, register_plugin
from plumbing.kube import KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS

__all__ = [
    "DRIVER",
    "REPO_ROOT",
    "BenchContext",
    "ClaimSpec",
    "FabricStack",
    "PluginProcess",
    "check",
    "cpu_probe_ms",
    "cpu_seconds",
    "create_claims",
    "free_port",
    "generate_topology",
    "histogram_sums",
    "host_name",
    "machine",
    "percentile",
    "phase_delta",
    "phase_sums",
    "progress",
    "rss_mib",
    "summary_ms",
    "work_dir",
]

DRIVER = "fabric-dra.io"
REPO_ROOT = Path(__file__).resolve().parent.parent
POOL = "fabric-pcie"

# -- statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of ``values`` (not interpolated: every figure was really measured)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean/max in milliseconds of durations given in seconds."""
    if not values:
        return {"n": 0}
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 3),
        "p90_ms": round(percentile(values, 90) * 1000, 3),
        "p99_ms": round(percentile(values, 99) * 1000, 3),
        "mean_ms": round(statistics.fmean(values) * 1000, 3),
        "max_ms": round(max(values) * 1000, 3),
        "n": len(values),
    }


def check(name: str, measured: float, target: float, unit: str, *, at_most: bool = True) -> dict[str, Any]:
    """One row of the results table: ``measured`` against ``target`` (an upper bound unless
    ``at_most`` is False)."""
    passed = measured <= target if at_most else measured >= target
    return {
        "name": name,
        "target": f"{'<=' if at_most else '>='} {target:g} {unit}".strip(),
        "measured": round(measured, 3),
        "unit": unit,
        "pass": bool(passed),
    }


def progress(section: str, step: str) -> None:
    print(f"bench {section}: {step}", file=sys.stderr, flush=True)


# -- the machine and its processes ---------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


def cpu_probe_ms(rounds: int = 5) -> float:
    """Milliseconds of one fixed piece of pure-Python work (a zone-like JSON document encoded,
    decoded and its links sorted), the median of ``rounds``: how fast this machine runs Python
    right now. On a shared 2-core VM the same code's CPU per claim doubled within half an hour;
    the probe taken before and after each section says which speed its figures were made at."""
    links = [{"@odata.id": f"/redfish/v1/Fabrics/PCIe/Endpoints/gpu{i}"} for i in range(100)]
    document = {"Id": "zone", "Links": {"Endpoints": links}, "Status": {"State": "Enabled"}}
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(200):
            decoded = json.loads(json.dumps(document))
            sorted(decoded["Links"]["Endpoints"], key=lambda link: link["@odata.id"], reverse=True)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` (``VmRSS``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@contextlib.contextmanager
def work_dir(prefix: str) -> Iterator[Path]:
    """A short directory under /tmp (unix socket paths are limited to 107 bytes); removed after."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def generate_topology(
    path: Path,
    *,
    hosts: int,
    gpus: int,
    nvme: int = 0,
    cxl_devices: int = 0,
    cxl_pools: int = 0,
    partitionable: bool = False,
) -> Path:
    """A topology file from ``fabric-dra emulator topology generate`` (deterministic); with
    ``cxl_pools`` 256 GiB memory pools, with ``partitionable`` H100s and A100s with their tables."""
    subprocess.run(
        [
            *(sys.executable, "-m", "fabric_dra", "emulator", "topology", "generate"),
            *("--hosts", str(hosts), "--gpus", str(gpus), "--nvme", str(nvme), "--nics", "0"),
            *("--fpgas", "0", "--cxl-devices", str(cxl_devices), "--cxl-pools", str(cxl_pools)),
            *(["--partitionable-gpus"] if partitionable else []),
            *("--output-file", str(path)),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return path


def host_name(index: int) -> str:
    """The generated topology's hosts: kind-worker, kind-worker2, ..."""
    return "kind-worker" if index == 0 else f"kind-worker{index + 1}"


# -- the plugin's phase histograms ---------------------------------------------------------------


def phase_sums(port: int) -> dict[str, tuple[float, float]]:
    """``{phase: (count, seconds)}`` of ``fabric_dra_plugin_phase_seconds`` from the plugin's /metrics."""
    return histogram_sums(
        f"http://127.0.0.1:{port}", "fabric_dra_plugin_phase_seconds", ("phase",), timeout=10
    )


def histogram_sums(
    url: str, metric: str, labels: Sequence[str], *, timeout: float = 60
) -> dict[str, tuple[float, float]]:
    """``{"<label values>": (count, seconds)}`` of the histogram ``metric`` from the /metrics of the
    process at ``url``, keyed by the values of ``labels`` (joined by a space) and summed over the rest.

    Only the histogram's two series are asked for (prometheus_client's ``name[]`` filter): rendering
    every histogram of a process takes milliseconds of its GIL, and a scrape around every pair would
    otherwise land in the pair it measures."""
    query = f"name[]={metric}_count&name[]={metric}_sum"
    with urllib.request.urlopen(f"{url}/metrics?{query}", timeout=timeout) as response:
        text = response.read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith((f"{metric}_count{{", f"{metric}_sum{{")):
            continue
        name, _, value = line.rpartition(" ")
        series, _, rest = name.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        entry = out.setdefault(" ".join(found.get(label, "") for label in labels), [0.0, 0.0])
        entry[0 if series.endswith("_count") else 1] += float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def phase_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Seconds spent in each phase between two scrapes."""
    return {k: v[1] - before.get(k, (0.0, 0.0))[1] for k, v in after.items()}


# -- claims ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    name: str
    node: str
    device: str
    pool: str = POOL
    namespace: str = "default"


async def create_claims(kube: KubeClient, specs: Sequence[ClaimSpec], *, concurrency: int = 8) -> list[str]:
    """Create one-device ResourceClaims allocated and reserved as the scheduler leaves them;
    returns their UIDs in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: ClaimSpec) -> str:
        async with gate:
            created = await kube.create(
                RESOURCE_CLAIMS,
                {
                    "metadata": {"name": spec.name, "namespace": spec.namespace},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "dev", "exactly": {"deviceClassName": "cohdi-pcie-device"}}]
                        }
                    },
                },
                spec.namespace,
            )
            created["status"] = {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "dev", "driver": DRIVER, "pool": spec.pool, "device": spec.device}
                        ]
                    },
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [spec.node]}
                                ]
                            }
                        ]
                    },
                },
                "reservedFor": [{"resource": "pods", "name": f"{spec.name}-pod", "uid": str(uuid.uuid4())}],
            }
            updated = await kube.replace(RESOURCE_CLAIMS, created, subresource="status")
            return str(updated["metadata"]["uid"])

    return list(await asyncio.gather(*(one(s) for s in specs)))


# -- processes -------------------------------------------------------------------------------------


@dataclass
class PluginProcess:
    """One ``fabric-dra plugin`` for one node, with its metrics port and registry directory."""

    node: str
    plugin: Plugin
    metrics_port: int

    @property
    def process(self) -> Role:
        return self.plugin.role

    @property
    def registry_dir(self) -> Path:
        return self.plugin.registry_dir

    @property
    def pid(self) -> int:
        return self.plugin.pid

    async def kubelet(self) -> DRAPluginClient:
        """Register the plugin as the kubelet does and return the kubelet's DRA client for it."""
        attempt = await register_plugin(self.plugin.registration_socket)
        return DRAPluginClient(attempt.driver, attempt.endpoint, attempt.chosen_service)

    def phases(self) -> dict[str, tuple[float, float]]:
        return phase_sums(self.metrics_port)


@dataclass
class FabricStack:
    """API test server + emulator (``latency`` profile, generated topology, no authentication) +
    fabric manager, from :class:`fabric_dra_testbed.stack.Stack`; plugins are started per node with
    :meth:`plugin`. Use as a context manager: everything it started is stopped on exit."""

    root: Path
    hosts: int = 11
    gpus: int = 72
    latency: str = "instant"
    #: flags added to the manager's command line (bench/warm_bench.py: the warm pool's)
    manager_args: Sequence[str] = ()
    api: ApiServer | None = None
    emulator_handle: Emulator | None = None
    manager_handle: Manager | None = None
    plugins: dict[str, PluginProcess] = field(default_factory=dict)
    stack: Stack | None = None

    @property
    def emulator(self) -> Role | None:
        return self.emulator_handle.role if self.emulator_handle is not None else None

    @property
    def manager(self) -> Role | None:
        return self.manager_handle.role if self.manager_handle is not None else None

    def sysfs_root(self, host: str) -> Path:
        assert self.emulator_handle is not None
        return self.emulator_handle.sysfs(host)

    def __enter__(self) -> FabricStack:
        self.stack = stack = Stack(self.root)
        try:
            topology = generate_topology(self.root / "topology.yaml", hosts=self.hosts, gpus=self.gpus)
            self.api = stack.apiserver()
            self.emulator_handle = stack.emulator(topology=topology, latency=self.latency, auth=False)
            self.manager_handle = stack.manager(
                self.emulator_handle, insecure_no_auth=True, args=self.manager_args
            )
        except BaseException:
            stack.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stack is not None:
            self.stack.stop()

    def plugin(self, host: str, *, backend: str = "fabric", extra: Sequence[str] = ()) -> PluginProcess:
        """Start the plugin of node ``host`` (the manager maps a host to the node of its name)."""
        assert self.stack is not None and self.api is not None and self.manager_handle is not None
        port = free_port()
        plugin = self.stack.plugin(
            host,
            self.manager_handle,
            self.api,
            sysfs_root=self.sysfs_root(host),
            backend=backend,
            metrics_port=port,
            args=extra,
        )
        handle = PluginProcess(host, plugin, port)
        self.plugins[host] = handle
        return handle


# -- one run of the bench ------------------------------------------------------------------------


@dataclass
class BenchContext:
    """Shared by the sections of one run: ``quick`` mode, and the instant-profile fabric stack that
    the latency, throughput and memory sections use (started on first use, stopped by close())."""

    quick: bool
    root: Path
    #: where the run's figures go (the JSON's folder): a section's own files (a plot) beside them
    results_dir: Path = REPO_ROOT / "bench" / "results"
    _fabric: FabricStack | None = None

    def fabric(self) -> FabricStack:
        if self._fabric is None:
            progress("setup", "starting the API test server, the instant emulator and the fabric manager")
            self._fabric = FabricStack(self.root / "fabric").__enter__()
        return self._fabric

    def plugin(self, host: str) -> PluginProcess:
        stack = self.fabric()
        return stack.plugins.get(host) or stack.plugin(host)

    def close(self) -> None:
        if self._fabric is not None:
            self._fabric.__exit__(None, None, None)
            self._fabric = None


def checkout_tree(ref: str, into: Path) -> Path:
    """The tree of ``ref`` for a side-by-side baseline: a commit of this repository (``git archive``,
    unpacked under ``into``), or a directory that holds one already."""
    if Path(ref).is_dir():
        return Path(ref)
    archive = into / "baseline.tar"
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", "-o", str(archive), ref],
        check=True,
        timeout=120,
    )
    tree = into / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree
