"""What each node's plugin says it has prepared: ``PUT /api/v1/nodes/{node}/claims`` (the route is
in :mod:`fabric.api.app`).

A plugin sends the claims its checkpoint records as *PrepareCompleted* (every 30 s, see
:mod:`dra_driver.plugin.report`); only that node's plugin (or a controller) may report for a node.
The orphan reconciler (:mod:`fabric.bindings.orphans`) never detaches a device a fresh report lists: a
container may be using it, whatever the API server says. Reports live in the leader's memory; a new
leader waits one report period before it judges a node's plugin silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

__all__ = ["PluginReports"]


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
