"""The whole path as real processes, each of which a test may kill and restart.

    API test server ── plugin (node kind-worker) ── manager ── emulator (Redfish)
                   └── controller (binding conditions) ─┘

The emulator serves the packaged topology with authentication (the manager logs in with the
emulator's generated credentials) and the instant latency profile; tests that need a fabric task
inject ``HangTasks`` for one device, so a task exists exactly as long as the test wants. The
manager has API access (TokenReview, claims for the orphan reconciler, Events) and a static token
file for the plugin and controller. Every role keeps its port and state across restarts.

:class:`BindingMonitor` polls the emulator's own binding table the whole time and records every
binding it ever saw: a device bound to two hosts, or bound twice for one prepare, is caught even if
every process later agrees on a clean state.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import ssl
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.hostdev import HostScanner
from fabric_dra_testbed.stack import (
    ApiServer,
    Controller,
    Emulator,
    Manager,
    Plugin,
    Role,
    free_port,
    short_dir,
    trust,
)
from fabric_dra_testbed.stack import Stack as Builder
from kube_standin.kubelet_client import ClaimRef, DraCallError, DRAPluginClient, PluginManager
from manager_api.devices import MEMORY_CAPACITY
from manager_api.models import BindingState, Device, DeviceType, Inventory
from tests.support.kubelet import running_kubelet
from tests.support.waiting import wait_until

__all__ = [
    "DRIVER",
    "NODE",
    "BindingMonitor",
    "Role",
    "Stack",
    "running_stack",
]

DRIVER = "fabric-dra.io"
NODE = "kind-worker"
NAMESPACE = "reliability"
PLUGIN_TOKEN = "plugin-token-kind-worker-0001"
CONTROLLER_TOKEN = "controller-token-reliability-01"
OPERATOR_TOKEN = "operator-token-reliability-001"
ROOT = "/redfish/v1"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


@dataclass
class Episode:
    target: str
    host: str
    since: str


@dataclass
class BindingMonitor:
    """Polls the emulator's binding table (``Oem/FabricDRA/Bindings``) until stopped."""

    url: Callable[[], str]
    auth: Callable[[], tuple[str, str] | None]
    verify: Callable[[], ssl.SSLContext | bool] = lambda: trust(True)
    period: float = 0.05
    episodes: list[Episode] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    polls: int = 0
    _seen: set[tuple[str, str, str]] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> BindingMonitor:
        self._thread = threading.Thread(target=self._run, name="binding-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                answer = httpx.get(
                    f"{self.url()}{ROOT}/Oem/FabricDRA/Bindings",
                    auth=self.auth(),
                    verify=self.verify(),
                    timeout=5,
                )
                answer.raise_for_status()
                table = answer.json()
            except (httpx.HTTPError, ValueError):
                continue  # the emulator is down (a crash test): nothing to see
            self.observe(table.get("Bindings") or [])

    def observe(self, bindings: list[dict[str, Any]]) -> None:
        with self._lock:
            self.polls += 1
            hosts: dict[str, set[str]] = {}
            for b in bindings:
                target, host, since = str(b["Target"]), str(b["Host"]), str(b.get("Since"))
                hosts.setdefault(target, set()).add(host)
                if (target, host, since) not in self._seen:
                    self._seen.add((target, host, since))
                    self.episodes.append(Episode(target, host, since))
            for target, held in hosts.items():
                count = sum(1 for b in bindings if b["Target"] == target)
                if count > 1:
                    self.violations.append(f"{target} appears {count} times: bound to {sorted(held)}")

    def mark(self) -> int:
        with self._lock:
            return len(self.episodes)

    def episodes_of(self, target: str, since_mark: int = 0) -> list[Episode]:
        with self._lock:
            return [e for e in self.episodes[since_mark:] if e.target == target]

    def wait_for_poll(self) -> None:
        """Return after one more complete poll (so a change just made is seen)."""
        start = self.polls
        wait_until(lambda: self.polls >= start + 2, timeout=10, what="a poll of the binding table")


class Stack:
    """The processes (from :class:`fabric_dra_testbed.stack.Stack`, logging to ``root/<role>.log``) and what
    a reliability test asks of them. The TLS and Redfish attributes are read when a role (re)starts."""

    def __init__(
        self,
        root: Path,
        *,
        orphan_grace: float = 1.0,
        manager_args: Sequence[str] = (),
        plugin_args: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.orphan_grace = orphan_grace
        self.manager_args = list(manager_args)
        self.plugin_extra = list(plugin_args)
        self.builder = Builder(root, logs_dir=root, driver_name=DRIVER)
        self.apiserver: ApiServer | None = None
        self.http: httpx.Client | None = None
        self._emulator: Emulator | None = None
        self._manager: Manager | None = None
        self._plugin: Plugin | None = None
        self._controller: Controller | None = None
        self.monitor = BindingMonitor(
            url=lambda: self.emulator_url, auth=self.emu_auth, verify=self.emu_verify
        )
        self.tokens = {
            PLUGIN_TOKEN: ("plugin", NODE),
            CONTROLLER_TOKEN: ("controller", None),
            OPERATOR_TOKEN: ("operator", None),
        }
        (root / "plugin.token").write_text(PLUGIN_TOKEN + "\n")
        (root / "controller.token").write_text(CONTROLLER_TOKEN + "\n")

    # -- the roles, each of which a test may kill and restart ----------------------------------------

    @property
    def emulator(self) -> Role:
        assert self._emulator is not None
        return self._emulator.role

    @property
    def manager(self) -> Role:
        assert self._manager is not None
        return self._manager.role

    @property
    def plugin(self) -> Role:
        assert self._plugin is not None
        return self._plugin.role

    @property
    def controller(self) -> Role:
        assert self._controller is not None
        return self._controller.role

    # -- what a test may change between two lives of a role -----------------------------------------

    @property
    def emulator_tls(self) -> tuple[Path, Path] | None:
        """(certificate, key) the emulator serves HTTPS with; None: plain HTTP."""
        assert self._emulator is not None
        return self._emulator.tls

    @emulator_tls.setter
    def emulator_tls(self, value: tuple[Path, Path] | None) -> None:
        assert self._emulator is not None
        self._emulator.tls = value

    @property
    def redfish_args(self) -> list[str]:
        """Manager flags for the Redfish connection (CA file, --redfish-insecure, credentials)."""
        assert self._manager is not None
        return self._manager.redfish_args[len(self._redfish_login()) :]

    @redfish_args.setter
    def redfish_args(self, value: list[str]) -> None:
        assert self._manager is not None
        self._manager.redfish_args = [*self._redfish_login(), *value]

    def _redfish_login(self) -> list[str]:
        return ["--redfish-credentials-file", str(self.emu_state / "credentials.json")]

    @property
    def manager_tls(self) -> tuple[Path, Path] | None:
        """(certificate, key) the manager serves HTTPS with; None: plain HTTP."""
        assert self._manager is not None
        return self._manager.tls

    @manager_tls.setter
    def manager_tls(self, value: tuple[Path, Path] | None) -> None:
        assert self._manager is not None
        self._manager.tls = value

    @property
    def manager_ca(self) -> Path | None:
        """The CA the plugin, the controller and the test trust for the manager (--manager-ca-file)."""
        assert self._manager is not None
        return self._manager.ca_file

    @manager_ca.setter
    def manager_ca(self, value: Path | None) -> None:
        assert self._manager is not None
        self._manager.ca_file = value

    # -- paths and addresses -----------------------------------------------------------------------

    @property
    def emu_state(self) -> Path:
        return self.root / "emu"

    @property
    def emulator_url(self) -> str:
        assert self._emulator is not None
        return self._emulator.url

    @property
    def manager_url(self) -> str:
        assert self._manager is not None
        return self._manager.url

    def manager_verify(self) -> ssl.SSLContext | bool:
        assert self._manager is not None
        return self._manager.verify()

    @property
    def plugin_metrics_port(self) -> int:
        assert self._plugin is not None and self._plugin.metrics_port is not None
        return self._plugin.metrics_port

    @property
    def controller_port(self) -> int:
        assert self._controller is not None
        return self._controller.port

    @property
    def kubeconfig(self) -> Path:
        assert self.apiserver is not None
        return self.apiserver.kubeconfig

    @property
    def plugin_dir(self) -> Path:
        return self.builder.node_dirs(NODE).plugin_dir

    @property
    def cdi_root(self) -> Path:
        return self.builder.node_dirs(NODE).cdi_root

    @property
    def registry_dir(self) -> Path:
        return self.builder.node_dirs(NODE).registry_dir

    def sysfs(self, host: str = NODE) -> Path:
        return self.emu_state / "hosts" / host / "sys"

    def emu_verify(self) -> ssl.SSLContext | bool:
        # The monitor and the test's own calls trust the emulator; one shared context, as the
        # monitor polls every 50 ms and httpx would load the CA bundle for each poll.
        return trust(self.emulator_tls is None)

    def emu_auth(self) -> tuple[str, str] | None:
        path = self.emu_state / "credentials.json"
        if not path.exists():
            return None
        creds = json.loads(path.read_text())
        return str(creds["username"]), str(creds["password"])

    # -- life cycle ------------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        builder = self.builder
        try:
            self.apiserver = builder.apiserver(root=self.root / "api")
            self.http = self.apiserver.http()
            builder.callback(self.http.close)
            self._kube_objects()
            self._emulator = builder.emulator(state_dir=self.emu_state)
            self.monitor.start()
            builder.callback(self.monitor.stop)
            self._manager = builder.manager(
                self._emulator,
                kube=self.apiserver,
                namespace=NAMESPACE,
                static_tokens=self.tokens,
                state_dir=self.root / "manager",
                redfish_args=self._redfish_login(),
                args=[
                    *("--orphan-grace-seconds", str(self.orphan_grace), "--orphan-interval-seconds", "0.5"),
                    *("--plugin-report-ttl-seconds", "3"),
                    *self.manager_args,
                ],
            )
            self._plugin = builder.plugin(
                NODE,
                self._manager,
                self.apiserver,
                name="plugin",
                sysfs_root=self.sysfs(),
                token_file=self.root / "plugin.token",
                metrics_port=free_port(),
                args=["--report-seconds", "0.5", *self.plugin_extra],
                start=False,
            )
            self._controller = builder.controller(
                self._manager,
                self.apiserver,
                token_file=self.root / "controller.token",
                binding_conditions=True,
                args=["--release-grace", "0.5", "--busy-timeout", "20"],
                start=False,
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.builder.stop()

    def _kube_objects(self) -> None:
        assert self.http is not None
        answer = self.http.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        assert answer.status_code in (201, 409), answer.text
        for host in ("kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"):
            self.add_node(host)

    def add_node(self, name: str) -> None:
        assert self.http is not None
        answer = self.http.post(
            "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )
        assert answer.status_code in (201, 409), answer.text

    def start_manager(self, crash_at: Sequence[str] = (), *, kill_previous: bool = False) -> None:
        """A new life of the manager, once it is ready (``/readyz``)."""
        assert self._manager is not None
        self._manager.start(crash_at, kill_previous=kill_previous)

    # -- the fabric, through the manager and the emulator's own table ----------------------------

    def inventory(self) -> Inventory:
        answer = httpx.get(
            f"{self.manager_url}/api/v1/inventory",
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            timeout=30,
            verify=self.manager_verify(),
        )
        answer.raise_for_status()
        return Inventory.model_validate_json(answer.content)

    def device(self, name: str) -> Device:
        return next(d for d in self.inventory().devices if d.name == name)

    def emulator_table(self) -> dict[str, Any]:
        answer = httpx.get(
            f"{self.emulator_url}{ROOT}/Oem/FabricDRA/Bindings",
            auth=self.emu_auth(),
            verify=self.emu_verify(),
            timeout=10,
        )
        answer.raise_for_status()
        table: dict[str, Any] = answer.json()
        return table

    def bound_hosts(self) -> dict[str, str]:
        return {b["Target"]: b["Host"] for b in self.emulator_table()["Bindings"]}

    def inject(self, spec: dict[str, Any]) -> None:
        answer = httpx.post(
            f"{self.emulator_url}{ROOT}/Oem/FabricDRA/Faults",
            json=spec,
            auth=self.emu_auth(),
            verify=self.emu_verify(),
            timeout=10,
        )
        answer.raise_for_status()

    def reset_faults(self) -> None:
        httpx.delete(
            f"{self.emulator_url}{ROOT}/Oem/FabricDRA/Faults",
            auth=self.emu_auth(),
            verify=self.emu_verify(),
            timeout=10,
        ).raise_for_status()

    def in_flight(self, target: str) -> bool:
        return any(f["Target"] == target for f in self.emulator_table().get("InFlight") or [])

    def free_devices(self, kind: DeviceType = DeviceType.GPU, node: str = NODE) -> list[Device]:
        inventory = self.inventory()
        pools = {p.pool for p in inventory.pools if node in p.nodes}
        bound = self.bound_hosts()
        return [
            d
            for d in inventory.devices
            if d.type is kind
            and d.pool in pools
            and d.state is BindingState.FREE
            and d.managed
            and _target(d) not in bound
        ]

    def emulator_binds(self, device: Device, offset: int = 0) -> int:
        """How many times the emulator logged binding ``device`` (after byte ``offset`` of its log)."""
        return self._log_count(f"msg=bound device={_target(device)} ", offset)

    def emulator_log_size(self) -> int:
        return self.emulator.log_file.stat().st_size if self.emulator.log_file.exists() else 0

    def _log_count(self, needle: str, offset: int) -> int:
        with self.emulator.log_file.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").count(needle)

    # -- the control plane's part ----------------------------------------------------------------

    def create_claim(
        self,
        device: Device,
        *,
        node: str = NODE,
        binding_conditions: bool = False,
        reserved: bool = True,
        name: str | None = None,
        partition: str | None = None,
        share: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """A ResourceClaim allocated to ``device`` on ``node`` (and reserved for a pod), as the
        scheduler leaves it; with ``binding_conditions`` the allocation waits for the controller.
        ``partition``: the allocation names that partition of the GPU ``device`` instead;
        ``share``: (shareID, memory) of the memory pool ``device``, its consumed capacity."""
        assert self.http is not None
        name = name or f"c-{uuid.uuid4().hex[:10]}"
        created = self.http.post(
            CLAIMS,
            json={
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {
                    "devices": {
                        "requests": [{"name": "dev", "exactly": {"deviceClassName": "cohdi-pcie-device"}}]
                    }
                },
            },
        )
        assert created.status_code == 201, created.text
        obj = created.json()
        result: dict[str, Any] = {
            "request": "dev",
            "driver": DRIVER,
            "pool": device.pool,
            "device": partition or device.name,
        }
        if share is not None:
            result["shareID"] = share[0]
            result["consumedCapacity"] = {f"{DRIVER}/{MEMORY_CAPACITY}": share[1]}
        if binding_conditions:
            result["bindingConditions"] = [f"{DRIVER}/Attached"]
            result["bindingFailureConditions"] = [f"{DRIVER}/AttachFailed"]
        obj["status"] = {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
                "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        }
        if reserved:
            obj["status"]["reservedFor"] = [
                {"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}
            ]
        updated = self.http.put(f"{CLAIMS}/{name}/status", json=obj)
        assert updated.status_code == 200, updated.text
        return dict(updated.json())

    def claim(self, claim: dict[str, Any]) -> dict[str, Any] | None:
        assert self.http is not None
        answer = self.http.get(f"{CLAIMS}/{claim['metadata']['name']}")
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        return dict(answer.json())

    def set_status(self, claim: dict[str, Any], status: dict[str, Any]) -> None:
        """Replace the claim's status as the scheduler does: read, write with that resourceVersion,
        and read again on a 409 Conflict (the plugin writes status.devices of the same claim)."""
        assert self.http is not None
        for _ in range(20):
            current = self.claim(claim)
            assert current is not None
            current["status"] = status
            answer = self.http.put(f"{CLAIMS}/{claim['metadata']['name']}/status", json=current)
            if answer.status_code != 409:
                break
        assert answer.status_code == 200, answer.text

    def deallocate(self, claim: dict[str, Any]) -> None:
        """What the control plane does once no pod uses the claim any more."""
        self.set_status(claim, {})

    def delete_claim(self, claim: dict[str, Any]) -> None:
        assert self.http is not None
        answer = self.http.delete(f"{CLAIMS}/{claim['metadata']['name']}")
        assert answer.status_code in (200, 404), answer.text

    def condition(self, claim: dict[str, Any], device: Device, kind: str) -> dict[str, Any] | None:
        current = self.claim(claim)
        for entry in ((current or {}).get("status") or {}).get("devices") or []:
            if entry.get("device") == device.name:
                for c in entry.get("conditions") or []:
                    if c.get("type") == f"{DRIVER}/{kind}":
                        return dict(c)
        return None

    def events(self, field_selector: str = "") -> list[dict[str, Any]]:
        assert self.http is not None
        params = {"fieldSelector": field_selector} if field_selector else {}
        answer = self.http.get("/apis/events.k8s.io/v1/events", params=params)
        answer.raise_for_status()
        return list(answer.json()["items"])

    # -- the node's part: what the plugin left on disk --------------------------------------------

    def checkpoint_claims(self) -> dict[str, Any]:
        path = self.plugin_dir / "checkpoint.json"
        if not path.exists():
            return {}
        return dict(json.loads(path.read_text())["data"]["claims"])

    def visible(self, device: Device, host: str = NODE) -> bool:
        return HostScanner(self.sysfs(host), real_host=False).find(identity_of(device)) is not None

    def spec_files(self, uid: str) -> list[Path]:
        return cdi.spec_files_of_claim(self.cdi_root, DRIVER, uid)

    # -- convergence checks ----------------------------------------------------------------------

    def assert_prepared(self, claim: dict[str, Any], device: Device, answer: Any = None) -> None:
        """Prepared exactly as one clean prepare leaves it: in every record, once."""
        uid = claim["metadata"]["uid"]
        assert self.bound_hosts().get(_target(device)) == NODE, self.emulator_table()
        held = self.device(device.name)
        assert (held.state, held.node, held.claim_uid) == (BindingState.BOUND, NODE, uid), held
        assert self.visible(device), f"{device.name} is not in {NODE}'s sysfs tree"
        entry = self.checkpoint_claims().get(uid)
        assert entry is not None and entry["state"] == "PrepareCompleted", entry
        assert [d["device"] for d in entry["devices"]] == [device.name]
        (spec,) = self.spec_files(uid)
        names = [
            f"{s.kind}={d.name}"
            for s in [cdi.CdiSpec.model_validate_json(spec.read_text())]
            for d in s.devices
        ]
        assert names == entry["devices"][0]["cdi_device_ids"], (names, entry)
        if answer is not None:
            (prepared,) = answer.devices
            assert (prepared.device, prepared.pool) == (device.name, device.pool)
            assert list(prepared.cdi_device_ids) == names

    def assert_released(self, claim: dict[str, Any], device: Device) -> None:
        uid = claim["metadata"]["uid"]
        assert _target(device) not in self.bound_hosts(), self.emulator_table()
        freed = self.device(device.name)
        assert (freed.state, freed.claim_uid) == (BindingState.FREE, None), freed
        assert not self.visible(device), f"{device.name} is still in {NODE}'s sysfs tree"
        assert uid not in self.checkpoint_claims()
        assert self.spec_files(uid) == []

    def assert_bound_once(self, device: Device, mark: int, log_offset: int, *, expected: int = 1) -> None:
        """The emulator bound ``device`` exactly ``expected`` times since the mark, to one host
        each time, and never to two hosts at once."""
        self.monitor.wait_for_poll()
        assert self.monitor.violations == [], self.monitor.violations
        assert self.emulator_binds(device, log_offset) == expected, self.emulator.log_since_start()[-3000:]
        episodes = self.monitor.episodes_of(_target(device), mark)
        assert len(episodes) <= expected, episodes
        assert {e.host for e in episodes} <= {NODE}, episodes

    # -- a GPU partition's and a memory share's claims -------------------------------------------

    def redfish(self, path: str) -> dict[str, Any]:
        """A resource of the emulator, read as a client of the fabric reads it."""
        answer = httpx.get(
            f"{self.emulator_url}{path}", auth=self.emu_auth(), verify=self.emu_verify(), timeout=10
        )
        answer.raise_for_status()
        return dict(answer.json())

    def memory_chunks(self, pool: Device) -> list[dict[str, Any]]:
        """The chunks of the memory pool's domain, as the emulator has them."""
        members = self.redfish(f"{pool.redfish_uri}/MemoryChunks")["Members"]
        return [self.redfish(m["@odata.id"]) for m in members]

    def memory_connections(self) -> list[dict[str, Any]]:
        members = self.redfish(f"{ROOT}/Fabrics/CXL/Connections")["Members"]
        return [self.redfish(m["@odata.id"]) for m in members]

    def chunks_created(self, log_offset: int = 0) -> int:
        """How many memory chunks the emulator made (after byte ``log_offset`` of its log)."""
        return self._log_count('msg="memory chunk created"', log_offset)

    def partitions_on(self, gpu: Device) -> dict[str, dict[str, str]]:
        """Each partition on the GPU in the node's sysfs tree (its ``mig/`` entries), by name."""
        host = HostScanner(self.sysfs(), real_host=False).find(identity_of(gpu))
        mig = Path(host.sysfs_path) / "mig" if host is not None else None
        if mig is None or not mig.is_dir():
            return {}
        return {
            d.name: {f.name: f.read_text().strip() for f in d.iterdir() if f.is_file()}
            for d in sorted(mig.iterdir())
            if not d.name.startswith(".")
        }

    def _completed(self, uid: str, asked: str, answer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The claim's one device record (PrepareCompleted) and its CDI spec, which the kubelet's
        answer names."""
        entry = self.checkpoint_claims().get(uid)
        assert entry is not None and entry["state"] == "PrepareCompleted", entry
        (record,) = entry["devices"]
        assert record["device"] == asked, record
        (path,) = self.spec_files(uid)
        spec = cdi.CdiSpec.model_validate_json(path.read_text())
        names = [f"{spec.kind}={d.name}" for d in spec.devices]
        assert names == record["cdi_device_ids"], (names, record)
        if answer is not None:
            (prepared,) = answer.devices
            assert (prepared.device, list(prepared.cdi_device_ids)) == (asked, names)
        return record, json.loads(path.read_text())

    def assert_partition_prepared(
        self, claim: dict[str, Any], gpu: Device, partition: str, answer: Any = None
    ) -> None:
        """The GPU bound to the node once for the claim's partition, which the node made once."""
        uid = claim["metadata"]["uid"]
        assert self.bound_hosts().get(_target(gpu)) == NODE, self.emulator_table()
        held = self.device(gpu.name)
        assert held.state is BindingState.BOUND and held.claim_uid is None, held
        assert [(h.partition, h.claim_uid, h.node) for h in held.partitions] == [(partition, uid, NODE)]
        record, spec = self._completed(uid, partition, answer)
        made = self.partitions_on(gpu)
        assert [m.get("uuid") for m in made.values()] == [record["partition"]["uuid"]], made
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == record["partition"]["uuid"], env

    def assert_share_prepared(
        self, claim: dict[str, Any], pool: Device, share: str, size_mib: int, answer: Any = None
    ) -> None:
        """One chunk of the share's size carved and connected to the node, its region on the node."""
        uid = claim["metadata"]["uid"]
        memory = self.device(pool.name).memory_pool
        assert memory is not None
        (held,) = memory.shares
        assert (held.share_id, held.claim_uid, held.node) == (share, uid, NODE), held
        assert held.state is BindingState.BOUND, held
        (chunk,) = self.memory_chunks(pool)
        assert (chunk["@odata.id"], chunk["MemoryChunkSizeMiB"]) == (held.chunk, size_mib), chunk
        (connection,) = self.memory_connections()
        assert connection["@odata.id"] == held.connection, connection
        assert [i["MemoryChunk"]["@odata.id"] for i in connection["MemoryChunkInfo"]] == [held.chunk]
        (initiator,) = connection["Links"]["InitiatorEndpoints"]
        assert self.redfish(initiator["@odata.id"])["Id"] == NODE, connection
        record, _ = self._completed(uid, pool.name, answer)
        assert record["share_id"] == share, record
        dax = record["memory"]["dax"]
        assert (self.sysfs() / "bus" / "dax" / "devices" / dax).exists(), f"{dax} is not on {NODE}"

    def assert_shared_released(self, claim: dict[str, Any], device: Device) -> None:
        """Nothing left of a partition's or a share's claim: no holder, the GPU unbound and off the
        node, no chunk, no Connection, no region; no spec, no checkpoint entry."""
        uid = claim["metadata"]["uid"]
        assert uid not in self.checkpoint_claims()
        assert self.spec_files(uid) == []
        held = self.device(device.name)
        if held.memory_pool is None:
            assert _target(device) not in self.bound_hosts(), self.emulator_table()
            assert (held.state, held.partitions) == (BindingState.FREE, []), held
            assert not self.visible(device), f"{device.name} is still in {NODE}'s sysfs tree"
            return
        assert held.memory_pool.shares == [], held.memory_pool
        assert self.memory_chunks(device) == [] and self.memory_connections() == []
        dax = self.sysfs() / "bus" / "dax" / "devices"
        assert not dax.is_dir() or not any(dax.iterdir()), f"a dax device is left on {NODE}"


def _target(device: Device) -> str:
    return device.redfish_uri.rstrip("/").rsplit("/", 1)[-1]


# -- the kubelet -------------------------------------------------------------------------------------


class Kubelet:
    """The kubelet-protocol client on the stack's registry directory; follows plugin restarts."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager

    async def plugin(self, *, newer_than: int = -1) -> DRAPluginClient:
        """The plugin's client once it registered after registration attempt number ``newer_than``."""
        import asyncio

        deadline = time.monotonic() + 60
        while not any(a.registered and a.driver == DRIVER for a in self.manager.attempts[newer_than + 1 :]):
            if time.monotonic() > deadline:
                raise AssertionError(f"the plugin did not register again: {self.manager.attempts}")
            await asyncio.sleep(0.02)
        return await self.manager.wait_for_plugin(DRIVER, within=60)

    def attempts(self) -> int:
        return len(self.manager.attempts) - 1

    async def prepare_until_done(self, ref: ClaimRef, *, tries: int = 10, pause: float = 0.3) -> Any:
        """The kubelet's retries of NodePrepareResources until it succeeds; the errors it saw."""
        import asyncio

        errors: list[str] = []
        for _ in range(tries):
            try:
                plugin = await self.plugin()
                results = await plugin.prepare([ref])
            except DraCallError as err:
                errors.append(str(err))
                await asyncio.sleep(pause)
                continue
            return results[ref.uid]
        raise AssertionError(f"the claim was never prepared; the kubelet saw: {errors}")

    async def unprepare_until_done(self, ref: ClaimRef, *, tries: int = 10, pause: float = 0.3) -> None:
        import asyncio

        errors: list[str] = []
        for _ in range(tries):
            try:
                plugin = await self.plugin()
                await plugin.unprepare([ref])
            except DraCallError as err:
                errors.append(str(err))
                await asyncio.sleep(pause)
                continue
            return
        raise AssertionError(f"the claim was never unprepared; the kubelet saw: {errors}")


@contextlib.asynccontextmanager
async def kubelet_on(stack: Stack, *, watch_health: bool = False) -> AsyncIterator[Kubelet]:
    async with running_kubelet(stack.registry_dir, watch_health=watch_health) as manager:
        yield Kubelet(manager)


def ref_of(claim: dict[str, Any]) -> ClaimRef:
    return ClaimRef.of(claim)


@contextlib.contextmanager
def running_stack(**kwargs: Any) -> Iterator[Stack]:
    root = short_dir("fdrel-")
    try:
        with Stack(root, **kwargs) as stack:
            yield stack
    finally:
        shutil.rmtree(root, ignore_errors=True)
