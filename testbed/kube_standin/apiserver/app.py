"""The Kubernetes API test server as one ASGI application: the REST paths, verbs and semantics
of a real API server for the resources fabric-dra uses, over real HTTP.

This module wires the parts together; each has its own module:

* :mod:`.pipeline` — what every request goes through (errors as Status, authentication,
  request info, test hooks) before its verb handler;
* :mod:`.handlers` — one module per verb family (get/list, create, update, patch, delete, watch);
* :mod:`.store` (objects, resourceVersions, history, watchers), :mod:`.schemas` and
  :mod:`.rules` (validation), :mod:`.convert` (versions), :mod:`.registry` (the resources);
* :mod:`.statefile` — ``--state-file`` persistence; :mod:`.testhooks` — ``/testing/v1``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Route

from kube_standin.apiserver.auth import TokenAuthenticator
from kube_standin.apiserver.customresources.served import CustomResources
from kube_standin.apiserver.features import FeatureGates, ServedVersions
from kube_standin.apiserver.handlers.scope import RequestScope
from kube_standin.apiserver.pipeline import RequestPipeline
from kube_standin.apiserver.registry import RESOURCES
from kube_standin.apiserver.schemas import DEFAULT_VERSIONS, shared_catalog
from kube_standin.apiserver.statefile import StateFile
from kube_standin.apiserver.storage import Change
from kube_standin.apiserver.store import Store
from kube_standin.apiserver.testhooks import FaultInjector, RequestCounter, TestHookEndpoints

__all__ = ["ApiServer", "ApiServerConfig"]

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]


def _served_kinds() -> list[tuple[str, str]]:
    return [(res.api_version(version), res.kind) for res in RESOURCES for version in res.versions]


def preload() -> None:
    """Compile the validators of the default versions' served kinds into this process's shared
    catalog: a fork server runs this once (``fabric_dra_testbed.stack.ROLE_MODULES``), and the API servers
    forked from it start with them compiled."""
    shared_catalog(ApiServerConfig().validate_versions).warm(_served_kinds())


@dataclass
class ApiServerConfig:
    validate_versions: tuple[str, ...] = DEFAULT_VERSIONS
    #: reported by /version; defaults to the newest validated version.
    server_version: str | None = None
    tokens_file: Path | None = None
    allow_anonymous: bool = False
    state_file: Path | None = None
    history: int = 20_000
    #: how often an idle watch with allowWatchBookmarks gets a BOOKMARK (the real server: ~1 min).
    bookmark_interval: float = 60.0
    #: a watch without timeoutSeconds ends after a random time in [min, 2*min], as the real server.
    min_request_timeout: float = 1800.0
    #: ``--feature-gates``: changes to the defaults of the release ``server_version`` names.
    feature_gates: dict[str, bool] = field(default_factory=dict)
    #: ``--runtime-config``: group/versions turned on (beta APIs are off by default) or off.
    runtime_config: dict[str, bool] = field(default_factory=dict)


class ApiServer:
    """An ASGI application (``.app``) serving the Kubernetes REST API from an in-memory store.

    Raises :class:`~kube_standin.apiserver.statefile.StateFileError` when the state file
    exists but cannot be loaded."""

    def __init__(self, config: ApiServerConfig | None = None) -> None:
        self.config = config or ApiServerConfig()
        self.store = Store(history=self.config.history)
        self.catalog = shared_catalog(tuple(self.config.validate_versions))
        self.auth = TokenAuthenticator(self.config.tokens_file)
        self.faults = FaultInjector()
        self.counter = RequestCounter()
        self.hooks = TestHookEndpoints(self.faults, self.counter, self.store)
        newest = max(self.config.validate_versions or ("1.34",), key=lambda v: tuple(map(int, v.split("."))))
        self.server_version = self.config.server_version or f"{newest}.0"
        self.state = StateFile(self.config.state_file, self.store) if self.config.state_file else None
        self.store.on_commit = self._on_commit
        if self.state is not None:
            self.state.load()
        self.gates = FeatureGates.of(self.server_version, self.config.feature_gates)
        self.custom = CustomResources(self.store)
        self.store.custom_resources = self.custom.resources
        scope = RequestScope(
            store=self.store,
            custom=self.custom,
            catalog=self.catalog,
            auth=self.auth,
            bookmark_interval=self.config.bookmark_interval,
            min_request_timeout=self.config.min_request_timeout,
            gates=self.gates,
            served=ServedVersions(dict(self.config.runtime_config)),
        )
        self.pipeline = RequestPipeline(
            scope, self.hooks, allow_anonymous=self.config.allow_anonymous, server_version=self.server_version
        )
        self.app = Starlette(
            routes=[Route("/{path:path}", self.pipeline.handle, methods=_METHODS)], lifespan=self._lifespan
        )

    def warm(self) -> None:
        """Compile every served kind's validators now, so the first write is as fast as the rest."""
        self.catalog.warm(_served_kinds())

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        flusher = asyncio.create_task(self.state.run()) if self.state is not None else None
        try:
            yield
        finally:
            self.store.close_watchers()
            if flusher is not None:
                flusher.cancel()
            self.flush_state()

    def _on_commit(self, change: Change) -> None:
        self.counter.changes[change.storage_key] += 1
        if self.state is not None:
            self.state.changed()

    def flush_state(self) -> None:
        if self.state is not None:
            self.state.flush()
