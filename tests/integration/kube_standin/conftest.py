"""Fixtures of the API test server for this package's tests.

``apiserver``/``kube`` give a fresh server per test (from tests.support.apiserver);
``shared_apiserver`` (with ``mkube``, its client, and ``ns``, a namespace per test) one for
the session, with the real server's defaults, and ``beta_apiserver`` (``bkube``, ``bns``) one
that also serves resource.k8s.io's beta versions (``--runtime-config``), for tests that keep to
their own names and namespaces: process starts are most of this package's run time.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from plumbing.kube import KubeClient
from plumbing.kube.resources import NAMESPACES
from tests.support.apiserver import (
    BETA_APIS,
    ApiServerProcess,
    apiserver,
    kube,
    shared_apiserver,
    start_apiserver,
)

__all__ = ["apiserver", "beta_apiserver", "bkube", "bns", "kube", "mkube", "ns", "shared_apiserver"]


@pytest.fixture(scope="session")
def beta_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    """One server for the session serving resource.k8s.io v1, v1beta2 and v1beta1."""
    with start_apiserver(tmp_path_factory.mktemp("beta-apiserver"), extra_args=BETA_APIS) as server:
        yield server


@pytest_asyncio.fixture
async def mkube(shared_apiserver: ApiServerProcess) -> AsyncIterator[KubeClient]:
    """An admin client of ``shared_apiserver``."""
    async with shared_apiserver.client() as client:
        yield client


@pytest_asyncio.fixture
async def bkube(beta_apiserver: ApiServerProcess) -> AsyncIterator[KubeClient]:
    """An admin client of ``beta_apiserver``."""
    async with beta_apiserver.client() as client:
        yield client


_namespaces = itertools.count(1)


@pytest_asyncio.fixture
async def ns(mkube: KubeClient) -> str:
    """A namespace of this test's own on ``shared_apiserver``."""
    return await _own_namespace(mkube)


@pytest_asyncio.fixture
async def bns(bkube: KubeClient) -> str:
    """A namespace of this test's own on ``beta_apiserver``."""
    return await _own_namespace(bkube)


async def _own_namespace(kube: KubeClient) -> str:
    name = f"ks{next(_namespaces)}-{secrets.token_hex(3)}"  # other packages may share the server
    await kube.create(NAMESPACES, {"metadata": {"name": name}})
    return name
