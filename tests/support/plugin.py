"""Run the plugin as a real process beside the API test server, and talk to it as the kubelet does.

Shared by tests/integration/plugin and the benchmarks in bench/::

    with PluginStack(tmp) as stack:                    # API test server + `fabric-dra plugin`
        ref = asyncio.run(stack.create_claim("c1", [("gpu", "gpu-0")]))
        response = asyncio.run(stack.prepare([ref]))

Sockets live under a short directory (unix socket paths are limited to 107 bytes).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_driver.proto.dra_v1 import api_pb2 as dra_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as dra_grpc
from plumbing.kube import KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS
from plumbing.procs import RoleProcess
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.fabric_manager import start_manager

__all__ = [
    "DRIVER",
    "ClaimRef",
    "DraCaller",
    "FabricProcesses",
    "PluginStack",
    "free_port",
    "rss_kib",
    "short_dir",
    "start_fabric",
]

DRIVER = "fabric-dra.io"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_dir(prefix: str = "fdp-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


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
    """API test server + one `fabric-dra plugin` process for node ``node``."""

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
        self.root = root or short_dir()
        self._owns_root = root is None
        self.node = node
        self.backend = backend
        self.manager_url = manager_url
        self.sysfs_root = sysfs_root or self.root / "sys"
        self.metrics_port = metrics_port
        self.extra_args = list(extra_args)
        self.apiserver: ApiServerProcess | None = None
        self._apiserver_cm: contextlib.AbstractContextManager[ApiServerProcess] | None = None
        self.plugin: RoleProcess | None = None
        self.pod_uid: str | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.apiserver is not None, "the stack is not running"
        return self.apiserver.kubeconfig

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plug"

    @property
    def registry_dir(self) -> Path:
        return self.root / "reg"

    @property
    def dra_socket(self) -> Path:
        return Path(self.plugin.address) if self.plugin else self.plugin_dir / "dra.sock"

    def plugin_args(self) -> list[str]:
        args = [
            "plugin",
            "--node-name",
            self.node,
            "--kubeconfig",
            str(self.kubeconfig),
            "--registry-dir",
            str(self.registry_dir),
            "--plugin-dir",
            str(self.plugin_dir),
            "--cdi-root",
            str(self.cdi_root),
            "--sysfs-root",
            str(self.sysfs_root),
            "--device-backend",
            self.backend,
            "--ready-file",
            str(self.root / "plugin.ready"),
        ]
        if self.manager_url:
            args += ["--manager-url", self.manager_url]
        if self.metrics_port is not None:
            args += ["--metrics-port", str(self.metrics_port)]
        return args + self.extra_args

    def start_plugin(self) -> RoleProcess:
        env = {"POD_UID": self.pod_uid} if self.pod_uid else {"POD_UID": ""}
        self.plugin = RoleProcess(
            self.plugin_args(),
            ready_file=self.root / "plugin.ready",
            log_file=self.root / "plugin.log",
            env=env,
            name="plugin",
        ).start()
        return self.plugin

    def kill_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.kill()

    def stop_plugin(self) -> int | None:
        return self.plugin.stop() if self.plugin is not None else None

    def __enter__(self) -> PluginStack:
        self._apiserver_cm = start_apiserver(self.root / "api")
        self.apiserver = self._apiserver_cm.__enter__()
        try:
            self.start_plugin()
        except BaseException:
            self._apiserver_cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.plugin is not None:
            with contextlib.suppress(Exception):
                self.plugin.stop()
        if self._apiserver_cm is not None:
            with contextlib.suppress(Exception):
                self._apiserver_cm.__exit__(None, None, None)
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
    ) -> ClaimRef:
        """A ResourceClaim allocated to ``devices`` ((request, device) pairs) and reserved for a pod,
        as the scheduler leaves it."""
        client = kube or self.kube()
        try:
            requests = sorted({r for r, _ in devices})
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
                    "devices": {
                        "results": [
                            {"request": r, "driver": driver, "pool": pool, "device": d} for r, d in devices
                        ]
                    },
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
            await self._channel.close()

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
    """A running emulator (``instant`` latency) and fabric manager; stop() ends both."""

    emulator: RoleProcess
    manager: RoleProcess
    state_dir: Path

    def sysfs_root(self, host: str) -> Path:
        return self.state_dir / "hosts" / host / "sys"

    def stop(self) -> None:
        self.manager.stop()
        self.emulator.stop()


def start_fabric(root: Path, latency: str = "instant", *, topology: Path | None = None) -> FabricProcesses:
    """The emulator (without authentication; the packaged topology unless ``topology``) and a
    manager on it, both under ``root``; the caller stops them (:meth:`FabricProcesses.stop`)."""
    state_dir = root / "emu"
    emulator = RoleProcess(
        [
            *("emulator", "serve", "--state-dir", str(state_dir), "--latency", latency),
            *("--insecure-no-auth", "--port", "0", "--ready-file", str(root / "emulator.ready")),
            *(["--topology", str(topology)] if topology is not None else []),
        ],
        ready_file=root / "emulator.ready",
        log_file=root / "emulator.log",
        name="emulator",
    ).start()
    try:
        # A loaded CI machine (the whole suite on two cores) can take longer than the helper's 30 s.
        manager = start_manager(
            root,
            emulator.address,
            args=["--redfish-auth", "none", "--state-dir", str(root / "manager"), "--insecure-no-auth"],
            ready_timeout=120,
        )
    except BaseException:
        emulator.stop()
        raise
    return FabricProcesses(emulator, manager, state_dir)
