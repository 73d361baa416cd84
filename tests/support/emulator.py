"""Run ``fabric-dra emulator serve`` as a real process in tests, and talk to it.

    with run_emulator(tmp_path) as emu:
        emu.client().post(f"/redfish/v1/Systems/kind-worker/Actions/ComputerSystem.AddResourceBlock", ...)
        assert emu.bindings()["Bindings"][0]["Host"] == "kind-worker"
        emu.inject({"Kind": "PortDown", "Host": "kind-worker"})

``emu.kill()`` is a ``kill -9``; ``emu.restart()`` starts the emulator again on the same state
directory and port. ``emu.sysfs("kind-worker")`` is that host's ``--sysfs-root``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from plumbing.procs import RoleProcess

__all__ = [
    "BLOCKS",
    "CONNECTIONS",
    "ENDPOINTS",
    "ZONES",
    "RunningEmulator",
    "block_action",
    "connection_body",
    "run_emulator",
    "zone_add",
    "zone_remove",
]

ROOT = "/redfish/v1"
ZONES = f"{ROOT}/Fabrics/PCIe/Zones"
ENDPOINTS = f"{ROOT}/Fabrics/PCIe/Endpoints"
BLOCKS = f"{ROOT}/CompositionService/ResourceBlocks"
CONNECTIONS = f"{ROOT}/Fabrics/CXL/Connections"


@dataclass
class RunningEmulator:
    state_dir: Path
    args: list[str]
    log_file: Path
    process: RoleProcess | None = None
    url: str = ""
    username: str = ""
    password: str = ""
    restarts: int = 0
    _clients: list[httpx.Client] = field(default_factory=list)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, port: int = 0) -> RunningEmulator:
        ready = self.state_dir.parent / f"{self.state_dir.name}.ready"
        args = [*self.args, "--ready-file", str(ready), "--port", str(port)]
        self.process = RoleProcess(args, ready_file=ready, log_file=self.log_file, name="emulator").start()
        self.url = self.process.address
        creds_file = self.state_dir / "credentials.json"
        if creds_file.exists():
            creds = json.loads(creds_file.read_text())
            self.username, self.password = creds["username"], creds["password"]
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing in the emulator gets to clean up."""
        assert self.process is not None
        self.process.kill()

    def stop(self) -> int | None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        return self.process.stop() if self.process is not None else None

    def restart(self) -> RunningEmulator:
        """Start again on the same state directory and port (after kill or stop)."""
        port = self.port
        if self.process is not None and self.process.alive():
            self.process.stop()
        self.restarts += 1
        return self.start(port)

    # --- talking to it ---------------------------------------------------------------------

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.password else None

    def client(self, **kwargs: Any) -> httpx.Client:
        client = httpx.Client(base_url=self.url, auth=self.auth, timeout=30.0, **kwargs)
        self._clients.append(client)
        return client

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, auth=self.auth, timeout=60.0, **kwargs)

    def get(self, path: str) -> dict[str, Any]:
        response = httpx.get(self.url + path, auth=self.auth, timeout=30.0)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def bindings(self) -> dict[str, Any]:
        """The emulator's own binding table (``/redfish/v1/Oem/FabricDRA/Bindings``)."""
        return self.get(f"{ROOT}/Oem/FabricDRA/Bindings")

    def bound_hosts(self) -> dict[str, str]:
        """Target Id → host, from the binding table."""
        return {b["Target"]: b["Host"] for b in self.bindings()["Bindings"]}

    def inject(self, spec: dict[str, Any]) -> str | None:
        response = httpx.post(
            f"{self.url}{ROOT}/Oem/FabricDRA/Faults", json=spec, auth=self.auth, timeout=30.0
        )
        response.raise_for_status()
        fault_id: str | None = response.json().get("Id")
        return fault_id

    def reset_faults(self) -> None:
        httpx.delete(
            f"{self.url}{ROOT}/Oem/FabricDRA/Faults", auth=self.auth, timeout=30.0
        ).raise_for_status()

    def sysfs(self, host: str) -> Path:
        return self.state_dir / "hosts" / host / "sys"

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


@contextlib.contextmanager
def run_emulator(
    tmp_dir: Path,
    *,
    topology: Path | None = None,
    latency: str = "instant",
    extra_args: Sequence[str] = (),
    name: str = "emulator",
) -> Iterator[RunningEmulator]:
    """A running emulator with its own state directory under ``tmp_dir``; always stopped."""
    state_dir = tmp_dir / f"{name}-state"
    args = ["emulator", "serve", "--state-dir", str(state_dir), "--latency", latency, *extra_args]
    if topology is not None:
        args += ["--topology", str(topology)]
    emu = RunningEmulator(state_dir=state_dir, args=args, log_file=tmp_dir / f"{name}.log")
    try:
        yield emu.start()
    finally:
        emu.stop()


def zone_add(host: str, device: str) -> tuple[str, dict[str, Any]]:
    """The request that binds ``device`` to ``host`` through the host's zone."""
    return f"{ZONES}/{host}/Actions/Zone.AddEndpoint", {"Endpoint": {"@odata.id": f"{ENDPOINTS}/{device}"}}


def zone_remove(host: str, device: str) -> tuple[str, dict[str, Any]]:
    return f"{ZONES}/{host}/Actions/Zone.RemoveEndpoint", {"Endpoint": {"@odata.id": f"{ENDPOINTS}/{device}"}}


def block_action(host: str, device: str, action: str = "AddResourceBlock") -> tuple[str, dict[str, Any]]:
    return (
        f"{ROOT}/Systems/{host}/Actions/ComputerSystem.{action}",
        {"ResourceBlock": {"@odata.id": f"{BLOCKS}/{device}"}},
    )


def connection_body(host: str, device: str, *chunks: int) -> dict[str, Any]:
    return {
        "ConnectionType": "Memory",
        "MemoryChunkInfo": [
            {
                "AccessCapabilities": ["Read", "Write"],
                "MemoryChunk": {"@odata.id": f"{ROOT}/Chassis/{device}/MemoryDomains/0/MemoryChunks/{n}"},
            }
            for n in chunks
        ],
        "Links": {"InitiatorEndpoints": [{"@odata.id": f"{ROOT}/Fabrics/CXL/Endpoints/{host}"}]},
    }
