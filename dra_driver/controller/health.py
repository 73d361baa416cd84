"""A small HTTP endpoint for probes and metrics: ``/healthz``, ``/readyz``, ``/metrics``, ``/status``.

Plain asyncio streams (HTTP/1.1, one request per connection): the controller serves no API,
only what kubelet probes and Prometheus scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dra_driver.controller.metrics import REGISTRY
from plumbing.logs import get_logger
from plumbing.netutil import listen_tcp

__all__ = ["HealthServer"]

log = get_logger(__name__)

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    def __init__(self, *, ready: Callable[[], bool], status: Callable[[], dict[str, Any]]) -> None:
        self._ready = ready
        self._status = status
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> str:
        """Listen; returns the base URL (with the real port when ``port`` is 0)."""
        self._server = await asyncio.start_server(self._handle, sock=listen_tcp(host, port))
        sock = self._server.sockets[0].getsockname()
        shown = f"[{sock[0]}]" if ":" in sock[0] else sock[0]
        return f"http://{shown}:{sock[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            ok = self._ready()
            return (200, "text/plain", b"ok\n") if ok else (503, "text/plain", b"not ready\n")
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
        if path == "/status":
            return 200, "application/json", (json.dumps(self._status(), indent=2) + "\n").encode()
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2:
                return
            code, content_type, body = self._route(parts[0], parts[1])
            head = (
                f"HTTP/1.1 {code} {_REASONS.get(code, '')}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if parts[0] == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError) as err:
            log.debug("health request failed", error=str(err))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
