"""Fixtures for the manager's integration tests: a TLS emulator with sessions, managers in front of
it, tokens, and the emulator's own view of its bindings (the ground truth the tests check).

Every test here runs real processes: ``fabric-dra emulator serve`` over HTTPS with a test CA and
generated credentials, and ``fabric-dra manager serve`` talking Redfish to it with sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from fabric_dra_testbed.stack import Role
from plumbing.kube.resources import RESOURCE_CLAIMS
from tests.support.apiserver import ApiServerProcess
from tests.support.emulator import RunningEmulator, run_emulator
from tests.support.fabric_manager import running_manager, static_tokens_file

NODES = ("kind-worker", "kind-worker2", "kind-worker3", "kind-worker4")
CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"


def plugin_token(node: str) -> str:
    return f"plugin-token-{node}-0123456789"


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A test CA and a certificate for 127.0.0.1 signed by it."""
    return make_tls(tmp_path_factory.mktemp("tls"))


def make_tls(root: Path) -> Tls:
    """A test CA and a certificate for 127.0.0.1 signed by it, written under ``root``."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    tls = Tls(root / "ca.pem", root / "cert.pem", root / "key.pem")
    ca.cert_pem.write_to_path(str(tls.ca))
    leaf.private_key_pem.write_to_path(str(tls.key))
    leaf.cert_chain_pems[0].write_to_path(str(tls.cert))
    for blob in leaf.cert_chain_pems[1:]:
        blob.write_to_path(str(tls.cert), append=True)
    return tls


class FabricAdmin:
    """The emulator's admin side over verified TLS: its binding table, faults, sessions."""

    def __init__(self, emulator: RunningEmulator, tls: Tls) -> None:
        self.emulator = emulator
        self.tls = tls

    @property
    def url(self) -> str:
        return self.emulator.url

    def _http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, auth=self.emulator.auth, verify=self.tls.context(), timeout=30.0
        )

    def get(self, path: str) -> dict[str, Any]:
        with self._http() as http:
            response = http.get(path)
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body

    def bound_hosts(self) -> dict[str, str]:
        """Target Id → host, from the emulator's own binding table."""
        table = self.get("/redfish/v1/Oem/FabricDRA/Bindings")
        return {b["Target"]: b["Host"] for b in table["Bindings"]}

    def binding(self, target: str) -> dict[str, Any] | None:
        table = self.get("/redfish/v1/Oem/FabricDRA/Bindings")
        return next((b for b in table["Bindings"] if b["Target"] == target), None)

    def inject(self, spec: dict[str, Any]) -> None:
        with self._http() as http:
            http.post("/redfish/v1/Oem/FabricDRA/Faults", json=spec).raise_for_status()

    def reset_faults(self) -> None:
        with self._http() as http:
            http.delete("/redfish/v1/Oem/FabricDRA/Faults").raise_for_status()


@contextlib.contextmanager
def tls_emulator(
    root: Path, tls: Tls, *, latency: str = "instant", topology: Path | None = None, name: str = "emulator"
) -> Iterator[FabricAdmin]:
    """An emulator over HTTPS with authentication required; credentials generated in its state dir."""
    with run_emulator(
        root,
        latency=latency,
        topology=topology,
        name=name,
        extra_args=["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)],
    ) as emulator:
        yield FabricAdmin(emulator, tls)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory, tls: Tls) -> Iterator[FabricAdmin]:
    """One TLS emulator (the default 4-host topology) per test module."""
    with tls_emulator(tmp_path_factory.mktemp("fabric"), tls) as admin:
        yield admin


def manager_args(
    fabric: FabricAdmin, work: Path, *extra: str, tokens: bool = True, nodes: Sequence[str] = NODES
) -> list[str]:
    """Flags for a manager in front of ``fabric``: TLS verified with the test CA, a Redfish session
    with the emulator's generated credentials, static tokens for every node's plugin."""
    args = [
        *("--redfish-ca-file", str(fabric.tls.ca)),
        *("--redfish-credentials-file", str(fabric.emulator.state_dir / "credentials.json")),
        *("--state-dir", str(work / "manager-state")),
    ]
    if tokens:
        tokens_file = static_tokens_file(
            work / "tokens.json",
            {
                CONTROLLER_TOKEN: ("controller", None),
                OPERATOR_TOKEN: ("operator", None),
                **{plugin_token(node): ("plugin", node) for node in nodes},
            },
        )
        args += ["--static-tokens", str(tokens_file)]
    return [*args, *extra]


@contextlib.contextmanager
def manager_for(
    fabric: FabricAdmin,
    work: Path,
    *extra: str,
    name: str = "manager",
    tokens: bool = True,
    nodes: Sequence[str] = NODES,
) -> Iterator[Role]:
    work.mkdir(parents=True, exist_ok=True)
    args = manager_args(fabric, work, *extra, tokens=tokens, nodes=nodes)
    with running_manager(work, fabric.url, args=args, name=name, ca_file=str(fabric.tls.ca)) as proc:
        yield proc


async def leader_of(managers: dict[str, Role], within: float = 20) -> str:
    """The replica whose /readyz says ready (only the leader is)."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            for name, process in managers.items():
                if process.alive() and (await http.get(f"{process.address}/readyz")).status_code == 200:
                    return name
            assert time.monotonic() < deadline, "no manager became leader"
            await asyncio.sleep(0.1)


def assert_no_secrets(logs: Sequence[Path], *secrets: str) -> None:
    """Read every line of every log: no Redfish password, session token or bearer token in any."""
    for log in logs:
        text = log.read_text(errors="replace")
        for secret in secrets:
            assert secret and secret not in text, f"a secret appears in {log.name}"


async def allocated_claim(
    cluster: ApiServerProcess,
    name: str,
    device: str,
    node: str | None = None,
    *,
    reserved: bool = False,
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    device_class: str = "fabric-dev",
) -> str:
    """A ResourceClaim in ``default`` allocated ``device`` of the PCIe pool (on ``node``, when given),
    as the scheduler leaves it; returns its UID. The manager attaches only for such a claim.
    ``owner``: its controller ownerReference (a claim made from a pod's template has the Pod);
    ``labels``: its labels (a template's are copied into the claim); ``device_class``: its request's."""
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels is not None:
        metadata["labels"] = labels
    if owner is not None:
        metadata["ownerReferences"] = [{**owner, "controller": True}]
    async with cluster.client() as kube:
        claim = await kube.create(
            RESOURCE_CLAIMS,
            {
                "metadata": metadata,
                "spec": {
                    "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": device_class}}]}
                },
            },
            "default",
        )
        allocation: dict[str, Any] = {
            "devices": {
                "results": [
                    {"request": "dev", "driver": "fabric-dra.io", "pool": "fabric-pcie", "device": device}
                ]
            }
        }
        if node is not None:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        claim["status"] = {"allocation": allocation}
        if reserved:
            claim["status"]["reservedFor"] = [{"resource": "pods", "name": f"{name}-0", "uid": f"{name}-pod"}]
        await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
        return str(claim["metadata"]["uid"])
