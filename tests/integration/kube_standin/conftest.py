"""Fixtures of the API test server for this package's tests.

``apiserver``/``kube`` give a fresh server per test (from tests.support.apiserver);
``module_server`` (with ``mkube``, its client, and ``ns``, a namespace per test) one shared
by the session, for tests that keep to their own names and namespaces.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dra_driver.kube import KubeClient
from dra_driver.kube.resources import NAMESPACES
from tests.support.apiserver import ApiServerProcess, apiserver, kube, shared_apiserver

__all__ = ["apiserver", "kube", "mkube", "module_server", "ns", "shared_apiserver"]


@pytest.fixture(scope="session")
def module_server(shared_apiserver: ApiServerProcess) -> ApiServerProcess:
    """The session's shared server (process starts dominate this package's run time)."""
    return shared_apiserver


@pytest_asyncio.fixture
async def mkube(module_server: ApiServerProcess) -> AsyncIterator[KubeClient]:
    """An admin client of ``module_server``."""
    async with module_server.client() as client:
        yield client


_namespaces = itertools.count(1)


@pytest_asyncio.fixture
async def ns(mkube: KubeClient) -> str:
    """A namespace of this test's own on ``module_server``."""
    name = f"t{next(_namespaces)}"
    await mkube.create(NAMESPACES, {"metadata": {"name": name}})
    return name
