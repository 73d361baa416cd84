"""What each node's plugin says it has prepared: ``PUT /api/v1/nodes/{node}/claims``.

A plugin sends the claims its checkpoint records as *PrepareCompleted* (every 30 s, see
:mod:`dra_driver.plugin.report`); only that node's plugin (or a controller) may report for a node.
The orphan reconciler (:mod:`fabric.orphans`) never detaches a device a fresh report lists: a
container may be using it, whatever the API server says. Reports live in the leader's memory; a new
leader waits one report period before it judges a node's plugin silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated

from fastapi import FastAPI, Path
from fastapi.responses import Response

from fabric.server import Caller
from manager_api import models as api
from plumbing.names import DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN_PATTERN

__all__ = ["PluginReports", "install_report_route"]


class PluginReports:
    """What each node's plugin last reported as prepared: node → claim UID → devices."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._reports: dict[str, tuple[float, dict[str, frozenset[str]]]] = {}

    def record(self, node: str, claims: Mapping[str, Iterable[str]]) -> None:
        self._reports[node] = (self._clock(), {uid: frozenset(devices) for uid, devices in claims.items()})

    def holds(self, node: str, claim_uid: str, device: str) -> bool:
        """The node's plugin reported ``claim_uid`` prepared with ``device``, recently enough."""
        report = self._reports.get(node)
        if report is None or self._clock() - report[0] > self.ttl:
            return False
        return device in report[1].get(claim_uid, frozenset())


NodeName = Annotated[
    str,
    Path(
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        max_length=DNS1123_SUBDOMAIN_MAX_LENGTH,
        description="Kubernetes node name",
    ),
]


def install_report_route(app: FastAPI, reports: PluginReports) -> None:
    """Add ``PUT /api/v1/nodes/{node}/claims`` to the manager's app."""

    @app.put(
        f"{api.API_PREFIX}/nodes/{{node}}/claims",
        status_code=204,
        responses={204: {"description": "recorded"}},
        summary="the claims a node's plugin has prepared",
    )
    async def node_claims(caller: Caller, node: NodeName, report: api.NodeClaims) -> Response:
        caller.check_bind(node)
        reports.record(node, {c.claim_uid: c.devices for c in report.claims})
        return Response(status_code=204)
