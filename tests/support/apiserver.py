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
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from fabric_dra_testbed.stack import ADMIN_USER, Stack
from fabric_dra_testbed.stack import ApiServer as ApiServerProcess
from fabric_dra_testbed.stack import ApiServerHooks as TestHooks
from plumbing.kube import KubeClient

__all__ = [
    "ADMIN_USER",
    "ApiServerProcess",
    "TestHooks",
    "apiserver",
    "kube",
    "shared_apiserver",
    "start_apiserver",
]

#: ``--runtime-config`` turning on the beta versions of resource.k8s.io, which a real 1.34+ server
#: (and the API test server) leaves off by default — as deploy/kind's cluster config does.
BETA_APIS = ("--runtime-config", "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true")


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
    with Stack(root, logs_dir=root) as stack:
        yield stack.apiserver(
            root=root,
            tls=tls,
            validate_versions=validate_versions,
            state_file=state_file,
            extra_args=extra_args,
        )


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
