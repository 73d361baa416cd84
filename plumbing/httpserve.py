"""One way to run an ASGI app on uvicorn, for every server role (fabric manager, Redfish emulator,
API test server).

* The socket is bound by :func:`plumbing.netutil.listen_tcp` (``TCP_NODELAY`` on the listener,
  so on every accepted connection; port 0 picks a free port) before uvicorn starts, so the URL
  is known at once.
* The ready file gets the URL only once uvicorn accepts connections — whoever waits on the file
  may connect straight away.
* SIGTERM and SIGINT end the server gracefully and the process exits 0: uvicorn would re-raise
  the signal after its shutdown, killing the process before its own cleanup ran. A role that
  handles the signals itself (the manager must release its Lease first) passes
  ``handle_signals=False`` and calls :meth:`HttpServer.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Callable, Generator
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from plumbing.fsutil import atomic_write
from plumbing.netutil import listen_tcp

__all__ = ["HttpServer", "base_url"]


def base_url(host: str, port: int, *, tls: bool = False) -> str:
    """The URL a local client uses to reach a server listening on ``host:port``: a wildcard
    address (``0.0.0.0``, ``::``) becomes the loopback address of its family."""
    scheme = "https" if tls else "http"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"{scheme}://{host}:{port}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"{scheme}://{shown}:{port}"


class _Server(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, *, handle_signals: bool, on_exit: Callable[[], object] | None
    ) -> None:
        super().__init__(config)
        self._handle_signals = handle_signals
        self._on_exit = on_exit

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if not self._handle_signals:
            yield
            return
        with super().capture_signals():
            yield

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A clean stop exits 0: nothing re-raises the signal after the graceful shutdown.
        self._captured_signals.clear()
        if self._on_exit is not None:
            # A signal handler runs between any two bytecodes: the hook runs on the loop instead.
            asyncio.get_event_loop().call_soon_threadsafe(self._on_exit)


class HttpServer:
    """``app`` on uvicorn, listening on ``host:port`` from construction on.

    ``on_exit`` runs as soon as a signal starts the shutdown — for streams (watches, Server-Sent
    Events) that would otherwise hold the graceful shutdown until its timeout. ``options`` go to
    :class:`uvicorn.Config` (``lifespan``, ``http``, ``timeout_graceful_shutdown``, …).
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str,
        port: int,
        backlog: int = 1024,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        handle_signals: bool = True,
        on_exit: Callable[[], object] | None = None,
        **options: Any,
    ) -> None:
        self.listener: socket.socket = listen_tcp(host, port, backlog=backlog)
        self.port: int = self.listener.getsockname()[1]
        self.url = base_url(host, self.port, tls=tls_cert is not None)
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            backlog=backlog,
            ssl_certfile=str(tls_cert) if tls_cert else None,
            ssl_keyfile=str(tls_key) if tls_key else None,
            **options,
        )
        self._server = _Server(config, handle_signals=handle_signals, on_exit=on_exit)
        self._serving: asyncio.Task[None] | None = None

    async def start(
        self, ready_file: Path | None = None, *, on_ready: Callable[[str], None] | None = None
    ) -> None:
        """Serve in the background; return once connections are accepted, ``on_ready(url)`` ran
        and then ``ready_file`` holds the URL. Raises what stopped the server if it stopped during
        start-up."""
        self._serving = asyncio.create_task(self._server.serve(sockets=[self.listener]), name="http")
        while not self._server.started:
            if self._serving.done():
                await self._serving
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(self.url)
        if ready_file is not None:
            atomic_write(ready_file, self.url + "\n", durable=False)

    @property
    def serving(self) -> asyncio.Task[None]:
        """The running server; done once it stopped (after :meth:`start`)."""
        if self._serving is None:
            raise RuntimeError("the HTTP server was not started")
        return self._serving

    def stop(self) -> None:
        """Begin the graceful shutdown (what SIGTERM does when the server handles signals)."""
        self._server.should_exit = True

    async def close(self) -> None:
        """Stop, wait until the server ended, close the socket. Idempotent."""
        self.stop()
        if self._serving is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving
        self.listener.close()

    async def serve(
        self, ready_file: Path | None = None, *, on_ready: Callable[[str], None] | None = None
    ) -> None:
        """:meth:`start`, then serve until a signal or :meth:`stop`; the socket is closed after."""
        try:
            await self.start(ready_file, on_ready=on_ready)
            await self.serving
        finally:
            if self._serving is not None and not self._serving.done():
                self._serving.cancel()  # cancelled from outside: take the server down with us
                with contextlib.suppress(asyncio.CancelledError):
                    await self._serving
            self.listener.close()
