"""The Kubernetes API test server as a real process, for any test that needs a control plane.

Use the fixtures (import them into a conftest.py, or ``pytest_plugins = ["tests.support.apiserver"]``)::

    from tests.support.apiserver import apiserver, kube  # noqa: F401 - fixtures

    async def test_something(apiserver: ApiServerProcess, kube: KubeClient) -> None:
        await kube.create(CONFIGMAPS, {...}, "default")
        assert apiserver.hooks.writes("configmaps") == 1

or start one yourself (``with start_apiserver(tmp_path) as server: ...``). Every server runs
with a tokens file and an admin token (``server.admin_token``); ``server.kubeconfig`` points
at it with that token (pass it as ``--kubeconfig`` to a role); ``server.add_token(...)`` /
``server.service_account_token(...)`` add identities while it runs (TokenReview answers
from them). ``server.hooks`` drives the test hooks: injected faults, request counts,
compaction, dropping watches. See docs/testing.md.
"""

from __future__ import annotations

import contextlib
import secrets
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from kube_standin.apiserver.auth import TokensFile, TokenUser, service_account_user
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from plumbing.kube import KubeClient, KubeConfig
from plumbing.procs import RoleProcess

__all__ = [
    "ApiServerProcess",
    "TestHooks",
    "apiserver",
    "apiserver_command",
    "kube",
    "shared_apiserver",
    "start_apiserver",
]

ADMIN_USER = TokenUser(username="kubernetes-admin", groups=["system:masters"])


def apiserver_command() -> tuple[str, tuple[str, ...]]:
    """(module, leading args) that start the server: ``fabric-dra standin apiserver``."""
    return "fabric_dra", ("standin", "apiserver")


class TestHooks:
    """Client of the server's ``/testing/v1`` hooks (synchronous: call it from any test)."""

    __test__ = False  # not a pytest test class

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


class ApiServerProcess:
    """A running API test server: its URL, kubeconfig, admin token, tokens file and hooks."""

    def __init__(
        self,
        process: RoleProcess,
        root: Path,
        tokens_file: Path,
        admin_token: str,
        ca_file: Path | None = None,
    ) -> None:
        self.process = process
        self.root = root
        self.url = process.address
        self.tokens_file = tokens_file
        self.admin_token = admin_token
        #: the CA that signed the server's certificate, when it serves HTTPS (``tls=True``).
        self.ca_file = ca_file
        self.kubeconfig = write_kubeconfig(root / "kubeconfig", self.url, token=admin_token, ca_file=ca_file)
        self.hooks = TestHooks(self.url, ca_file)

    def config(self, token: str | None = None) -> KubeConfig:
        return KubeConfig(
            server=self.url,
            token=token or self.admin_token,
            ca_file=str(self.ca_file) if self.ca_file else None,
        )

    def client(self, token: str | None = None) -> KubeClient:
        """A new :class:`KubeClient` (admin unless ``token``); the caller closes it."""
        return KubeClient(self.config(token))

    def add_token(self, user: TokenUser, token: str | None = None) -> str:
        """Make ``token`` (random when omitted) authenticate as ``user``; returns the token."""
        token = token or secrets.token_urlsafe(24)
        current = TokensFile.model_validate(yaml.safe_load(self.tokens_file.read_text()) or {})
        current.tokens[token] = user
        _write_tokens(self.tokens_file, current)
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
        return self.process.tail(lines)

    def stop(self) -> int | None:
        self.hooks.close()
        return self.process.stop()


def _write_tokens(path: Path, tokens: TokensFile) -> None:
    from plumbing.fsutil import atomic_write

    atomic_write(path, yaml.safe_dump(tokens.model_dump(), sort_keys=True), mode=0o600, durable=False)


def _certificates(root: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost: (ca, cert, key)."""
    import trustme

    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = root / "ca.pem", root / "apiserver.pem", root / "apiserver-key.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    issued.cert_chain_pems[0].write_to_path(str(cert_file))
    issued.private_key_pem.write_to_path(str(key_file))
    key_file.chmod(0o600)
    return ca_file, cert_file, key_file


@contextlib.contextmanager
def start_apiserver(
    root: Path,
    *,
    extra_args: Sequence[str] = (),
    validate_versions: str | None = None,
    state_file: Path | None = None,
    tls: bool = False,
) -> Iterator[ApiServerProcess]:
    """Start an API test server in ``root`` (its log: ``root/apiserver.log``); always stops it.

    With ``tls`` it serves HTTPS with a certificate from a throw-away CA (``server.ca_file``,
    also in the kubeconfig). kubectl needs that to send the token: client-go applies a
    kubeconfig's credentials only over TLS.
    """
    root.mkdir(parents=True, exist_ok=True)
    tokens_file = root / "tokens.yaml"
    admin_token = secrets.token_urlsafe(24)
    if not tokens_file.exists():
        _write_tokens(tokens_file, TokensFile(tokens={admin_token: ADMIN_USER}))
    else:
        existing = TokensFile.model_validate(yaml.safe_load(tokens_file.read_text()) or {})
        existing.tokens[admin_token] = ADMIN_USER
        _write_tokens(tokens_file, existing)
    module, lead = apiserver_command()
    args = [*lead, "--port", "0", "--ready-file", str(root / "apiserver.url"), "--tokens", str(tokens_file)]
    if validate_versions is not None:
        args += ["--validate-versions", validate_versions]
    if state_file is not None:
        args += ["--state-file", str(state_file)]
    ca_file = None
    if tls:
        ca_file, cert_file, key_file = _certificates(root)
        args += ["--tls-cert-file", str(cert_file), "--tls-private-key-file", str(key_file)]
    args += list(extra_args)
    process = RoleProcess(
        args,
        module=module,
        ready_file=root / "apiserver.url",
        log_file=root / "apiserver.log",
        name="apiserver",
    )
    process.start()
    server = ApiServerProcess(process, root, tokens_file, admin_token, ca_file)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerProcess]:
    """A fresh API test server for one test."""
    with start_apiserver(tmp_path / "apiserver") as server:
        yield server


@pytest.fixture(scope="session")
def shared_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    """One API test server for the whole session: cheaper, but tests must keep to their own
    names/namespaces/drivers and must not rely on global counts."""
    with start_apiserver(tmp_path_factory.mktemp("shared-apiserver")) as server:
        yield server


@pytest_asyncio.fixture
async def kube(apiserver: ApiServerProcess) -> AsyncIterator[KubeClient]:
    """An admin :class:`KubeClient` connected to ``apiserver``."""
    async with apiserver.client() as client:
        yield client
