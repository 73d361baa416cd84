"""Load with churn: claims created and deleted at random over many nodes, through the real processes.

What runs (all real processes on real sockets):

- ``fabric-dra emulator serve`` on a topology made by ``fabric-dra emulator topology generate``
  (``--nodes`` hosts, ``--devices`` targets: PCIe GPUs, NVMe drives, NICs, FPGAs and CXL memory
  chunks), with authentication;
- the API test server (``fabric-dra standin apiserver``), holding the ResourceClaims;
- ``fabric-dra manager serve`` (file ledger, static bearer tokens: one plugin token per node);
- one ``fabric-dra plugin`` per node, each with its own registry, plugin and CDI directories and
  the node's emulated sysfs tree; ``--plugins-per-wave`` runs the nodes in waves instead;
- in this process, per node, the kubelet-protocol client (:class:`kube_standin.kubelet_client.PluginManager`:
  registration, health stream, NodePrepareResources/NodeUnprepareResources with the kubelet's
  45 s deadline) — the kubelet — and a small scheduler that allocates free devices.

Pods come and go at random (every choice comes from ``random.Random(f"{seed}:{pod}")``): a pod gets
one claim (sometimes two), each with one to three devices, is prepared, held for a random time,
unprepared and deleted. Some pods are hostile on purpose: the claim is deleted before the kubelet
prepares it or while it prepares, the kubelet calls prepare or unprepare twice at once, or the
"scheduler" hands a device that another live claim holds to a second claim (a stale allocation).
The kubelet retries a failed prepare with back-off as the real one does and gives up after
``--max-attempts``, reporting the claim's last error.

Checked throughout: the emulator's binding table (every binding explained by a live claim of that
device on that node; polled), every host's sysfs tree (no PCIe device in two hosts, no CXL device
with more regions than chunks), the kubelet's view (no two claims hold one device at once), and
each prepare's answer (the allocated devices, a CDI spec, visible in the node's tree). At the end:
no binding in the emulator, every device free in the manager with an empty ledger, every host tree
empty, no CDI file, every checkpoint empty, no claim left. Every claim must have completed or
failed with a clear per-claim error.

``python -m bench.churn [--claims 1000 --nodes 50 --devices 200 --seed S]`` prints a summary and
writes the figures as JSON (``--json FILE``); exit status 1 when an invariant was violated.
``tests/integration/load/`` runs the same code with 60 claims over 6 nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import re
import resource
import secrets
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.hostdev import HostScanner, normalize_serial
from fabric_dra_testbed.stack import ApiServer, Emulator, Manager, NodeDirs, Plugin, Role, Stack
from kube_standin.kubelet_client import ClaimRef, DraCallError, DRAPluginClient, PluginManager, PrepareResult
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType
from plumbing.kube import ApiError, KubeClient, NotFound
from plumbing.kube.resources import NAMESPACES, RESOURCE_CLAIMS

__all__ = ["ChurnConfig", "ChurnReport", "run_churn", "topology_counts"]

DRIVER = "fabric-dra.io"
NAMESPACE = "churn"

_T = TypeVar("_T")

#: Per-claim errors that no retry can cure: the kubelet stops (the pod cannot start).
_PERMANENT = ("deleted before the kubelet prepared it", "the claim was replaced", "is not allocated")
#: An exception's repr in a message means the plugin hit something it did not expect.
_UNEXPECTED = re.compile(r"failed unexpectedly|Traceback|\bfailed: [A-Za-z_.]+(Error|Exception)?\(")


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChurnConfig:
    claims: int = 1000
    nodes: int = 50
    devices: int = 200
    seed: str = "1"
    #: pods alive at once (0: a third of the devices, at least 4)
    concurrency: int = 0
    #: plugin processes at once; the nodes run in waves of this size (0: all at once)
    plugins_per_wave: int = 0
    #: mean time a prepared pod holds its devices (exponential)
    hold_seconds: float = 0.3
    #: prepare calls per claim before the kubelet gives up and reports the error
    max_attempts: int = 8
    latency: str = "instant"
    #: how often the emulator's binding table and the host trees are read
    poll_seconds: float = 0.2
    sysfs_poll_seconds: float = 1.0
    work_dir: Path | None = None
    keep: bool = False
    # hostile pods, as fractions of all pods
    delete_before_prepare: float = 0.03
    delete_mid_prepare: float = 0.04
    stale_allocation: float = 0.05
    double_prepare: float = 0.05
    double_unprepare: float = 0.05
    two_claims: float = 0.15

    def pods_at_once(self) -> int:
        return self.concurrency or max(4, self.devices // 3)


def topology_counts(devices: int) -> dict[str, int]:
    """Arguments of ``topology generate`` for ``devices`` targets: CXL chunks (4 per CXL device,
    one CXL device per 50 targets, at least one from 12 targets on), and PCIe devices — 15 % NVMe,
    5 % NICs, 5 % FPGAs, GPUs the rest."""
    if devices < 5:
        raise ValueError("at least 5 devices")
    cxl = max(devices // 50, 1 if devices >= 12 else 0)
    pcie = devices - 4 * cxl
    nvme, nics, fpgas = max(1, pcie * 15 // 100), max(1, pcie * 5 // 100), max(1, pcie * 5 // 100)
    return {
        "gpus": pcie - nvme - nics - fpgas,
        "nvme": nvme,
        "nics": nics,
        "fpgas": fpgas,
        "cxl-devices": cxl,
        "chunks": 4,
    }


# -- the processes --------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class ChurnStack:
    """Emulator (HTTPS, authentication), API test server, manager (static tokens: one per node);
    plugins started and stopped per wave. Built with :class:`fabric_dra_testbed.stack.Stack`; always
    stopped."""

    def __init__(self, config: ChurnConfig) -> None:
        self.config = config
        # Unix socket paths are limited to 107 bytes: a short root under /tmp.
        self.root = Path(tempfile.mkdtemp(prefix="fdc-", dir=str(config.work_dir or "/tmp")))
        self.builder = Stack(self.root)
        self.manager_state = self.root / "mgr"
        self.ca_file = self.root / "ca.pem"
        self.emulator_handle: Emulator | None = None
        self.manager_handle: Manager | None = None
        self.apiserver: ApiServer | None = None
        self.hosts: list[str] = []
        self.nodes: dict[str, NodeDirs] = {}
        self._plugins: dict[str, Plugin] = {}
        self.plugins: dict[str, Role] = {}
        self.operator_token = secrets.token_urlsafe(24)
        self.emulator_auth: tuple[str, str] = ("", "")
        self.cpu: dict[str, float] = defaultdict(float)
        self.peak_rss: dict[str, float] = defaultdict(float)

    @property
    def emulator(self) -> Role | None:
        return self.emulator_handle.role if self.emulator_handle is not None else None

    @property
    def manager(self) -> Role | None:
        return self.manager_handle.role if self.manager_handle is not None else None

    # topology and core processes

    def generate_topology(self) -> Path:
        path = self.root / "topology.yaml"
        counts = topology_counts(self.config.devices)
        args = [sys.executable, "-m", "fabric_dra", "emulator", "topology", "generate"]
        args += ["--hosts", str(self.config.nodes)]
        for flag, value in counts.items():
            args += [f"--{flag}", str(value)]
        args += ["--seed", f"churn-{self.config.seed}", "--output-file", str(path)]
        subprocess.run(args, check=True, capture_output=True)
        return path

    def start(self) -> ChurnStack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        topology = self.generate_topology()
        # A throw-away CA and the emulator's certificate: the manager talks verified HTTPS.
        ca, cert, key = self.builder.certificates("emulator")
        shutil.copyfile(ca, self.ca_file)
        emulator = self.builder.emulator(topology=topology, latency=self.config.latency, tls=(cert, key))
        self.emulator_handle = emulator
        self.emulator_auth = emulator.credentials or ("", "")
        self.hosts = emulator.hosts()
        self.apiserver = self.builder.apiserver(validate_versions="1.34")
        tokens: dict[str, tuple[str, str | None]] = {self.operator_token: ("operator", None)}
        for host in self.hosts:
            node = self.builder.node_dirs(host).make()
            token = secrets.token_urlsafe(24)
            node.token_file.write_text(token)
            tokens[token] = ("plugin", host)
            self.nodes[host] = node
        self.manager_handle = self.builder.manager(
            emulator,
            state_dir=self.manager_state,
            static_tokens=tokens,
            redfish_args=[
                *("--redfish-credentials-file", str(emulator.credentials_file)),
                *("--redfish-ca-file", str(self.ca_file)),
            ],
            ready_timeout=180,
        )

    def start_plugins(self, nodes: Sequence[str]) -> None:
        """Start the plugins of ``nodes`` side by side (each waits for its ready file)."""
        assert self.apiserver is not None and self.manager_handle is not None
        for name in nodes:
            if name not in self._plugins:
                self._plugins[name] = self.builder.plugin(
                    name,
                    self.manager_handle,
                    self.apiserver,
                    dirs=self.nodes[name],
                    sysfs_root=self.sysfs(name),
                    token_file=self.nodes[name].token_file,
                    start=False,
                )
                self._plugins[name].role.start_timeout = 180
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            futures = {pool.submit(self._plugins[name].role.start): name for name in nodes}
            errors = []
            for future in concurrent.futures.as_completed(futures):
                name = futures[future]
                try:
                    future.result()
                    self.plugins[name] = self._plugins[name].role
                except Exception as err:
                    errors.append(f"{name}: {err}")
        if errors:
            raise RuntimeError("plugins did not start: " + "; ".join(errors))

    def stop_plugins(self, nodes: Sequence[str]) -> list[str]:
        """SIGTERM; returns the nodes whose plugin did not exit 0."""
        bad = []
        for name in nodes:
            process = self.plugins.pop(name, None)
            if process is None:
                continue
            self._account("plugins", process)
            if process.stop() != 0:
                bad.append(name)
        return bad

    def cpu_snapshot(self) -> dict[str, float]:
        """CPU seconds used so far per role (plugins summed, stopped ones included) and by this
        process (the kubelets, the scheduler and the checks)."""
        out = {role: _cpu_seconds(p.pid) for role, p in self._core()}
        out["plugins"] = self.cpu["plugins"] + sum(_cpu_seconds(p.pid) for p in self.plugins.values())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["bench (kubelets, checks)"] = usage.ru_utime + usage.ru_stime
        return out

    def _account(self, role: str, process: Role) -> None:
        if process.alive():
            self.cpu[role] += _cpu_seconds(process.pid)

    def sample_rss(self) -> None:
        for role, process in self._core():
            self.peak_rss[role] = max(self.peak_rss[role], _rss_mib(process.pid))
        total = sum(_rss_mib(p.pid) for p in self.plugins.values())
        self.peak_rss["plugins"] = max(self.peak_rss["plugins"], total)

    def _core(self) -> list[tuple[str, Role]]:
        out = [("emulator", self.emulator), ("manager", self.manager)]
        if self.apiserver is not None:
            out.append(("apiserver", self.apiserver.role))
        return [(role, p) for role, p in out if p is not None and p.alive()]

    def sysfs(self, host: str) -> Path:
        assert self.emulator_handle is not None
        return self.emulator_handle.sysfs(host)

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def close(self) -> None:
        self.stop_plugins(list(self.plugins))
        for role, process in self._core():
            self._account(role, process)
        try:
            self.builder.stop()
        finally:
            if not self.config.keep:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ChurnStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- what happened ---------------------------------------------------------------------------------


@dataclass
class Window:
    """From the first prepare call of a claim until its unprepare succeeded: a binding of the
    claim's device to its node is explained inside this window."""

    claim: str
    node: str
    start: float
    end: float | None = None


@dataclass
class Held:
    """From a successful prepare answer until the kubelet starts to unprepare: the pod uses it."""

    claim: str
    node: str
    start: float
    end: float | None = None


@dataclass
class ClaimRecord:
    name: str
    node: str
    devices: list[Device]
    kind: str
    uid: str = ""
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    prepared_after: float | None = None
    unprepared: bool = False
    broken: bool = False

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(NAMESPACE, self.name, self.uid)

    @property
    def outcome(self) -> str:
        """completed (prepared, then unprepared), failed-clean (never prepared, every error a clear
        per-claim one, unprepared), or broken."""
        if self.broken or not self.unprepared:
            return "broken"
        return "completed" if self.prepared_after is not None else "failed-clean"


@dataclass
class ChurnReport:
    config: dict[str, Any]
    figures: dict[str, Any]
    violations: list[str]
    leaks: list[str]
    broken: list[str]

    @property
    def ok(self) -> bool:
        return not (self.violations or self.leaks or self.broken)


def _pct(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))]


def _ms(values: Sequence[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    return {
        "p50_ms": round(_pct(values, 50) * 1000, 1),
        "p99_ms": round(_pct(values, 99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "mean_ms": round(statistics.fmean(values) * 1000, 1),
        "n": len(values),
    }


# -- the run ---------------------------------------------------------------------------------------

POD_KINDS = (
    "delete-before-prepare",
    "delete-mid-prepare",
    "stale-allocation",
    "double-prepare",
    "double-unprepare",
)


@dataclass(frozen=True)
class PodPlan:
    """Everything random about one pod, drawn from its own seeded generator up front."""

    index: int
    node: str
    kind: str
    sizes: tuple[int, ...]
    hold_seconds: float
    delete_after: float

    @classmethod
    def draw(cls, config: ChurnConfig, index: int, nodes: Sequence[str]) -> PodPlan:
        rng = random.Random(f"{config.seed}:{index}")
        node = rng.choice(sorted(nodes))
        roll, kind = rng.random(), "normal"
        for name in POD_KINDS:
            share = float(getattr(config, name.replace("-", "_")))
            if roll < share:
                kind = name
                break
            roll -= share
        claims = 2 if rng.random() < config.two_claims and kind != "stale-allocation" else 1
        sizes = tuple(rng.choices([1, 2, 3], weights=[75, 20, 5])[0] for _ in range(claims))
        hold = rng.expovariate(1.0 / config.hold_seconds) if config.hold_seconds > 0 else 0.0
        return cls(index, node, kind, sizes, hold, rng.uniform(0.0, 0.08))


@dataclass
class Violation:
    category: str  # double-binding | stray-binding | answer | visibility
    message: str


class ChurnScheduler:
    """The scheduler of a run: allocates free devices of the catalog to each claim (a stale
    allocation on purpose where the pod's kind asks), and writes the claim as the scheduler
    leaves it, allocated and reserved for its pod."""

    def __init__(self, catalog: list[Device]) -> None:
        self.catalog = {d.name: d for d in catalog}
        #: device → names of the live claims allocated to it (two only with a stale allocation)
        self.allocated: dict[str, set[str]] = {d.name: set() for d in catalog}
        self.freed = asyncio.Condition()
        #: the API server's client, once the run has one
        self.kube: KubeClient | None = None

    async def allocate(self, rng: random.Random, claim: str, count: int, stale: bool) -> list[Device]:
        """``count`` devices for ``claim``: free ones (waits until enough are free, as a pending
        pod does); with ``stale`` one of them is a device another live claim holds."""
        picked: list[str] = []
        if stale:
            taken = sorted(name for name, owners in self.allocated.items() if len(owners) == 1)
            if taken:
                picked.append(rng.choice(taken))
        async with self.freed:
            while True:
                free = sorted(n for n, owners in self.allocated.items() if not owners and n not in picked)
                if len(free) >= count - len(picked):
                    break
                await self.freed.wait()
            picked += rng.sample(free, count - len(picked))
            for name in picked:  # no await since the check: nobody else took them
                self.allocated[name].add(claim)
        return [self.catalog[name] for name in picked]

    async def release(self, records: Sequence[ClaimRecord]) -> None:
        async with self.freed:
            for record in records:
                for device in record.devices:
                    self.allocated[device.name].discard(record.name)
            self.freed.notify_all()

    async def create_claim(self, name: str, node: str, devices: list[Device]) -> str:
        """A ResourceClaim allocated to ``devices`` on ``node`` and reserved for a pod, as the
        scheduler leaves it; returns its UID."""
        assert self.kube is not None
        requests = [f"r{i}" for i in range(len(devices))]
        created = await self.kube.create(
            RESOURCE_CLAIMS,
            {
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": r, "exactly": {"deviceClassName": f"fabric-{d.type.value}"}}
                            for r, d in zip(requests, devices, strict=True)
                        ]
                    }
                },
            },
            NAMESPACE,
        )
        created["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": d.pool, "device": d.name}
                        for r, d in zip(requests, devices, strict=True)
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": secrets.token_hex(16)}],
        }
        updated = await self.kube.replace(RESOURCE_CLAIMS, created, subresource="status")
        return str(updated["metadata"]["uid"])

    async def delete_claim(self, record: ClaimRecord) -> None:
        assert self.kube is not None
        with contextlib.suppress(NotFound):
            await self.kube.delete(RESOURCE_CLAIMS, record.name, NAMESPACE)


class Churn:
    """The scheduler, the kubelets and the checks, for one run over a stack."""

    def __init__(self, stack: ChurnStack, config: ChurnConfig, catalog: list[Device]) -> None:
        self.stack = stack
        self.config = config
        self.scheduler = ChurnScheduler(catalog)
        self.catalog = self.scheduler.catalog
        self.windows: dict[str, list[Window]] = defaultdict(list)
        self.held: dict[str, list[Held]] = defaultdict(list)
        self.records: list[ClaimRecord] = []
        self.violations: list[Violation] = []
        self.kubelets: dict[str, PluginManager] = {}
        self.prepare_calls: list[float] = []
        self.unprepare_calls: list[float] = []
        self.call_errors: Counter[str] = Counter()
        self.error_kinds: Counter[str] = Counter()
        self.pod_kinds: Counter[str] = Counter()
        self.binding_polls = 0
        self.sysfs_polls = 0
        self.max_bound = 0
        self.stopped = asyncio.Event()
        self.claims_planned = 0
        self.pods_started = 0
        #: CPU seconds per role while pods ran
        self.cpu: dict[str, float] = defaultdict(float)
        #: what the manager counted while pods ran (see :func:`manager_metrics`)
        self.manager_metrics: dict[str, float] = defaultdict(float)

    def violation(self, category: str, message: str) -> None:
        self.violations.append(Violation(category, message))

    # the kubelet ---------------------------------------------------------------------------

    async def _dra_call(
        self,
        rpc: str,
        call: Callable[[DRAPluginClient, Sequence[ClaimRef]], Awaitable[dict[str, _T]]],
        node: str,
        refs: list[ClaimRef],
        durations: list[float],
    ) -> dict[str, _T] | None:
        """One ``rpc`` to the plugin of ``node``, timed into ``durations``; None when the call
        itself failed (counted), and an answer that leaves out a claim is a violation."""
        client = self.kubelets[node].plugin(DRIVER)
        if client is None:
            self.call_errors["plugin not registered"] += 1
            return None
        started = time.monotonic()
        try:
            answers = await call(client, refs)
        except DraCallError as err:
            self.call_errors[f"{rpc} {err.code.name if err.code else 'failed'}"] += 1
            return None
        durations.append(time.monotonic() - started)
        for ref in refs:
            if ref.uid not in answers:
                self.violation("answer", f"{rpc} on {node} left out claim {ref.name}")
        return answers

    async def _prepare_call(self, node: str, refs: list[ClaimRef]) -> dict[str, PrepareResult] | None:
        return await self._dra_call(
            "NodePrepareResources", DRAPluginClient.node_prepare_resources, node, refs, self.prepare_calls
        )

    async def _unprepare_call(self, node: str, refs: list[ClaimRef]) -> dict[str, str] | None:
        return await self._dra_call(
            "NodeUnprepareResources",
            DRAPluginClient.node_unprepare_resources,
            node,
            refs,
            self.unprepare_calls,
        )

    def _check_prepared(self, record: ClaimRecord, result: PrepareResult) -> None:
        """The answer names exactly the allocated devices, each with one CDI device ID, a spec
        file on disk, and the device in the node's sysfs tree."""
        answered = sorted((d.pool, d.device) for d in result.devices)
        wanted = sorted((d.pool, d.name) for d in record.devices)
        if answered != wanted:
            self.violation("answer", f"claim {record.name}: prepare answered {answered}, allocated {wanted}")
        if any(len(d.cdi_device_ids) != 1 for d in result.devices):
            self.violation("answer", f"claim {record.name}: a device without exactly one CDI device ID")
        node = self.stack.nodes[record.node]
        if not cdi.spec_files_of_claim(node.cdi_root, DRIVER, record.uid):
            self.violation("answer", f"claim {record.name}: prepared on {record.node} without a CDI spec")
        scanner = HostScanner(self.stack.sysfs(record.node), real_host=False)
        for device in record.devices:
            if scanner.find(identity_of(device)) is None:
                self.violation(
                    "visibility",
                    f"claim {record.name}: {device.name} prepared but not in {record.node}'s sysfs",
                )

    def _hold_start(self, record: ClaimRecord, now: float) -> None:
        for device in record.devices:
            for other in self.held[device.name]:
                if other.end is None and other.claim != record.name:
                    self.violation(
                        "double-binding",
                        f"{device.name} prepared for claim {record.name} on {record.node} while claim "
                        f"{other.claim} on {other.node} still holds it",
                    )
            if not any(h.claim == record.name and h.end is None for h in self.held[device.name]):
                self.held[device.name].append(Held(record.name, record.node, now))

    def _hold_end(self, record: ClaimRecord) -> None:
        now = time.monotonic()
        for device in record.devices:
            for held in self.held[device.name]:
                if held.claim == record.name and held.end is None:
                    held.end = now

    async def _prepare(self, records: list[ClaimRecord]) -> None:
        """The kubelet's pod sync: prepare the claims not prepared yet; on errors back off and
        call again, up to ``max_attempts`` calls; a claim deleted or replaced is not retried."""
        node = records[0].node
        todo = [r for r in records if r.prepared_after is None]
        delay, started = 0.1, time.monotonic()
        for attempt in range(self.config.max_attempts):
            if not todo:
                return
            if attempt:
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
            for record in todo:
                record.attempts += 1
            results = await self._prepare_call(node, [r.ref for r in todo])
            if results is None:
                continue
            left: list[ClaimRecord] = []
            for record in todo:
                result = results.get(record.uid)
                if result is None:
                    left.append(record)
                elif result.ok:
                    if record.prepared_after is None:
                        record.prepared_after = time.monotonic() - started
                        self._check_prepared(record, result)
                        self._hold_start(record, time.monotonic())
                else:
                    record.errors.append(result.error)
                    kind = classify_error(result.error)
                    self.error_kinds[kind] += 1
                    if kind == "unexpected":
                        record.broken = True
                    elif not any(p in result.error for p in _PERMANENT):
                        left.append(record)
            todo = left

    async def _unprepare(self, records: list[ClaimRecord], twice: bool) -> None:
        """The kubelet's pod removal: unprepare every claim until it succeeds."""
        node = records[0].node
        todo = list(records)
        delay = 0.1
        for attempt in range(40):
            if not todo:
                break
            if attempt:
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
            refs = [r.ref for r in todo]
            calls = [self._unprepare_call(node, refs)]
            if twice and attempt == 0:
                calls.append(self._unprepare_call(node, refs))
            answers = [a for a in await asyncio.gather(*calls) if a is not None]
            left = []
            for record in todo:
                errors = [a[record.uid] for a in answers if record.uid in a]
                for error in errors:
                    if error:
                        record.errors.append(f"unprepare: {error}")
                        if classify_error(error) == "unexpected":
                            record.broken = True
                if not errors or all(errors):
                    left.append(record)
            todo = left
        now = time.monotonic()
        for record in records:
            if record in todo:
                record.broken = True
                record.errors.append("unprepare never succeeded")
                continue
            record.unprepared = True
            for device in record.devices:
                for window in self.windows[device.name]:
                    if window.claim == record.name and window.end is None:
                        window.end = now

    # one pod ---------------------------------------------------------------------------------

    async def pod(self, plan: PodPlan) -> None:
        rng = random.Random(f"{self.config.seed}:{plan.index}:devices")
        self.pod_kinds[plan.kind] += 1
        records: list[ClaimRecord] = []
        try:
            for c, size in enumerate(plan.sizes):
                name = f"p{plan.index}-c{c}"
                stale = plan.kind == "stale-allocation" and c == 0
                devices = await self.scheduler.allocate(rng, name, size, stale)
                record = ClaimRecord(name, plan.node, devices, plan.kind)
                records.append(record)
                self.records.append(record)
                record.uid = await self.scheduler.create_claim(name, plan.node, devices)
            now = time.monotonic()
            for record in records:
                for device in record.devices:
                    self.windows[device.name].append(Window(record.name, plan.node, now))
            deleter: asyncio.Task[None] | None = None
            if plan.kind == "delete-before-prepare":
                for record in records:
                    await self.scheduler.delete_claim(record)
            elif plan.kind == "delete-mid-prepare":

                async def delete_soon() -> None:
                    await asyncio.sleep(plan.delete_after)
                    for record in records:
                        await self.scheduler.delete_claim(record)

                deleter = asyncio.create_task(delete_soon())
            if plan.kind == "double-prepare":
                await asyncio.gather(self._prepare(records), self._prepare(records))
            else:
                await self._prepare(records)
            if deleter is not None:
                await deleter
            if any(r.prepared_after is not None for r in records):
                await asyncio.sleep(plan.hold_seconds)
            for record in records:
                self._hold_end(record)
            await self._unprepare(records, twice=plan.kind == "double-unprepare")
            for record in records:
                await self.scheduler.delete_claim(record)
        except Exception as err:
            for record in records:
                record.broken = True
                record.errors.append(f"the pod's run failed: {err!r}")
        finally:
            await self.scheduler.release(records)

    # monitors --------------------------------------------------------------------------------

    async def watch_bindings(self) -> None:
        """Poll the emulator's binding table; every binding must be explained by a live claim of
        that device on that node, and no target may be bound to two hosts."""
        assert self.stack.emulator is not None
        url = f"{self.stack.emulator.address}/redfish/v1/Oem/FabricDRA/Bindings"
        async with httpx.AsyncClient(
            auth=self.stack.emulator_auth, verify=self.stack.tls(), timeout=30
        ) as http:
            while not self.stopped.is_set():
                t0 = time.monotonic()
                response = await http.get(url)
                t1 = time.monotonic()
                response.raise_for_status()
                self.binding_polls += 1
                self.check_bindings(response.json().get("Bindings") or [], t0, t1)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopped.wait(), self.config.poll_seconds)

    def check_bindings(self, bindings: list[dict[str, Any]], t0: float, t1: float) -> None:
        self.max_bound = max(self.max_bound, len({b["Target"] for b in bindings}))
        self.violations += binding_violations(bindings, self.windows, t0, t1)

    async def watch_sysfs(self) -> None:
        """Read every host's tree: a PCIe device in one host at most, a CXL device with no more
        regions than chunks."""
        chunks: Counter[str] = Counter(
            normalize_serial(d.serial) or ""
            for d in self.catalog.values()
            if d.type is DeviceType.CXL_MEMORY and d.serial
        )
        while not self.stopped.is_set():
            pci, cxl = await asyncio.to_thread(self._scan_hosts)
            self.sysfs_polls += 1
            for serial, where in pci.items():
                if len(where) > 1:
                    self.violation("double-binding", f"PCIe device {serial} in the sysfs of {sorted(where)}")
            for serial, regions in cxl.items():
                if regions > chunks.get(serial, 0):
                    self.violation("double-binding", f"CXL device {serial}: {regions} regions in host trees")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), self.config.sysfs_poll_seconds)

    def _scan_hosts(self) -> tuple[dict[str, set[str]], Counter[str]]:
        pci: dict[str, set[str]] = defaultdict(set)
        cxl: Counter[str] = Counter()
        for host in self.stack.hosts:
            found = host_tree_contents(self.stack.sysfs(host), identified_only=True)
            for serial in found["pci"]:
                pci[serial].add(host)
            cxl.update(found["cxl-regions"])
        return pci, cxl

    async def watch_resources(self) -> None:
        while not self.stopped.is_set():
            self.stack.sample_rss()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), 2.0)

    # a wave of nodes -------------------------------------------------------------------------

    async def run_wave(self, nodes: list[str], claims: int) -> None:
        """Register the nodes' plugins with their kubelets and run pods on them until ``claims``
        claims were created and every pod ended."""
        tasks = []
        for node in nodes:
            kubelet = PluginManager(self.stack.nodes[node].registry_dir, watch_health=True)
            self.kubelets[node] = kubelet
            tasks.append(asyncio.create_task(kubelet.run()))
        try:
            await asyncio.gather(*(self.kubelets[n].wait_for_plugin(DRIVER, within=180) for n in nodes))
            target = self.claims_planned + claims
            running: set[asyncio.Task[None]] = set()
            limit = self.config.pods_at_once()
            while self.claims_planned < target or running:
                while self.claims_planned < target and len(running) < limit:
                    plan = PodPlan.draw(self.config, self.pods_started, nodes)
                    self.pods_started += 1
                    self.claims_planned += len(plan.sizes)
                    running.add(asyncio.create_task(self.pod(plan)))
                _done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for node in nodes:
                self.kubelets.pop(node, None)


def binding_violations(
    bindings: Sequence[dict[str, Any]], windows: dict[str, list[Window]], t0: float, t1: float
) -> list[Violation]:
    """What is wrong with one read of the emulator's binding table, taken between ``t0`` and
    ``t1``: a target listed twice or bound to two hosts (double binding), or a binding that no
    claim of that device on that host explains in that time (stray binding)."""
    found: list[Violation] = []
    rows = Counter(str(b["Target"]) for b in bindings)
    hosts: dict[str, set[str]] = defaultdict(set)
    for binding in bindings:
        hosts[str(binding["Target"])].add(str(binding["Host"]))
    for target, bound_to in sorted(hosts.items()):
        if len(bound_to) > 1 or rows[target] > 1:
            found.append(Violation("double-binding", f"{target} is bound to {sorted(bound_to)} at once"))
        for host in sorted(bound_to):
            explained = any(
                w.node == host and w.start <= t1 and (w.end is None or w.end >= t0)
                for w in windows.get(target, [])
            )
            if not explained:
                found.append(
                    Violation("stray-binding", f"{target} bound to {host}: no live claim there explains it")
                )
    return found


def classify_error(error: str) -> str:
    """What a per-claim error says, for the figures; ``unexpected`` is a defect."""
    if _UNEXPECTED.search(error):
        return "unexpected"
    if "deleted before the kubelet prepared it" in error:
        return "claim deleted"
    if " is in use" in error:
        return "device in use"
    if "still attaching" in error or "still detaching" in error:
        return "still working"
    return "other"


def host_tree_contents(sys_root: Path, *, identified_only: bool = False) -> dict[str, list[str]]:
    """What a host's emulated sysfs holds: PCIe serials, CXL regions (by memdev serial), DAX
    devices, memdevs, IOMMU groups and NVMe controllers.

    An entry whose serial cannot be read is named by its own directory; ``identified_only``
    leaves such entries out instead — a device being added or removed at that moment, which the
    live double-binding check must not mistake for a device no claim holds."""

    def names(*parts: str) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(os.listdir(sys_root.joinpath(*parts)))
        return []

    def read(path: Path) -> str:
        with contextlib.suppress(OSError):
            return path.read_text().strip()
        return ""

    pci = []
    for bdf in names("bus/pci/devices"):
        serial = normalize_serial(read(sys_root / "bus/pci/devices" / bdf / "serial"))
        if serial or not identified_only:
            pci.append(serial or bdf)
    cxl = names("bus", "cxl", "devices")
    regions = []
    for region in (n for n in cxl if n.startswith("region")):
        memdev = read(sys_root / "bus/cxl/devices" / region / "target0")
        serial = normalize_serial(read(sys_root / "bus/cxl/devices" / memdev / "serial"))
        if serial or not identified_only:
            regions.append(serial or region)
    return {
        "pci": pci,
        "cxl-regions": regions,
        "memdevs": [n for n in cxl if n.startswith("mem")],
        "dax": names("bus", "dax", "devices"),
        "iommu-groups": names("kernel", "iommu_groups"),
        "nvme": names("class", "nvme"),
    }


# -- leaks at the end ------------------------------------------------------------------------------


async def find_leaks(stack: ChurnStack, nodes: Sequence[str]) -> list[str]:
    """Everything still held anywhere after the run: emulator bindings and tasks, manager devices,
    operations and ledger entries, host trees, CDI files, checkpoints, claims."""
    assert stack.emulator is not None and stack.manager is not None
    leaks: list[str] = []
    async with httpx.AsyncClient(auth=stack.emulator_auth, verify=stack.tls(), timeout=30) as http:
        table = (await http.get(f"{stack.emulator.address}/redfish/v1/Oem/FabricDRA/Bindings")).json()
    leaks += [f"emulator: {b['Target']} still bound to {b['Host']}" for b in table.get("Bindings") or []]
    leaks += [
        f"emulator: {t['Operation']} of {t['Target']} still in flight" for t in table.get("InFlight") or []
    ]
    async with ManagerClient(stack.manager.address, token=stack.operator_token, timeout=30) as client:
        inventory = await client.inventory()
        operations = await client.operations()
    for device in inventory.devices:
        if device.state is not BindingState.FREE or device.claim_uid or not device.managed:
            leaks.append(f"manager: {device.name} is {device.state.value} (claim {device.claim_uid})")
    leaks += [
        f"manager: operation {op.id} ({op.kind.value} {op.device}) is {op.state.value}"
        for op in operations
        if op.state.value in ("pending", "running")
    ]
    ledger = stack.manager_state / "ledger.json"
    if ledger.exists():
        entries = json.loads(ledger.read_text()).get("entries") or {}
        leaks += [f"manager ledger: entry for {name}" for name in entries]
    for host in stack.hosts:
        for what, found in host_tree_contents(stack.sysfs(host)).items():
            if found:
                leaks.append(f"sysfs of {host}: {what} {found}")
    for name in nodes:
        node = stack.nodes[name]
        if node.cdi_root.is_dir():
            leaks += [f"CDI spec {p} on {name}" for p in sorted(node.cdi_root.iterdir())]
        leaks += [f"quarantined checkpoint {p}" for p in node.plugin_dir.glob("checkpoint.json.corrupt-*")]
        store = CheckpointStore(node.plugin_dir / "checkpoint.json", driver=DRIVER, node=name)
        store.load()
        leaks += [
            f"checkpoint of {name}: claim {entry.name} ({entry.state.value})"
            for entry in store.claims().values()
        ]
    assert stack.apiserver is not None
    async with stack.apiserver.client() as kube:
        remaining = await kube.list(RESOURCE_CLAIMS, NAMESPACE)
    leaks += [f"API server: ResourceClaim {c['metadata']['name']}" for c in remaining.get("items") or []]
    return leaks


# -- putting it together ---------------------------------------------------------------------------


_SAMPLE = re.compile(r"^(fabric_dra_[a-z_]+)\{([^}]*)\} ([0-9.e+-]+)$")


async def manager_metrics(stack: ChurnStack) -> dict[str, float]:
    """Counters from the manager's /metrics: Redfish requests by method and resource, and the
    count and sum of its attach and detach durations."""
    assert stack.manager is not None
    auth = {"Authorization": f"Bearer {stack.operator_token}"}  # /metrics is for operators
    async with httpx.AsyncClient(timeout=30, headers=auth) as http:
        text = (await http.get(f"{stack.manager.address}/metrics")).text
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if name == "fabric_dra_redfish_request_duration_seconds_count":
            out[f"redfish {label.get('method')} {label.get('resource')}"] += float(value)
        elif name.startswith(("fabric_dra_attach_duration_seconds_", "fabric_dra_detach_duration_seconds_")):
            kind = name.removeprefix("fabric_dra_").split("_", 1)[0]
            if name.endswith("_count"):
                out[f"{kind} count"] += float(value)
            elif name.endswith("_sum"):
                out[f"{kind} seconds"] += float(value)
    return out


def waves(nodes: Sequence[str], per_wave: int) -> list[list[str]]:
    if per_wave <= 0 or per_wave >= len(nodes):
        return [list(nodes)]
    return [list(nodes[i : i + per_wave]) for i in range(0, len(nodes), per_wave)]


async def _churn(stack: ChurnStack, config: ChurnConfig) -> tuple[Churn, dict[str, Any]]:
    assert stack.manager is not None and stack.apiserver is not None
    async with ManagerClient(stack.manager.address, token=stack.operator_token, timeout=30) as client:
        catalog = [d for d in await client.devices() if d.managed and d.type is not DeviceType.OTHER]
    churn = Churn(stack, config, catalog)
    timings: dict[str, float] = {"plugin_start_s": 0.0, "churn_s": 0.0}
    async with stack.apiserver.client() as kube:
        churn.scheduler.kube = kube
        with contextlib.suppress(ApiError):
            await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        monitors = [
            asyncio.create_task(churn.watch_bindings()),
            asyncio.create_task(churn.watch_sysfs()),
            asyncio.create_task(churn.watch_resources()),
        ]
        try:
            groups = waves(stack.hosts, config.plugins_per_wave)
            done = 0
            for number, group in enumerate(groups):
                share = (
                    config.claims - done
                    if number == len(groups) - 1
                    else config.claims * len(group) // len(stack.hosts)
                )
                started = time.monotonic()
                await asyncio.to_thread(stack.start_plugins, group)
                timings["plugin_start_s"] += time.monotonic() - started
                started, cpu_before = time.monotonic(), stack.cpu_snapshot()
                metrics_before = await manager_metrics(stack)
                await churn.run_wave(group, share)
                timings["churn_s"] += time.monotonic() - started
                for role, seconds in stack.cpu_snapshot().items():
                    churn.cpu[role] += seconds - cpu_before.get(role, 0.0)
                for key, value in (await manager_metrics(stack)).items():
                    churn.manager_metrics[key] += value - metrics_before.get(key, 0.0)
                done += share
                stack.sample_rss()
                bad = await asyncio.to_thread(stack.stop_plugins, group)
                for name in bad:
                    churn.violation("answer", f"the plugin of {name} did not exit 0 on SIGTERM")
        finally:
            churn.stopped.set()
            results = await asyncio.gather(*monitors, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
    return churn, timings


def run_churn(config: ChurnConfig) -> ChurnReport:
    """Run the whole load test and return what was measured and what went wrong."""
    started = time.monotonic()
    with ChurnStack(config) as stack:
        setup_s = time.monotonic() - started
        churn, timings = asyncio.run(_churn(stack, config))
        leaks = asyncio.run(_settled_leaks(stack))
        peak = {role: round(mib, 1) for role, mib in stack.peak_rss.items()}
    figures = summarize(churn, timings, setup_s, time.monotonic() - started)
    figures["cpu_seconds_while_churning"] = {role: round(v, 1) for role, v in sorted(churn.cpu.items())}
    figures["peak_rss_mib"] = peak
    figures["manager"] = manager_figures(churn.manager_metrics)
    broken = [
        f"claim {r.name} on {r.node} ({r.kind}): {' | '.join(r.errors[-3:]) or 'no answer'}"
        for r in churn.records
        if r.outcome == "broken"
    ]
    broken += [f"{kind}: {count} call(s)" for kind, count in churn.call_errors.items()]
    violations = [f"{v.category}: {v.message}" for v in churn.violations]
    return ChurnReport(
        config=_config_json(config), figures=figures, violations=violations, leaks=leaks, broken=broken
    )


async def _settled_leaks(stack: ChurnStack, within: float = 15.0) -> list[str]:
    """Leaks, read again for a while if some remain (a manager pass may still be finishing)."""
    deadline = time.monotonic() + within
    while True:
        leaks = await find_leaks(stack, list(stack.nodes))
        if not leaks or time.monotonic() > deadline:
            return leaks
        await asyncio.sleep(0.5)


def _config_json(config: ChurnConfig) -> dict[str, Any]:
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in config.__dict__.items()}
    out["pods_at_once"] = config.pods_at_once()
    out["topology"] = topology_counts(config.devices)
    return out


def summarize(churn: Churn, timings: dict[str, float], setup_s: float, total_s: float) -> dict[str, Any]:
    outcomes = Counter(r.outcome for r in churn.records)
    failed = Counter(
        classify_error(r.errors[-1]) if r.errors else "no error"
        for r in churn.records
        if r.outcome == "failed-clean"
    )
    attached = sum(len(r.devices) for r in churn.records if r.outcome == "completed")
    churn_s = max(timings["churn_s"], 1e-9)
    categories = Counter(v.category for v in churn.violations)
    return {
        "claims": len(churn.records),
        "pods": churn.pods_started,
        "pod_kinds": dict(sorted(churn.pod_kinds.items())),
        "outcomes": dict(sorted(outcomes.items())),
        "failed_clean_by_reason": dict(sorted(failed.items())),
        "errors_seen_by_kind": dict(sorted(churn.error_kinds.items())),
        "grpc_call_errors": dict(churn.call_errors),
        "double_bindings": categories["double-binding"],
        "stray_bindings": categories["stray-binding"],
        "answer_violations": categories["answer"] + categories["visibility"],
        "devices_attached_and_detached": attached,
        "attached_by_type": dict(
            sorted(
                Counter(
                    d.type.value for r in churn.records if r.outcome == "completed" for d in r.devices
                ).items()
            )
        ),
        "throughput_claims_per_s": round(len(churn.records) / churn_s, 2),
        "throughput_attach_detach_pairs_per_s": round(attached / churn_s, 2),
        "prepare_call": _ms(churn.prepare_calls),
        "unprepare_call": _ms(churn.unprepare_calls),
        "claim_time_to_prepared": _ms(
            [r.prepared_after for r in churn.records if r.prepared_after is not None]
        ),
        "prepare_attempts_max": max((r.attempts for r in churn.records), default=0),
        "peak_devices_bound": churn.max_bound,
        "binding_table_polls": churn.binding_polls,
        "sysfs_polls": churn.sysfs_polls,
        "setup_s": round(setup_s, 1),
        "plugin_start_s": round(timings["plugin_start_s"], 1),
        "churn_s": round(timings["churn_s"], 1),
        "total_s": round(total_s, 1),
    }


def manager_figures(metrics: dict[str, float]) -> dict[str, Any]:
    """Mean attach/detach time inside the manager and Redfish requests per attach+detach pair."""
    pairs = max(1.0, metrics.get("attach count", 0.0))
    requests = {k.removeprefix("redfish "): v for k, v in metrics.items() if k.startswith("redfish ")}
    out: dict[str, Any] = {
        "attach_mean_ms": round(1000 * metrics.get("attach seconds", 0.0) / pairs, 1),
        "detach_mean_ms": round(
            1000 * metrics.get("detach seconds", 0.0) / max(1.0, metrics.get("detach count", 0.0)), 1
        ),
        "redfish_requests": int(sum(requests.values())),
        "redfish_requests_per_attach": round(sum(requests.values()) / pairs, 1),
        "redfish_requests_by_kind": {
            k: int(v) for k, v in sorted(requests.items(), key=lambda kv: -kv[1]) if v
        },
    }
    return out


def _print_summary(report: ChurnReport) -> None:
    f = report.figures
    c = report.config
    print(
        f"churn: {f['claims']} claims in {f['pods']} pods over {c['nodes']} nodes and {c['devices']} "
        f"devices (seed {c['seed']}, {c['pods_at_once']} pods at once, "
        f"plugins per wave: {c['plugins_per_wave'] or 'all'})"
    )
    print(f"  outcomes: {f['outcomes']}; failed cleanly by reason: {f['failed_clean_by_reason']}")
    print(f"  hostile pods: {f['pod_kinds']}")
    print(
        f"  double bindings: {f['double_bindings']}, stray bindings: {f['stray_bindings']}, "
        f"leaks: {len(report.leaks)}"
    )
    print(
        f"  throughput: {f['throughput_claims_per_s']} claims/s, "
        f"{f['throughput_attach_detach_pairs_per_s']} device attach+detach pairs/s over {f['churn_s']} s"
    )
    pc, uc, tp = f["prepare_call"], f["unprepare_call"], f["claim_time_to_prepared"]
    print(f"  NodePrepareResources p50 {pc.get('p50_ms')} ms p99 {pc.get('p99_ms')} ms (n={pc['n']})")
    print(f"  NodeUnprepareResources p50 {uc.get('p50_ms')} ms p99 {uc.get('p99_ms')} ms (n={uc['n']})")
    print(f"  claim time to prepared (with retries) p50 {tp.get('p50_ms')} ms p99 {tp.get('p99_ms')} ms")
    print(
        f"  setup {f['setup_s']} s, plugin start {f['plugin_start_s']} s, total {f['total_s']} s; "
        f"peak RSS MiB {f['peak_rss_mib']}"
    )
    print(f"  CPU seconds while pods ran: {f['cpu_seconds_while_churning']}")
    m = f["manager"]
    print(
        f"  manager: attach mean {m['attach_mean_ms']} ms, detach mean {m['detach_mean_ms']} ms, "
        f"{m['redfish_requests_per_attach']} Redfish requests per attach+detach: "
        + ", ".join(f"{k} {v}" for k, v in list(m["redfish_requests_by_kind"].items())[:8])
    )
    for title, items in (
        ("violations", report.violations),
        ("leaks", report.leaks),
        ("broken", report.broken),
    ):
        if items:
            print(f"  {title} ({len(items)}):")
            for item in items[:20]:
                print(f"    - {item}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = ChurnConfig()
    parser.add_argument(
        "--claims", type=int, default=defaults.claims, help="claims created in all (default: %(default)s)"
    )
    parser.add_argument(
        "--nodes", type=int, default=defaults.nodes, help="emulated nodes (default: %(default)s)"
    )
    parser.add_argument(
        "--devices", type=int, default=defaults.devices, help="fabric devices (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", default=defaults.seed, help="seed of every random choice (default: %(default)s)"
    )
    parser.add_argument("--concurrency", type=int, default=0, help="pods alive at once (default: devices/3)")
    parser.add_argument(
        "--plugins-per-wave",
        type=int,
        default=0,
        help="plugin processes at once; nodes run in waves (default: all)",
    )
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=defaults.hold_seconds,
        help="mean hold time (default: %(default)s)",
    )
    parser.add_argument("--latency", default="instant", help="emulator latency profile (default: instant)")
    parser.add_argument("--work-dir", type=Path, help="where the run's directory goes (default: /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, state)")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    config = ChurnConfig(
        claims=args.claims,
        nodes=args.nodes,
        devices=args.devices,
        seed=args.seed,
        concurrency=args.concurrency,
        plugins_per_wave=args.plugins_per_wave,
        hold_seconds=args.hold_seconds,
        latency=args.latency,
        work_dir=args.work_dir,
        keep=args.keep,
    )
    report = run_churn(config)
    _print_summary(report)
    if args.json:
        args.json.write_text(json.dumps(report.__dict__, indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
