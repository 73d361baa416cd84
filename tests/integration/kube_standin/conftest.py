"""Fixtures of the API test server for this package's tests.

``apiserver``/``kube`` give a fresh server per test (from tests.support.apiserver);
``shared_apiserver`` (with ``mkube``, its client, and ``ns``, a namespace per test) one for
the session, for tests that keep to their own names and namespaces: process starts are most
of this package's run time.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import AsyncIterator

import pytest_asyncio

from plumbing.kube import KubeClient
from plumbing.kube.resources import NAMESPACES
from tests.support.apiserver import ApiServerProcess, apiserver, kube, shared_apiserver

__all__ = ["apiserver", "kube", "mkube", "ns", "shared_apiserver"]


@pytest_asyncio.fixture
async def mkube(shared_apiserver: ApiServerProcess) -> AsyncIterator[KubeClient]:
    """An admin client of ``shared_apiserver``."""
    async with shared_apiserver.client() as client:
        yield client


_namespaces = itertools.count(1)


@pytest_asyncio.fixture
async def ns(mkube: KubeClient) -> str:
    """A namespace of this test's own on ``shared_apiserver``."""
    name = f"ks{next(_namespaces)}-{secrets.token_hex(3)}"  # other packages may share the server
    await mkube.create(NAMESPACES, {"metadata": {"name": name}})
    return name
