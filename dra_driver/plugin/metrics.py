"""Per-phase latency of prepare and unprepare, as Prometheus histograms.

Phases: ``claim_read``, ``attach`` (fabric bind), ``visible`` (host sees it), ``cdi_write``,
``checkpoint``, ``host_removal``, ``detach``, ``cdi_remove``, and the whole ``prepare`` /
``unprepare`` of one claim. Benchmarks subtract ``attach`` + ``visible`` from ``prepare`` to get the
plugin's own overhead. ``--metrics-port`` serves them, and the kubelet's probes ``/healthz`` and
``/readyz`` (:mod:`.probes`) beside them; :func:`phase_totals` reads them in-process.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app

from dra_driver.plugin.probes import PluginProbes
from plumbing.netutil import listen_tcp
from plumbing.promstats import register_process_metrics

__all__ = [
    "CLAIM_RESULTS",
    "PHASE_SECONDS",
    "REGISTRY",
    "MetricsServer",
    "observe_phase",
    "phase_totals",
    "serve_metrics",
]

REGISTRY = CollectorRegistry(auto_describe=True)
register_process_metrics(REGISTRY, "plugin")

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


class _QuietHandler(WSGIRequestHandler):
    #: a client that stops sending or reading is cut off after this long (socket timeout)
    timeout = 5.0

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not events worth a log line."""


class _MetricsServer(WSGIServer):
    """A WSGI server on a socket from :func:`listen_tcp`, answering one scrape at a time on its
    own thread.

    Not a thread per request: starting a thread costs more than rendering the plugin's metrics,
    and its teardown would run into the next kubelet call. A scrape is a few hundred
    microseconds; a client that stalls is cut off by the handler's socket timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self._listener = sock
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], _QuietHandler)

    def server_bind(self) -> None:
        self.socket.close()
        self.socket = self._listener
        self.server_address = self.socket.getsockname()[:2]
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])
        self.setup_environ()

    def server_activate(self) -> None:
        """Already listening."""


class MetricsServer:
    """A running ``/metrics`` server: its port, and :meth:`close` to stop it."""

    def __init__(self, server: _MetricsServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port = server.server_port

    def close(self) -> None:
        """Stop answering, wait for the server thread, close the listening socket."""
        self._server.shutdown()
        self._thread.join(timeout=10)
        self._server.server_close()


_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _with_probes(metrics_app: _WsgiApp, probes: PluginProbes) -> _WsgiApp:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        answer = probes.answer(str(environ.get("PATH_INFO", "")))
        if answer is None:
            return metrics_app(environ, start_response)
        body = f"{answer.reason}\n".encode()
        reason = "OK" if answer.ok else "Service Unavailable"
        start_response(
            f"{answer.status} {reason}",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


def serve_metrics(host: str, port: int, *, probes: PluginProbes | None = None) -> MetricsServer:
    """Serve ``/metrics`` (and, given ``probes``, ``/healthz`` and ``/readyz``) from a background
    thread (port 0: any free port)."""
    server = _MetricsServer(listen_tcp(host, port, backlog=64, hint="pick another --metrics-port"))
    app: _WsgiApp = make_wsgi_app(REGISTRY)
    server.set_app(app if probes is None else _with_probes(app, probes))
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
