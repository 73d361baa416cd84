"""The plugin's /metrics server: one long-lived thread answering scrapes on a real socket, a
client that stalls cut off by the socket timeout instead of holding the server."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest

from dra_driver.plugin import metrics
from dra_driver.plugin.metrics import PHASE_SECONDS, serve_metrics


def _scrape(port: int, query: str = "") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}", timeout=15) as response:
        return str(response.read().decode())


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 0.5)
    server = serve_metrics("127.0.0.1", 0)
    try:
        yield server.port
    finally:
        server.close()


def test_scrapes_are_answered_and_the_phase_filter_works(port: int) -> None:
    PHASE_SECONDS.labels("claim_read").observe(0.001)
    full = _scrape(port)
    assert "fabric_dra_plugin_phase_seconds_bucket" in full
    only = _scrape(port, "?name[]=fabric_dra_plugin_phase_seconds_sum")
    assert 'fabric_dra_plugin_phase_seconds_sum{phase="claim_read"}' in only
    assert "_bucket" not in only
    for _ in range(20):  # one server thread answers one scrape after another
        assert "fabric_dra_plugin_phase_seconds" in _scrape(port)


def test_a_client_that_sends_nothing_is_cut_off(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        # Without the handler's timeout the server would wait for the stalled client for ever
        # and this scrape would fail with urlopen's own timeout.
        assert "fabric_dra_plugin_phase_seconds" in _scrape(port)
        stalled.settimeout(5)
        assert stalled.recv(1024) == b""  # the server gave up on it and closed the connection


def test_close_stops_the_server() -> None:
    server = serve_metrics("127.0.0.1", 0)
    assert "fabric_dra_plugin" in _scrape(server.port)
    server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
