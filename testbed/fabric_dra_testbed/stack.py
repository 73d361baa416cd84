"""The one stack builder: fabric-dra's processes started for real, on real sockets, and always stopped.

The demo, the benchmarks and the integration tests compose a system from the same parts::

    with Stack.temporary("fdra-") as stack:
        api = stack.apiserver()                                   # Kubernetes API test server
        emu = stack.emulator(topology=path, latency="instant")    # Redfish fabric emulator
        mgr = stack.manager(emu, kube=api, static_tokens={...})   # fabric manager
        stack.controller(mgr, api, binding_conditions=True)       # ResourceSlice controller
        plugin = stack.plugin("kind-worker", mgr, api)            # one kubelet plugin per node
        stack.cluster(api, ["kind-worker"])                       # stand-in scheduler + kubelets

Every process is a :class:`Role`: ``fabric-dra <role> ...`` through :class:`plumbing.procs.RoleProcess`,
started (optionally armed with crash points, ``FABRIC_DRA_CRASH_AT``), killed with SIGKILL,
restarted on the same port with the same state and one log across its lives. The builder stops
every role it started in the reverse order of their first start, whatever happens; roles of one
tier next to each other in that order (the plugins, controller and cluster, whose shutdown needs
only the services below them; the API server and the emulator, which need nobody) are sent SIGTERM
together and shut down side by side, each within the same timeout as alone.

One work-dir layout::

    <root>/logs/<name>.log      every process's log (all its lives)
    <root>/run/<name>.ready     where each process writes its address once it serves
    <root>/<emulator name>/     the emulator's state dir: credentials.json, hosts/<host>/sys
    <root>/<apiserver name>/    tokens.yaml, kubeconfig (admin), certificates
    <root>/<manager name>/      the manager's file ledger (--state-dir)
    <root>/tls/                 throw-away CAs and certificates (:meth:`Stack.certificates`)
    <root>/nodes/<node>/        plugins_registry/, plugins/<driver>/, cdi/, token, kubeconfig

Unix socket addresses hold 107 bytes: :meth:`Stack.temporary` makes a short root under /tmp, and
a long root gets its nodes' directories in a short private one instead.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from kube_standin.apiserver.auth import TokensFile, TokenUser, service_account_user
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from plumbing import DEFAULT_DRIVER_NAME
from plumbing.crashpoints import ENV as CRASH_ENV
from plumbing.fsutil import atomic_write
from plumbing.kube import KubeClient, KubeConfig
from plumbing.procs import RoleProcess, RoleStartError

__all__ = [
    "ADMIN_USER",
    "ROLE_MODULES",
    "ApiServer",
    "ApiServerHooks",
    "Controller",
    "DemoStack",
    "Emulator",
    "Manager",
    "NodeDirs",
    "Plugin",
    "Role",
    "RoleStartError",
    "Stack",
    "StackOptions",
    "StopOrder",
    "block_action",
    "connection_body",
    "default_trust",
    "free_port",
    "managers_args",
    "short_dir",
    "static_tokens_file",
    "trust",
    "wait_ready",
    "zone_add",
    "zone_remove",
]

ADMIN_USER = TokenUser(username="kubernetes-admin", groups=["system:masters"])
#: The namespace fabric-dra's own service accounts live in, as deploy/ installs them.
SYSTEM_NAMESPACE = "fabric-dra"
PLUGIN_ACCOUNT = "fabric-dra-plugin"
CONTROLLER_ACCOUNT = "fabric-dra-controller"
#: longest socket path we let a node directory lead to (the address holds 107 bytes)
_SOCKET_PATH_BUDGET = 100
#: Stop tiers (:meth:`Stack.stop`). The services call nobody while they shut down; the manager
#: closes its Redfish session and Leases through them; the clients (plugins, controller, the
#: stand-in cluster) talk to the manager and the API server until they exit, so that nothing
#: reconnects to a manager that is going away, they stop before it.
SERVICE_TIER = "service"
MANAGER_TIER = "manager"
CLIENT_TIER = "client"


#: What the roles import before they serve: each command line and the modules its handler imports
#: (``fabric-dra ROLE``, ``python -m kube_standin``). The test suite starts its roles as forks of one
#: process that has imported these (:mod:`plumbing.forkserver`, ``tests/conftest.py``); a module
#: left out is imported by the child itself, as in a new interpreter; ``module:function`` also runs
#: ``function()`` there once.
ROLE_MODULES: tuple[str, ...] = (
    "fabric_dra.cli:added_commands",  # the testbed's subcommands, found once
    "kube_standin.cli",
    "fabric_dra_testbed.demo.cli",
    "emulator.cli",
    "emulator.redfish.service.server",
    "emulator.redfish.tree.auth",
    "emulator.redfish.model.latency",
    "emulator.topology",
    "fabric.commands.cli",
    "fabric.service.config",
    "fabric.service.manager",
    "fabric.commands.status",
    "fabric.commands.usage",
    "dra_driver.plugin.cli",
    "dra_driver.plugin.config",
    "dra_driver.plugin.server",
    "dra_driver.controller.cli",
    "dra_driver.controller.app",
    "kube_standin.apiserver.app:preload",  # the served kinds' validators, compiled once
    "kube_standin.apiserver.serve",
    "kube_standin.kubelet_client",
    "kube_standin.apiserver.kubeconfig",
    # what the servers and clients import lazily once they run
    "uvicorn.lifespan.on",
    "uvicorn.lifespan.off",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvloop",
    "httpcore",
    "anyio._backends._asyncio",
    "jsonschema",
    "kubernetes_validate",
    "pydantic.v1",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for flags that take no ``0``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def short_dir(prefix: str = "fdra-") -> Path:
    """A new private directory with a short path under /tmp (for unix sockets); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def static_tokens_file(path: Path, tokens: Mapping[str, tuple[str, str | None]]) -> Path:
    """Write the manager's ``--static-tokens`` file: token → (role, node or None)."""
    entries = [
        {"token": token, "role": role, **({"node": node} if node else {})}
        for token, (role, node) in tokens.items()
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"tokens": entries}), mode=0o600, durable=False)
    return path


def default_trust(trust_env: bool = True) -> ssl.SSLContext:
    """What httpx's ``verify=True`` builds, built once per process and shared by every client the
    tests and benchmarks open: with ``trust_env``, the CA file ``SSL_CERT_FILE`` names, else the
    directory ``SSL_CERT_DIR`` names, else certifi's bundle (httpx 0.28 ``create_ssl_context``).
    httpx builds it anew for every client, and a module-level ``httpx.get`` is a client: loading
    a bundle costs 25-50 ms of CPU, so a loop polling the emulator every 30-50 ms spent a whole
    core on it. A context is safe to share between clients and threads; nobody changes this one."""
    if trust_env and os.environ.get("SSL_CERT_FILE"):
        return _trust_from(os.environ["SSL_CERT_FILE"], None)
    if trust_env and os.environ.get("SSL_CERT_DIR"):
        return _trust_from(None, os.environ["SSL_CERT_DIR"])
    import certifi  # httpx's own dependency

    return _trust_from(certifi.where(), None)


@functools.cache
def _trust_from(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile, capath=capath)


def trust(verify: bool) -> ssl.SSLContext | bool:
    """``verify`` for httpx: :func:`default_trust` for True (the same checks, built once)."""
    return default_trust() if verify else False


def wait_ready(url: str, timeout: float = 30.0, ca_file: str | None = None) -> None:
    """Poll the manager's ``/readyz`` until it answers 200 (leader, ledger loaded, inventory read)."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5, context=context) as answer:  # noqa: S310
                if answer.status == 200:
                    return
        except urllib.error.HTTPError as err:
            last = err.read().decode(errors="replace")
        except OSError as err:
            last = str(err)
        time.sleep(0.02)
    raise TimeoutError(f"manager at {url} not ready after {timeout:.0f}s: {last}")


# -- one process ---------------------------------------------------------------------------------


class Role:
    """One role process that can be started (armed with crash points or not), killed and restarted
    with the same arguments — and, once it served on a port, on that port again — with one log file
    across all its lives.

    ``args`` is called at every start, so a caller may change what it reads (a TLS certificate, a
    flag) between two lives. ``port_flag`` adds ``--port`` (``0`` the first time, then the port of
    the first life); ``ready`` adds ``--ready-file`` and waits for it."""

    def __init__(
        self,
        name: str,
        args: Callable[[], list[str]],
        *,
        log_file: Path,
        ready_file: Path | None,
        port_flag: bool = False,
        port: int = 0,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
        module: str = "fabric_dra",
        log_format: str | None = None,
        log_level: str | None = None,
        tier: str | None = None,
    ) -> None:
        self.name = name
        self._args = args
        self.log_file = log_file
        self.ready_file = ready_file
        self.port_flag = port_flag
        self.port = port
        self.env = dict(env or {})
        self.start_timeout = start_timeout
        self.module = module
        self.log_format = log_format
        self.log_level = log_level
        #: roles of one tier may stop side by side (:meth:`Stack.stop`); None: this one stops alone
        self.tier = tier
        self.process: RoleProcess | None = None
        self.lives = 0
        self._log_offset = 0

    def command(self) -> list[str]:
        args = [
            *(["--log-format", self.log_format] if self.log_format else []),
            *(["--log-level", self.log_level] if self.log_level else []),
            *self._args(),
        ]
        if self.port_flag:
            args += ["--port", str(self.port)]
        if self.ready_file is not None:
            args += ["--ready-file", str(self.ready_file)]
        return args

    def start(self, crash_at: Sequence[str] = (), *, kill_previous: bool = False) -> Role:
        """Start a new life; a running one is stopped first (SIGTERM), or with ``kill_previous``
        killed (SIGKILL: quicker, and one more crash, of an idle process)."""
        if self.alive():
            if kill_previous:
                self.kill()
            else:
                self.stop()
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        # Set even when empty: a crash point armed in this process's own environment is not inherited.
        env = {**self.env, CRASH_ENV: ",".join(crash_at)}
        self.process = RoleProcess(
            self.command(),
            ready_file=self.ready_file,
            log_file=self.log_file,
            env=env,
            name=self.name,
            start_timeout=self.start_timeout,
            module=self.module,
        )
        self.lives += 1
        self.process.start()
        if self.port_flag and not self.port and self.process.address:
            self.port = int(self.process.address.rstrip("/").rsplit(":", 1)[1])
        return self

    def restart(self, crash_at: Sequence[str] = (), *, kill_previous: bool = False) -> Role:
        return self.start(crash_at, kill_previous=kill_previous)

    # what a RoleProcess offers, for the life now running

    @property
    def address(self) -> str:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.address

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    @property
    def proc(self) -> Any:
        return self.process.proc if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing in the process gets to clean up."""
        if self.process is not None:
            self.process.kill()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; the exit code (None if never started)."""
        return self.process.stop(timeout) if self.process is not None else None

    def terminate(self) -> None:
        """SIGTERM without waiting; :meth:`reap` waits (see :meth:`Stack.stop`)."""
        if self.process is not None:
            self.process.terminate()

    def reap(self, timeout: float = 10.0) -> int | None:
        """Wait up to ``timeout`` for a terminated life to end, then SIGKILL; the exit code."""
        return self.process.reap(timeout) if self.process is not None else None

    def tail(self, lines: int = 20) -> str:
        return self.process.tail(lines) if self.process is not None else "(never started)"

    def log_since_start(self) -> str:
        if not self.log_file.exists():
            return ""
        with self.log_file.open("rb") as handle:
            handle.seek(self._log_offset)
            return handle.read().decode(errors="replace")

    def wait_crashed(self, point: str, timeout: float = 60.0) -> None:
        """Wait until this life ended at crash point ``point``: killed by SIGKILL, after saying so."""
        assert self.process is not None and self.process.proc is not None
        try:
            code = self.process.proc.wait(timeout=timeout)
        except Exception as err:
            raise AssertionError(
                f"{self.name} did not reach crash point {point} within {timeout:.0f}s; log:\n"
                + "\n".join(self.log_since_start().splitlines()[-25:])
            ) from err
        assert code == -9, f"{self.name} exited with {code}, not SIGKILL:\n{self.process.tail(25)}"
        assert f"point={point}" in self.log_since_start(), (
            f"{self.name} died elsewhere:\n{self.process.tail()}"
        )


# -- the Kubernetes API test server -----------------------------------------------------------------


class ApiServerHooks:
    """Client of the API test server's ``/testing/v1`` hooks: injected faults, request counts,
    compaction, dropping watches (synchronous: callable from any test or benchmark)."""

    def __init__(self, url: str, ca_file: Path | None = None) -> None:
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self._http = httpx.Client(base_url=url + "/testing/v1", timeout=10.0, verify=verify)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = self._http.request(method, path, json=body)
        response.raise_for_status()
        return response.json()

    def fail(
        self,
        resource: str,
        *,
        verbs: Sequence[str] = ("write",),
        count: int = 1,
        code: int = 500,
        group: str | None = None,
        subresource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        reason: str | None = None,
        message: str | None = None,
        delay_seconds: float = 0.0,
        retry_after_seconds: int | None = None,
    ) -> dict[str, Any]:
        """Answer the next ``count`` matching requests with ``code`` (and/or after a delay)."""
        rule: dict[str, Any] = {"resource": resource, "verbs": list(verbs), "count": count, "code": code}
        for key, value in (
            ("group", group),
            ("subresource", subresource),
            ("namespace", namespace),
            ("name", name),
            ("reason", reason),
            ("message", message),
            ("retryAfterSeconds", retry_after_seconds),
        ):
            if value is not None:
                rule[key] = value
        if delay_seconds:
            rule["delaySeconds"] = delay_seconds
        result: dict[str, Any] = self._call("POST", "faults", rule)
        return result

    def faults(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "faults")["faults"])

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")

    def requests(self) -> dict[str, Any]:
        """``{"requests": {resource: {verb: n}}, "writes": {resource: n}, "changes": {...}}``."""
        result: dict[str, Any] = self._call("GET", "requests")
        return result

    def writes(self, resource: str) -> int:
        """Write requests (create/update/patch/delete) received for ``resource`` — e.g.
        ``"resource.k8s.io/resourceslices"`` or ``"pods/status"`` — whatever their outcome."""
        return int(self.requests()["writes"].get(resource, 0))

    def reset_counts(self) -> None:
        self._call("DELETE", "requests")

    def compact(self, resource_version: int | None = None) -> int:
        """Forget history up to ``resource_version`` (default: now): older watches get 410 Gone."""
        body = {} if resource_version is None else {"resourceVersion": resource_version}
        return int(self._call("POST", "compact", body)["compactedResourceVersion"])

    def close_watches(self) -> int:
        """End every open watch stream, as an API server restart would."""
        return int(self._call("POST", "close-watches")["closed"])


def write_tokens(path: Path, tokens: TokensFile) -> None:
    atomic_write(path, yaml.safe_dump(tokens.model_dump(), sort_keys=True), mode=0o600, durable=False)


class ApiServer:
    """A running API test server (``fabric-dra standin apiserver``): URL, admin kubeconfig and token,
    the tokens file TokenReview answers from, and the test hooks."""

    def __init__(
        self, role: Role, root: Path, tokens_file: Path, admin_token: str, ca_file: Path | None
    ) -> None:
        """``role`` has started: its address is known."""
        self.role = role
        self.root = root
        self.tokens_file = tokens_file
        self.admin_token = admin_token
        #: the CA that signed the server's certificate, when it serves HTTPS
        self.ca_file = ca_file
        self.kubeconfig = write_kubeconfig(root / "kubeconfig", self.url, token=admin_token, ca_file=ca_file)
        self.hooks = ApiServerHooks(self.url, ca_file)

    @property
    def process(self) -> Role:
        return self.role

    @property
    def url(self) -> str:
        return self.role.address

    def config(self, token: str | None = None) -> KubeConfig:
        return KubeConfig(
            server=self.url,
            token=token or self.admin_token,
            ca_file=str(self.ca_file) if self.ca_file else None,
        )

    def client(self, token: str | None = None) -> KubeClient:
        """A new :class:`KubeClient` (admin unless ``token``); the caller closes it."""
        return KubeClient(self.config(token))

    def http(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """A synchronous HTTP client with the admin (or ``token``'s) bearer token; the caller closes it."""
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else default_trust()
        )
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        kwargs.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.url, headers=headers, verify=verify, **kwargs)

    def add_token(self, user: TokenUser, token: str | None = None) -> str:
        """Make ``token`` (random when omitted) authenticate as ``user``; returns the token."""
        token = token or secrets.token_urlsafe(24)
        current = TokensFile.model_validate(yaml.safe_load(self.tokens_file.read_text()) or {})
        current.tokens[token] = user
        write_tokens(self.tokens_file, current)
        return token

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        node: str | None = None,
        pod: str | None = None,
        audiences: list[str] | None = None,
    ) -> str:
        """A bound service-account token (with the node-name extra when ``node`` is given)."""
        return self.add_token(service_account_user(namespace, name, node=node, pod=pod, audiences=audiences))

    def log_tail(self, lines: int = 40) -> str:
        return self.role.tail(lines)

    def stop(self) -> int | None:
        self.hooks.close()
        return self.role.stop()


# -- the Redfish fabric emulator -----------------------------------------------------------------

REDFISH_ROOT = "/redfish/v1"


class Emulator:
    """A running ``fabric-dra emulator serve``: its state dir, URL and generated credentials, its
    binding table and fault injection. ``tls`` (certificate, key) and ``auth`` are read at every
    (re)start."""

    def __init__(self, role: Role, state_dir: Path, *, tls: tuple[Path, Path] | None, auth: bool) -> None:
        self.role = role
        self.state_dir = state_dir
        self.tls = tls
        self.auth_enabled = auth
        self.restarts = 0
        self._clients: list[httpx.Client] = []

    # lifecycle

    @property
    def process(self) -> Role:
        return self.role

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing in the emulator gets to clean up."""
        self.role.kill()

    def close_clients(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()

    def stop(self) -> int | None:
        self.close_clients()
        return self.role.stop()

    def restart(self, crash_at: Sequence[str] = ()) -> Emulator:
        """Start again on the same state directory and port (after kill or stop)."""
        if self.role.lives:
            self.restarts += 1
        self.role.start(crash_at)
        return self

    # where and how to reach it

    @property
    def url(self) -> str:
        if self.role.alive() or not self.role.port:
            return self.role.address
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.role.port}"

    @property
    def port(self) -> int:
        return self.role.port

    @property
    def log_file(self) -> Path:
        return self.role.log_file

    @property
    def credentials_file(self) -> Path:
        return self.state_dir / "credentials.json"

    @property
    def credentials(self) -> tuple[str, str] | None:
        if not self.credentials_file.exists():
            return None
        creds = json.loads(self.credentials_file.read_text())
        return str(creds["username"]), str(creds["password"])

    @property
    def username(self) -> str:
        return (self.credentials or ("", ""))[0]

    @property
    def password(self) -> str:
        return (self.credentials or ("", ""))[1]

    @property
    def auth(self) -> tuple[str, str] | None:
        return self.credentials if self.auth_enabled else None

    @property
    def verify(self) -> ssl.SSLContext | bool:
        # Callers outside the manager (the test, the bench, the monitor) trust the emulator.
        return trust(self.tls is None)

    def sysfs(self, host: str) -> Path:
        return self.state_dir / "hosts" / host / "sys"

    def hosts(self) -> list[str]:
        return sorted(p.name for p in (self.state_dir / "hosts").iterdir())

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    # talking to it

    def client(self, **kwargs: Any) -> httpx.Client:
        """A client closed with the emulator."""
        client = httpx.Client(base_url=self.url, auth=self.auth, verify=self.verify, timeout=30.0, **kwargs)
        self._clients.append(client)
        return client

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, auth=self.auth, verify=self.verify, timeout=60.0, **kwargs
        )

    def get(self, path: str) -> dict[str, Any]:
        response = httpx.get(self.url + path, auth=self.auth, verify=self.verify, timeout=30.0)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def bindings(self) -> dict[str, Any]:
        """The emulator's own binding table (``/redfish/v1/Oem/FabricDRA/Bindings``)."""
        return self.get(f"{REDFISH_ROOT}/Oem/FabricDRA/Bindings")

    def bound_hosts(self) -> dict[str, str]:
        """Target Id → host, from the binding table."""
        return {b["Target"]: b["Host"] for b in self.bindings()["Bindings"]}

    def inject(self, spec: dict[str, Any]) -> str | None:
        response = httpx.post(
            f"{self.url}{REDFISH_ROOT}/Oem/FabricDRA/Faults",
            json=spec,
            auth=self.auth,
            verify=self.verify,
            timeout=30.0,
        )
        response.raise_for_status()
        fault_id: str | None = response.json().get("Id")
        return fault_id

    def reset_faults(self) -> None:
        httpx.delete(
            f"{self.url}{REDFISH_ROOT}/Oem/FabricDRA/Faults", auth=self.auth, verify=self.verify, timeout=30.0
        ).raise_for_status()


# requests that bind a device the way the fabric manager's backends do (tests and benchmarks)

ZONES = f"{REDFISH_ROOT}/Fabrics/PCIe/Zones"
ENDPOINTS = f"{REDFISH_ROOT}/Fabrics/PCIe/Endpoints"
BLOCKS = f"{REDFISH_ROOT}/CompositionService/ResourceBlocks"
CONNECTIONS = f"{REDFISH_ROOT}/Fabrics/CXL/Connections"


def zone_add(host: str, device: str) -> tuple[str, dict[str, Any]]:
    """The request that binds ``device`` to ``host`` through the host's zone."""
    return f"{ZONES}/{host}/Actions/Zone.AddEndpoint", {"Endpoint": {"@odata.id": f"{ENDPOINTS}/{device}"}}


def zone_remove(host: str, device: str) -> tuple[str, dict[str, Any]]:
    return f"{ZONES}/{host}/Actions/Zone.RemoveEndpoint", {"Endpoint": {"@odata.id": f"{ENDPOINTS}/{device}"}}


def block_action(host: str, device: str, action: str = "AddResourceBlock") -> tuple[str, dict[str, Any]]:
    return (
        f"{REDFISH_ROOT}/Systems/{host}/Actions/ComputerSystem.{action}",
        {"ResourceBlock": {"@odata.id": f"{BLOCKS}/{device}"}},
    )


def connection_body(host: str, device: str, *chunks: int) -> dict[str, Any]:
    return {
        "ConnectionType": "Memory",
        "MemoryChunkInfo": [
            {
                "AccessCapabilities": ["Read", "Write"],
                "MemoryChunk": {
                    "@odata.id": f"{REDFISH_ROOT}/Chassis/{device}/MemoryDomains/0/MemoryChunks/{n}"
                },
            }
            for n in chunks
        ],
        "Links": {"InitiatorEndpoints": [{"@odata.id": f"{REDFISH_ROOT}/Fabrics/CXL/Endpoints/{host}"}]},
    }


# -- the fabric manager, the controller and the plugins --------------------------------------------


class Manager:
    """A running ``fabric-dra manager serve``. ``args`` (extra flags), ``redfish_args`` (how it
    reaches and trusts the Redfish service) and ``tls``/``ca_file`` (its own listener) are read at
    every (re)start; :meth:`start` waits for ``/readyz`` unless ``ready`` is false."""

    def __init__(
        self,
        role: Role,
        *,
        args: list[str],
        redfish_args: list[str],
        tls: tuple[Path, Path] | None,
        ca_file: Path | None,
        ready: bool,
        ready_timeout: float,
    ) -> None:
        self.role = role
        self.args = args
        self.redfish_args = redfish_args
        self.tls = tls
        self.ca_file = ca_file
        self.ready = ready
        self.ready_timeout = ready_timeout

    def start(self, crash_at: Sequence[str] = (), *, kill_previous: bool = False) -> Manager:
        self.role.start(crash_at, kill_previous=kill_previous)
        if self.ready:
            try:
                wait_ready(self.url, self.ready_timeout, str(self.ca_file) if self.ca_file else None)
            except BaseException:
                self.role.stop()
                raise
        return self

    restart = start

    @property
    def url(self) -> str:
        if self.role.alive() or not self.role.port:
            return self.role.address
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.role.port}"

    address = url

    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else default_trust()

    def ca_args(self) -> list[str]:
        """The flags a client role needs to trust this manager."""
        return ["--manager-ca-file", str(self.ca_file)] if self.ca_file else []

    def named_args(self, name: str) -> list[str]:
        """The flags a client role given several managers needs for this one, named ``name``."""
        out = ["--manager", f"{name}={self.url}"]
        return out + (["--manager-ca-files", f"{name}={self.ca_file}"] if self.ca_file else [])

    def stop(self) -> int | None:
        return self.role.stop()


def managers_args(managers: Mapping[str, Manager]) -> list[str]:
    """``--manager NAME=URL`` (and its CA) for each of several managers, in order."""
    return [arg for name, manager in managers.items() for arg in manager.named_args(name)]


@dataclass
class NodeDirs:
    """A node's kubelet directories and credentials, as the plugin of that node sees them."""

    name: str
    root: Path
    driver_name: str = DEFAULT_DRIVER_NAME

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugins" / self.driver_name

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def make(self) -> NodeDirs:
        for path in (self.registry_dir, self.plugin_dir, self.cdi_root):
            path.mkdir(parents=True, exist_ok=True)
        return self


@dataclass
class Plugin:
    """A running ``fabric-dra plugin`` of one node."""

    node: str
    dirs: NodeDirs
    role: Role
    metrics_port: int | None

    @property
    def process(self) -> Role:
        return self.role

    @property
    def pid(self) -> int:
        return self.role.pid

    @property
    def registry_dir(self) -> Path:
        return self.dirs.registry_dir

    @property
    def registration_socket(self) -> Path:
        return self.dirs.registry_dir / f"{self.dirs.driver_name}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return Path(self.role.address)


@dataclass
class Controller:
    """A running ``fabric-dra controller``; ``port`` serves its /metrics and health.
    ``binding_conditions`` is read at every (re)start."""

    role: Role
    binding_conditions: bool = False

    @property
    def port(self) -> int:
        return self.role.port

    @property
    def pid(self) -> int:
        return self.role.pid


# -- the builder ---------------------------------------------------------------------------------


class StopOrder:
    """What a stack stops, and in which order: its roles (stopped) and callbacks (called), in the
    reverse order they were added, a run of roles of one tier side by side."""

    def __init__(self) -> None:
        #: roles and callbacks, in the order they were added
        self._closers: list[Role | Callable[[], object]] = []

    def add(self, closer: Role | Callable[[], object]) -> None:
        self._closers.append(closer)

    def __bool__(self) -> bool:
        return bool(self._closers)

    def stop(self, timeout: float) -> list[BaseException]:
        """Stop every role and call every callback; the errors raised on the way. A run of roles
        of one tier (callbacks among them are called first: they close the caller's own clients)
        is sent SIGTERM together, then each is given ``timeout`` seconds from then and killed
        after it. Stopping one after another cost a stack the sum of its parts' shutdowns; side
        by side it costs about the slowest of each tier."""
        errors: list[BaseException] = []
        while self._closers:
            callbacks, roles = self.next_run()
            for close in callbacks:
                try:
                    close()
                except Exception as err:  # every other part still has to stop
                    errors.append(err)
            for role in roles:
                try:
                    role.terminate()
                except Exception as err:
                    errors.append(err)
            deadline = time.monotonic() + timeout
            for role in roles:
                try:
                    role.reap(max(0.0, deadline - time.monotonic()))
                except Exception as err:
                    errors.append(err)
        return errors

    def next_run(self) -> tuple[list[Callable[[], object]], list[Role]]:
        """Take from the end of the closers the next run that stops together: callbacks and the
        roles of one tier (a role without a tier alone). Callbacks after the run's last role in
        stop order stay for the next run, so none is called before a role it used to follow."""
        callbacks: list[Callable[[], object]] = []
        roles: list[Role] = []
        pending: list[Callable[[], object]] = []  # callbacks since the run's last role
        while self._closers:
            closer = self._closers.pop()
            if not isinstance(closer, Role):
                (pending if roles else callbacks).append(closer)
            elif not roles or (closer.tier is not None and closer.tier == roles[0].tier):
                callbacks += pending
                pending.clear()
                roles.append(closer)
            else:
                self._closers.append(closer)
                break
        self._closers.extend(reversed(pending))
        return callbacks, roles


class Stack:
    """Starts the parts of a local fabric-dra system under one work dir and stops them all, in the
    reverse order of their first start (also when a start fails: use it as a context manager)."""

    def __init__(
        self,
        root: Path,
        *,
        owns_root: bool = False,
        logs_dir: Path | None = None,
        log_format: str | None = None,
        driver_name: str = DEFAULT_DRIVER_NAME,
        start_timeout: float = 120.0,
    ) -> None:
        self.root = root
        self.owns_root = owns_root
        #: where the processes log (default ``<root>/logs``)
        self.logs_dir = logs_dir or root / "logs"
        self.log_format = log_format
        self.driver_name = driver_name
        #: a loaded CI machine (the whole suite on two cores) is slow to import a role
        self.start_timeout = start_timeout
        self.roles: dict[str, Role] = {}
        #: roles (stopped) and callbacks (called) when the stack stops
        self.stop_order = StopOrder()
        self._nodes_root: Path | None = None
        self._short_nodes_root: Path | None = None
        root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def temporary(cls, prefix: str = "fdra-", **kwargs: Any) -> Stack:
        """A stack in a new short directory under /tmp, removed when it stops."""
        return cls(short_dir(prefix), owns_root=True, **kwargs)

    # -- layout -----------------------------------------------------------------------------------

    def log_file(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def ready_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.ready"

    def node_dirs(self, node: str) -> NodeDirs:
        """The kubelet dirs of ``node``: under ``<root>/nodes`` unless that makes a socket path too
        long for a unix address; then under one short private directory in /tmp."""
        if self._nodes_root is None:
            root = self.root / "nodes"
            sample = root / ("x" * 24) / "plugins_registry" / f"{self.driver_name}-reg.sock"
            if len(str(sample).encode()) > _SOCKET_PATH_BUDGET:
                self._short_nodes_root = short_dir("fdn-")
                root = self._short_nodes_root
            self._nodes_root = root
        return NodeDirs(node, self._nodes_root / node, self.driver_name)

    # -- lifecycle --------------------------------------------------------------------------------

    def role(
        self,
        name: str,
        args: Callable[[], list[str]],
        *,
        port_flag: bool = False,
        ready: bool = True,
        env: Mapping[str, str] | None = None,
        module: str = "fabric_dra",
        start_timeout: float | None = None,
        log_level: str | None = None,
        tier: str | None = None,
    ) -> Role:
        """A role of this stack, not started yet; stopped with the stack, side by side with its
        neighbours of the same ``tier`` (None: alone)."""
        if name in self.roles:
            raise ValueError(f"the stack already has a role named {name}")
        role = Role(
            name,
            args,
            log_file=self.log_file(name),
            ready_file=self.ready_file(name) if ready else None,
            port_flag=port_flag,
            env=env,
            start_timeout=start_timeout or self.start_timeout,
            module=module,
            log_format=self.log_format if module == "fabric_dra" else None,
            log_level=log_level,
            tier=tier,
        )
        self.roles[name] = role
        self.stop_order.add(role)
        self.ready_file(name).parent.mkdir(parents=True, exist_ok=True)
        return role

    def callback(self, close: Callable[[], object]) -> None:
        """Run ``close`` when the stack stops (in reverse order with the roles)."""
        self.stop_order.add(close)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every role and call every callback (:meth:`StopOrder.stop`), then remove the
        directories the stack made for itself; the first error raised, once all is stopped."""
        errors = self.stop_order.stop(timeout)
        if self._short_nodes_root is not None:
            shutil.rmtree(self._short_nodes_root, ignore_errors=True)
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> Stack:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- certificates -----------------------------------------------------------------------------

    def certificates(self, name: str, *hosts: str) -> tuple[Path, Path, Path]:
        """A throw-away CA and a certificate it signed for ``hosts`` (default 127.0.0.1 and
        localhost): (ca, certificate chain, key) under ``<root>/tls``."""
        import trustme  # a test and bench dependency; only TLS stacks need it

        authority = trustme.CA()
        leaf = authority.issue_cert(*(hosts or ("127.0.0.1", "localhost")))
        tls = self.root / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        ca, cert, key = tls / f"{name}-ca.pem", tls / f"{name}.pem", tls / f"{name}-key.pem"
        authority.cert_pem.write_to_path(str(ca))
        for index, blob in enumerate(leaf.cert_chain_pems):
            blob.write_to_path(str(cert), append=index > 0)
        leaf.private_key_pem.write_to_path(str(key))
        key.chmod(0o600)
        return ca, cert, key

    # -- the parts --------------------------------------------------------------------------------

    def apiserver(
        self,
        *,
        name: str = "apiserver",
        root: Path | None = None,
        tokens: Mapping[str, TokenUser] | None = None,
        admin_token: str | None = None,
        tls: bool = False,
        validate_versions: str | None = None,
        state_file: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> ApiServer:
        """The Kubernetes API test server with a tokens file (an admin token plus ``tokens``); with
        ``tls`` it serves HTTPS with a certificate from a throw-away CA (kubectl sends a
        kubeconfig's token only over TLS)."""
        root = root or self.root / name
        root.mkdir(parents=True, exist_ok=True)
        tokens_file = root / "tokens.yaml"
        admin_token = admin_token or secrets.token_urlsafe(24)
        existing = (
            TokensFile.model_validate(yaml.safe_load(tokens_file.read_text()) or {})
            if tokens_file.exists()
            else TokensFile(tokens={})
        )
        existing.tokens[admin_token] = ADMIN_USER
        existing.tokens.update(tokens or {})
        write_tokens(tokens_file, existing)
        args = ["standin", "apiserver", "--tokens", str(tokens_file)]
        if validate_versions is not None:
            args += ["--validate-versions", validate_versions]
        if state_file is not None:
            args += ["--state-file", str(state_file)]
        ca_file = None
        if tls:
            ca_file, cert, key = self.certificates(name)
            args += ["--tls-cert-file", str(cert), "--tls-private-key-file", str(key)]
        args += list(extra_args)
        role = self.role(name, lambda: list(args), port_flag=True, tier=SERVICE_TIER)
        role.start()
        server = ApiServer(role, root, tokens_file, admin_token, ca_file)
        self.callback(server.hooks.close)  # before the process stops
        return server

    def emulator(
        self,
        *,
        name: str = "emulator",
        state_dir: Path | None = None,
        topology: Path | None = None,
        latency: str = "instant",
        auth: bool = True,
        tls: tuple[Path, Path] | None = None,
        extra_args: Sequence[str] = (),
        start: bool = True,
    ) -> Emulator:
        """The Redfish fabric emulator (the packaged topology unless ``topology``); ``auth=False``
        serves without authentication; ``tls`` = (certificate, key) serves HTTPS."""
        state = state_dir or self.root / name
        emulator: Emulator

        def args() -> list[str]:
            out = ["emulator", "serve", "--state-dir", str(state), "--latency", latency]
            if topology is not None:
                out += ["--topology", str(topology)]
            if not emulator.auth_enabled:
                out.append("--insecure-no-auth")
            if emulator.tls is not None:
                out += ["--tls-cert", str(emulator.tls[0]), "--tls-key", str(emulator.tls[1])]
            return [*out, *extra_args]

        emulator = Emulator(
            self.role(name, args, port_flag=True, tier=SERVICE_TIER), state, tls=tls, auth=auth
        )
        self.callback(emulator.close_clients)
        if start:
            emulator.restart()
        return emulator

    def manager(
        self,
        redfish: Emulator | str,
        *,
        name: str = "manager",
        kube: ApiServer | Path | None = None,
        namespace: str | None = None,
        state_dir: Path | None = None,
        ledger: str | None = "file",
        static_tokens: Mapping[str, tuple[str, str | None]] | None = None,
        insecure_no_auth: bool = False,
        redfish_args: Sequence[str] | None = None,
        tls: tuple[Path, Path] | None = None,
        ca_file: Path | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        ready_timeout: float | None = None,
        start: bool = True,
        crash_at: Sequence[str] = (),
    ) -> Manager:
        """The fabric manager on ``redfish`` (an emulator of this stack: its credentials, or none
        when it serves without authentication; or a URL, ``redfish_args`` saying how to log in).
        ``kube`` gives it API access (TokenReview, claims, Events, Leases; an API server or a
        kubeconfig); ``static_tokens`` (token → role, node) its own bearer tokens; the ledger is a
        file under ``state_dir`` (default ``<root>/<name>``) unless ``ledger="configmap"``;
        ``ledger=None`` passes no ledger flags (``args`` has them)."""
        if redfish_args is None:
            if isinstance(redfish, Emulator) and not redfish.auth_enabled:
                redfish_args = ["--redfish-auth", "none"]
            elif isinstance(redfish, Emulator):
                redfish_args = ["--redfish-credentials-file", str(redfish.credentials_file)]
            else:
                redfish_args = []
        fixed: list[str] = ["--ledger", ledger] if ledger else []
        if ledger == "file":
            fixed += ["--state-dir", str(state_dir or self.root / name)]
        if kube is not None:
            fixed += ["--kubeconfig", str(kube.kubeconfig if isinstance(kube, ApiServer) else kube)]
        if namespace is not None:
            fixed += ["--namespace", namespace]
        if static_tokens is not None:
            fixed += [
                "--static-tokens",
                str(static_tokens_file(self.root / f"{name}-tokens.json", static_tokens)),
            ]
        if insecure_no_auth:
            fixed.append("--insecure-no-auth")
        manager: Manager

        def command() -> list[str]:
            url = redfish.url if isinstance(redfish, Emulator) else redfish
            tls_args = (
                ["--tls-cert", str(manager.tls[0]), "--tls-key", str(manager.tls[1])] if manager.tls else []
            )
            return [
                "manager",
                "serve",
                "--redfish-url",
                url,
                *fixed,
                *manager.args,
                *manager.redfish_args,
                *tls_args,
            ]

        manager = Manager(
            self.role(name, command, port_flag=True, env=env, tier=MANAGER_TIER),
            args=list(args),
            redfish_args=list(redfish_args),
            tls=tls,
            ca_file=ca_file,
            ready=ready,
            ready_timeout=ready_timeout or self.start_timeout,
        )
        if start:
            manager.start(crash_at)
        return manager

    def controller(
        self,
        manager: Manager | None,
        kube: ApiServer | Path,
        *,
        name: str = "controller",
        token_file: Path | None = None,
        binding_conditions: bool = False,
        args: Sequence[str] = (),
        log_level: str | None = None,
        start: bool = True,
        crash_at: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Controller:
        """The slice (and binding-condition) controller; more managers: ``args`` (:func:`managers_args`)."""
        kubeconfig = kube.kubeconfig if isinstance(kube, ApiServer) else kube
        controller: Controller

        def command() -> list[str]:
            out = ["controller", "--kubeconfig", str(kubeconfig), "--driver-name", self.driver_name]
            out += ["--host", "127.0.0.1"]
            if manager is not None:
                out += ["--manager-url", manager.url, *manager.ca_args()]
            if token_file is not None:
                out += ["--manager-token-file", str(token_file)]
            if controller.binding_conditions:
                out.append("--binding-conditions")
            return [*out, *args]

        controller = Controller(
            self.role(name, command, port_flag=True, env=env, log_level=log_level, tier=CLIENT_TIER),
            binding_conditions,
        )
        if start:
            controller.role.start(crash_at)
        return controller

    def plugin(
        self,
        node: str,
        manager: Manager | None,
        kube: ApiServer | Path,
        *,
        name: str | None = None,
        dirs: NodeDirs | None = None,
        sysfs_root: Path | None = None,
        backend: str = "fabric",
        token_file: Path | None = None,
        metrics_port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        start: bool = True,
        crash_at: Sequence[str] = (),
    ) -> Plugin:
        """The kubelet plugin of ``node`` (its dirs from :meth:`node_dirs` unless ``dirs``); a
        ``backend="fabric"`` plugin needs ``sysfs_root``, e.g. an emulator's ``sysfs(node)``."""
        dirs = (dirs or self.node_dirs(node)).make()
        kubeconfig = kube.kubeconfig if isinstance(kube, ApiServer) else kube
        extra = list(args)

        def command() -> list[str]:
            out = ["plugin", "--node-name", node, "--kubeconfig", str(kubeconfig)]
            out += ["--registry-dir", str(dirs.registry_dir), "--plugin-dir", str(dirs.plugin_dir)]
            out += ["--cdi-root", str(dirs.cdi_root), "--device-backend", backend]
            out += ["--sysfs-root", str(sysfs_root or dirs.root / "sys")]
            if manager is not None:
                out += ["--manager-url", manager.url, *manager.ca_args()]
            if token_file is not None:
                out += ["--manager-token-file", str(token_file)]
            if metrics_port is not None:
                out += ["--metrics-port", str(metrics_port)]
            return [*out, *extra]

        # A plugin outside a pod: no POD_UID, so its sockets keep the kubelet's plain names.
        role = self.role(
            name or f"plugin-{node}", command, env={"POD_UID": "", **(env or {})}, tier=CLIENT_TIER
        )
        plugin = Plugin(node, dirs, role, metrics_port)
        if start:
            role.start(crash_at)
        return plugin

    def cluster(
        self,
        kube: ApiServer | Path,
        nodes: Sequence[str | NodeDirs],
        *,
        name: str = "cluster",
        binding_timeout: float | None = None,
        start: bool = True,
    ) -> Role:
        """The stand-in control plane (Deployment and ResourceClaim controllers, the DRA scheduler)
        and one kubelet per node, registering the plugins of each node's registry dir."""
        kubeconfig = kube.kubeconfig if isinstance(kube, ApiServer) else kube
        specs = [n if isinstance(n, NodeDirs) else self.node_dirs(n) for n in nodes]

        def command() -> list[str]:
            out = ["--kubeconfig", str(kubeconfig), "--log-level", "info"]
            for spec in specs:
                out += ["--node", f"{spec.name}:{spec.registry_dir}"]
            if binding_timeout is not None:
                out += ["--binding-timeout", str(binding_timeout)]
            return out

        role = self.role(name, command, module="kube_standin.cluster", tier=CLIENT_TIER)
        if start:
            role.start()
        return role


# -- the demo's system ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackOptions:
    workdir: Path
    latency: str = "instant"
    binding_conditions: bool = False
    driver_name: str = DEFAULT_DRIVER_NAME


@dataclass
class DemoStack:
    """The demo's system, as a cluster installed from deploy/ has it: the emulator with
    authentication, the API test server with one token per identity (admin, operator, the
    controller's and each node's plugin service account, bound to the node), the manager with
    TokenReview auth and its ledger in a ConfigMap, the controller (Lease-elected) and one plugin
    per node, each with its own kubeconfig."""

    options: StackOptions
    progress: Callable[[str], None]
    nodes: list[NodeDirs] = field(default_factory=list)
    admin_token: str = ""
    operator_token: str = ""
    stack: Stack = field(init=False)
    emulator: Emulator | None = None
    api: ApiServer | None = None
    manager: Manager | None = None
    controller: Controller | None = None

    def __post_init__(self) -> None:
        self.stack = Stack(self.options.workdir, log_format="logfmt", driver_name=self.options.driver_name)

    # what the scenario reads

    @property
    def workdir(self) -> Path:
        return self.options.workdir

    @property
    def processes(self) -> dict[str, Role]:
        return {name: role for name, role in self.stack.roles.items() if role.lives}

    @property
    def kube_dir(self) -> Path:
        return self.workdir / "apiserver"

    @property
    def admin_kubeconfig(self) -> Path:
        assert self.api is not None
        return self.api.kubeconfig

    @property
    def redfish_url(self) -> str:
        assert self.emulator is not None
        return self.emulator.url

    @property
    def apiserver_url(self) -> str:
        assert self.api is not None
        return self.api.url

    @property
    def manager_url(self) -> str:
        assert self.manager is not None
        return self.manager.url

    def sysfs_root(self, node: str) -> Path:
        assert self.emulator is not None
        return self.emulator.sysfs(node)

    def log_file(self, role: str) -> Path:
        return self.stack.log_file(role)

    def redfish_get(self, path: str) -> dict[str, Any]:
        assert self.emulator is not None
        return self.emulator.get(path)

    # the steps

    def stop(self) -> None:
        self.stack.stop()

    def start_fabric(self) -> list[str]:
        """The Redfish emulator with its packaged topology; returns the hosts it serves."""
        self.emulator = self.stack.emulator(latency=self.options.latency)
        systems = self.redfish_get("/redfish/v1/Systems")
        hosts = [member["@odata.id"].rsplit("/", 1)[-1] for member in systems.get("Members", [])]
        self.progress(f"emulator    {self.redfish_url}  Redfish fabric, hosts {', '.join(hosts)}")
        return hosts

    def start_apiserver(self, hosts: list[str]) -> None:
        """The Kubernetes API test server, with a token per identity as the real cluster would issue."""
        self.admin_token = secrets.token_hex(24)
        self.operator_token = secrets.token_hex(24)
        tokens = {self.operator_token: TokenUser(username="demo-operator", groups=["fabric-dra:operators"])}
        controller_token = secrets.token_hex(24)
        tokens[controller_token] = service_account_user(SYSTEM_NAMESPACE, CONTROLLER_ACCOUNT)
        node_tokens: dict[str, str] = {}
        for host in hosts:
            node = self.stack.node_dirs(host).make()
            # Bound service-account tokens carry the pod's node; the manager trusts only that.
            node_tokens[host] = token = secrets.token_hex(24)
            tokens[token] = service_account_user(SYSTEM_NAMESPACE, PLUGIN_ACCOUNT, node=host)
            atomic_write(node.token_file, token, mode=0o600, durable=False)
            self.nodes.append(node)
        self.api = self.stack.apiserver(root=self.kube_dir, tokens=tokens, admin_token=self.admin_token)
        atomic_write(self.kube_dir / "controller.token", controller_token, mode=0o600, durable=False)
        # deploy/ installs fabric-dra into its own namespace: its Leases and ledger live there.
        with self.api.http() as api:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}
            api.post("/api/v1/namespaces", json=namespace).raise_for_status()
        for node in self.nodes:
            write_kubeconfig(node.kubeconfig, self.apiserver_url, token=node_tokens[node.name])
        write_kubeconfig(self.kube_dir / "controller.kubeconfig", self.apiserver_url, token=controller_token)
        self.progress(
            f"apiserver   {self.apiserver_url}  Kubernetes API test server (strict schemas 1.34-1.37)"
        )

    def register_nodes(self) -> None:
        """Create the Node objects as each node's kubelet would, with the host's system UUID (the
        manager maps Redfish ComputerSystems to nodes by it)."""
        assert self.api is not None
        with self.api.http() as api:
            for node in self.nodes:
                system = self.redfish_get(f"/redfish/v1/Systems/{node.name}")
                body = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name}},
                }
                api.post("/api/v1/nodes", json=body).raise_for_status()
                status = {
                    "status": {
                        "nodeInfo": {
                            "systemUUID": system.get("UUID", ""),
                            "machineID": "",
                            "bootID": "",
                            "kernelVersion": "",
                            "osImage": "fabric-dra demo host",
                            "containerRuntimeVersion": "",
                            "kubeletVersion": "",
                            "kubeProxyVersion": "",
                            "operatingSystem": "linux",
                            "architecture": "amd64",
                        },
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    }
                }
                api.patch(
                    f"/api/v1/nodes/{node.name}/status",
                    json=status,
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()
        self.progress(f"nodes       {len(self.nodes)} Node objects registered with their hosts' system UUIDs")

    def start_manager(self) -> None:
        assert self.emulator is not None and self.api is not None
        self.manager = self.stack.manager(
            self.emulator,
            kube=self.api,
            namespace=SYSTEM_NAMESPACE,
            ledger="configmap",
            args=["--operator-user", "demo-operator"],
            ready=False,
            ready_timeout=45.0,
        )
        self.progress(f"manager     {self.manager_url}  fabric manager (Redfish session, TokenReview auth)")

    def start_controller(self, *, binding_conditions: bool) -> None:
        """The controller; called again, it restarts it with the new mode (same log, same port)."""
        if self.controller is None:
            self.controller = self.stack.controller(
                self.manager,
                self.kube_dir / "controller.kubeconfig",
                token_file=self.kube_dir / "controller.token",
                binding_conditions=binding_conditions,
                args=["--leader-elect", "--lease-namespace", SYSTEM_NAMESPACE],
            )
        else:
            self.controller.binding_conditions = binding_conditions
            self.controller.role.restart()
        mode = "binding conditions" if binding_conditions else "plain"
        self.progress(f"controller  pid {self.controller.pid}  ResourceSlice publisher ({mode})")

    def start_plugins(self) -> None:
        assert self.emulator is not None
        for node in self.nodes:
            self.stack.plugin(
                node.name,
                self.manager,
                node.kubeconfig,
                dirs=node,
                sysfs_root=self.emulator.sysfs(node.name),
                token_file=node.token_file,
            )
        names = ", ".join(node.name for node in self.nodes)
        where = self.nodes[0].root.parent if self.nodes else self.workdir
        self.progress(f"plugins     one per node ({names}), kubelet sockets under {where}")
