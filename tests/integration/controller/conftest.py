"""Fixtures for the controller's integration tests: the API test server and the controller as real
processes, plus helpers to read what the controller wrote."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from fabric_dra_testbed.stack import Role, Stack
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.controller import InventoryServer

T = TypeVar("T")


class ApiServer:
    """The API test server process (tests/support/apiserver.py), with an admin HTTP client to read
    what the controller wrote and to drive the server's test hooks."""

    def __init__(self, server: ApiServerProcess) -> None:
        self.server = server
        self.url = server.url
        self.kubeconfig = server.kubeconfig
        self.hooks = server.hooks
        self.http = httpx.Client(
            base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {server.admin_token}"}
        )

    def writes(self, key: str = "resource.k8s.io/resourceslices") -> int:
        return self.hooks.writes(key)

    def requests(self, key: str, verb: str) -> int:
        return int(self.hooks.requests()["requests"].get(key, {}).get(verb, 0))

    def reset_counts(self) -> None:
        self.hooks.reset_counts()

    def fault(self, resource: str, **rule: Any) -> None:
        self.hooks.fail(resource, **rule)

    def faults_left(self) -> int:
        return len(self.hooks.faults())

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=obj)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return self.create(
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}},
        )

    def node_labels(self, name: str) -> dict[str, str]:
        return dict(self.http.get(f"/api/v1/nodes/{name}").json()["metadata"].get("labels") or {})

    def slices(self, driver: str) -> list[dict[str, Any]]:
        response = self.http.get(
            "/apis/resource.k8s.io/v1/resourceslices", params={"fieldSelector": f"spec.driver={driver}"}
        )
        response.raise_for_status()
        return list(response.json()["items"])

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """One API test server per test module; tests keep apart through their own driver names."""
    with start_apiserver(tmp_path_factory.mktemp("apiserver")) as process:
        server = ApiServer(process)
        try:
            yield server
        finally:
            server.close()


_drivers = itertools.count(1)


@pytest.fixture
def driver() -> str:
    """A driver name of its own per test, so tests sharing one API server never see each other."""
    return f"t{next(_drivers)}.fabric-dra.io"


ControllerFactory = Callable[..., Role]


@pytest.fixture
def start_controller(tmp_path: Path, apiserver: ApiServer) -> Iterator[ControllerFactory]:
    counter = itertools.count()
    with Stack(tmp_path, logs_dir=tmp_path) as stack:

        def start(
            manager: InventoryServer | str, driver: str, *extra: str, kubeconfig: Path | None = None
        ) -> Role:
            """``fabric-dra controller`` for ``driver`` against ``manager`` (the stand-in or a URL)."""
            url = manager if isinstance(manager, str) else manager.url
            return stack.controller(
                None,
                kubeconfig or apiserver.kubeconfig,
                name=f"controller-{next(counter)}",
                args=["--manager-url", url, "--driver-name", driver, *extra],
                log_level="debug",
            ).role

        yield start
