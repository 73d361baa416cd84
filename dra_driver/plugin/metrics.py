"""Per-phase latency of prepare and unprepare, as Prometheus histograms.

Phases: ``claim_read``, ``attach`` (fabric bind), ``visible`` (host sees it), ``cdi_write``,
``checkpoint``, ``host_removal``, ``detach``, ``cdi_remove``, and the whole ``prepare`` /
``unprepare`` of one claim. Benchmarks subtract ``attach`` + ``visible`` from ``prepare`` to get the
plugin's own overhead. ``--metrics-port`` serves them; :func:`phase_totals` reads them in-process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

__all__ = ["CLAIM_RESULTS", "PHASE_SECONDS", "REGISTRY", "observe_phase", "phase_totals", "serve_metrics"]

REGISTRY = CollectorRegistry(auto_describe=True)

PHASE_SECONDS = Histogram(
    "fabric_dra_plugin_phase_seconds",
    "Time spent in one phase of preparing or unpreparing a claim",
    ["phase"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
CLAIM_RESULTS = Counter(
    "fabric_dra_plugin_claims_total",
    "Claims handled, by operation and outcome",
    ["operation", "outcome"],
    registry=REGISTRY,
)


@contextlib.contextmanager
def observe_phase(phase: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        PHASE_SECONDS.labels(phase).observe(time.perf_counter() - started)


def phase_totals() -> dict[str, tuple[float, float]]:
    """``{phase: (count, sum_seconds)}`` of every phase observed so far in this process."""
    totals: dict[str, list[float]] = {}
    for metric in REGISTRY.collect():
        if metric.name != "fabric_dra_plugin_phase_seconds":
            continue
        for sample in metric.samples:
            phase = sample.labels.get("phase", "")
            entry = totals.setdefault(phase, [0.0, 0.0])
            if sample.name.endswith("_count"):
                entry[0] = sample.value
            elif sample.name.endswith("_sum"):
                entry[1] = sample.value
    return {k: (v[0], v[1]) for k, v in totals.items()}


def serve_metrics(host: str, port: int) -> int:
    """Serve ``/metrics`` from a background thread; returns the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_port)
