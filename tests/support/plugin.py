"""Run the plugin as a real process beside the API test server, and talk to it as the kubelet does.

Shared by tests/integration/plugin and the benchmarks in bench/::

    with PluginStack(tmp) as stack:                    # API test server + `fabric-dra plugin`
        ref = asyncio.run(stack.create_claim("c1", [("gpu", "gpu-0")]))
        response = asyncio.run(stack.prepare([ref]))

Sockets live under a short directory (unix socket paths are limited to 107 bytes).
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_driver.proto.dra_v1 import api_pb2 as dra_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as dra_grpc
from fabric_dra_testbed.stack import ApiServer as ApiServerProcess
from fabric_dra_testbed.stack import Emulator, Manager, NodeDirs, Plugin, Role, Stack, free_port, short_dir
from plumbing.kube import KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS

__all__ = [
    "DRIVER",
    "ClaimRef",
    "DraCaller",
    "FabricProcesses",
    "PluginStack",
    "free_port",
    "probe",
    "rss_kib",
    "short_dir",
    "start_fabric",
]

DRIVER = "fabric-dra.io"


def probe(port: int, path: str, timeout: float = 15) -> tuple[int, str]:
    """What the kubelet's HTTP probe of the plugin gets on 127.0.0.1:``port``: the status and the
    body's one line (``/healthz``, ``/readyz``; docs/plugin.md, "Probes")."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return int(response.status), response.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str

    def proto(self) -> dra_pb2.Claim:
        return dra_pb2.Claim(namespace=self.namespace, name=self.name, uid=self.uid)


class PluginStack:
    """API test server + one `fabric-dra plugin` process for node ``node`` (a
    :class:`fabric_dra_testbed.stack.Stack` under ``root``); the plugin can be stopped, killed and started
    again on the same directories."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        node: str = "node-a",
        backend: str = "noop",
        manager_url: str | None = None,
        sysfs_root: Path | None = None,
        metrics_port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.root = root or short_dir("fdp-")
        self._owns_root = root is None
        self.node = node
        self.backend = backend
        self.manager_url = manager_url
        self.sysfs_root = sysfs_root or self.root / "sys"
        self.metrics_port = metrics_port
        self.extra_args = list(extra_args)
        self.stack = Stack(self.root, logs_dir=self.root)
        self.apiserver: ApiServerProcess | None = None
        self._plugin: Plugin | None = None
        self.pod_uid: str | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.apiserver is not None, "the stack is not running"
        return self.apiserver.kubeconfig

    @property
    def dirs(self) -> NodeDirs:
        return self.stack.node_dirs(self.node)

    @property
    def cdi_root(self) -> Path:
        return self.dirs.cdi_root

    @property
    def plugin_dir(self) -> Path:
        return self.dirs.plugin_dir

    @property
    def registry_dir(self) -> Path:
        return self.dirs.registry_dir

    @property
    def plugin(self) -> Role | None:
        return self._plugin.role if self._plugin is not None and self._plugin.role.lives else None

    @property
    def dra_socket(self) -> Path:
        return Path(self.plugin.address) if self.plugin else self.plugin_dir / "dra.sock"

    def start_plugin(self, crash_at: Sequence[str] = (), *, kill_previous: bool = False) -> Role:
        """Start the plugin (again), armed at ``crash_at`` (``plumbing.crashpoints``)."""
        if self._plugin is None:
            self._plugin = self.stack.plugin(
                self.node,
                None,
                self.kubeconfig,
                name="plugin",
                sysfs_root=self.sysfs_root,
                backend=self.backend,
                metrics_port=self.metrics_port,
                args=[*(["--manager-url", self.manager_url] if self.manager_url else []), *self.extra_args],
                start=False,
            )
        self._plugin.role.env["POD_UID"] = self.pod_uid or ""
        return self._plugin.role.start(crash_at, kill_previous=kill_previous)

    def kill_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.kill()

    def stop_plugin(self) -> int | None:
        return self.plugin.stop() if self.plugin is not None else None

    def __enter__(self) -> PluginStack:
        try:
            self.apiserver = self.stack.apiserver(root=self.root / "api")
            self.start_plugin()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stack.stop()
        finally:
            if self._owns_root:
                shutil.rmtree(self.root, ignore_errors=True)

    # -- the control plane's part ---------------------------------------------------------------

    def kube(self) -> KubeClient:
        assert self.apiserver is not None, "the stack is not running"
        return self.apiserver.client()

    async def create_claim(
        self,
        name: str,
        devices: Sequence[tuple[str, str]],
        *,
        driver: str = DRIVER,
        pool: str = "fabric-pcie",
        namespace: str = "default",
        kube: KubeClient | None = None,
        results: Sequence[Mapping[str, Any]] = (),
        config: Sequence[Mapping[str, Any]] = (),
    ) -> ClaimRef:
        """A ResourceClaim allocated to ``devices`` ((request, device) pairs) and reserved for a pod,
        as the scheduler leaves it; ``results`` are allocation results of its own (a share's
        ``shareID`` and ``consumedCapacity``), ``config`` the allocation's device configuration."""
        client = kube or self.kube()
        allocated = [{"request": r, "driver": driver, "pool": pool, "device": d} for r, d in devices] + [
            dict(r) for r in results
        ]
        try:
            requests = sorted({str(r["request"]).partition("/")[0] for r in allocated})
            created = await client.create(
                RESOURCE_CLAIMS,
                {
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": r, "exactly": {"deviceClassName": "cohdi-pcie-device"}}
                                for r in requests
                            ]
                        }
                    },
                },
                namespace,
            )
            created["status"] = {
                "allocation": {
                    "devices": {"results": allocated, **({"config": list(config)} if config else {})},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [self.node]}
                                ]
                            }
                        ]
                    },
                },
                "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
            }
            updated = await client.replace(RESOURCE_CLAIMS, created, subresource="status")
            meta = updated["metadata"]
            return ClaimRef(meta["uid"], namespace, name)
        finally:
            if kube is None:
                await client.aclose()

    async def delete_claim(self, ref: ClaimRef) -> None:
        client = self.kube()
        try:
            await client.delete(RESOURCE_CLAIMS, ref.name, ref.namespace)
        finally:
            await client.aclose()

    # -- the kubelet's part ---------------------------------------------------------------------

    def caller(self) -> DraCaller:
        """A kubelet-like client with one long-lived connection (the kubelet keeps its own)."""
        return DraCaller(self.dra_socket)

    async def prepare(
        self, refs: Sequence[ClaimRef], call_seconds: float = 45.0
    ) -> dra_pb2.NodePrepareResourcesResponse:
        async with self.caller() as caller:
            return await caller.prepare(refs, call_seconds)

    async def unprepare(
        self, refs: Sequence[ClaimRef], call_seconds: float = 45.0
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        async with self.caller() as caller:
            return await caller.unprepare(refs, call_seconds)


class DraCaller:
    """NodePrepareResources / NodeUnprepareResources over one channel to the DRA socket (v1)."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    async def __aenter__(self) -> DraCaller:
        self._channel = grpc.aio.insecure_channel(f"unix://{self.socket_path}")
        self._stub = dra_grpc.DRAPluginStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)

    async def prepare(
        self, refs: Sequence[ClaimRef], call_seconds: float = 45.0
    ) -> dra_pb2.NodePrepareResourcesResponse:
        request = dra_pb2.NodePrepareResourcesRequest(claims=[r.proto() for r in refs])
        response: dra_pb2.NodePrepareResourcesResponse = await self._stub.NodePrepareResources(
            request, timeout=call_seconds
        )
        return response

    async def unprepare(
        self, refs: Sequence[ClaimRef], call_seconds: float = 45.0
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        request = dra_pb2.NodeUnprepareResourcesRequest(claims=[r.proto() for r in refs])
        response: dra_pb2.NodeUnprepareResourcesResponse = await self._stub.NodeUnprepareResources(
            request, timeout=call_seconds
        )
        return response


@dataclass
class FabricProcesses:
    """A running emulator (without authentication) and fabric manager; stop() ends both."""

    stack: Stack
    emulator_handle: Emulator
    manager_handle: Manager

    @property
    def emulator(self) -> Role:
        return self.emulator_handle.role

    @property
    def manager(self) -> Role:
        return self.manager_handle.role

    @property
    def state_dir(self) -> Path:
        return self.emulator_handle.state_dir

    def sysfs_root(self, host: str) -> Path:
        return self.emulator_handle.sysfs(host)

    def stop(self) -> None:
        self.stack.stop()


def start_fabric(root: Path, latency: str = "instant", *, topology: Path | None = None) -> FabricProcesses:
    """The emulator (without authentication; the packaged topology unless ``topology``) and a
    manager on it, both under ``root``; the caller stops them (:meth:`FabricProcesses.stop`)."""
    stack = Stack(root, logs_dir=root)
    try:
        emulator = stack.emulator(
            name="emulator", state_dir=root / "emu", topology=topology, latency=latency, auth=False
        )
        manager = stack.manager(emulator, state_dir=root / "manager", insecure_no_auth=True)
    except BaseException:
        stack.stop()
        raise
    return FabricProcesses(stack, emulator, manager)
