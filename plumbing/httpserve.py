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
* No client holds a connection or memory for free (:class:`ConnectionLimits`): the request head
  must arrive within ``header_timeout`` and be at most ``max_header_bytes`` (else 408 / 431), the
  body within ``body_timeout`` of the head (else the connection is closed: the application sees a
  disconnect), an idle keep-alive connection is closed after ``keep_alive_timeout``, and beyond
  ``max_connections`` open connections a request is answered 503 with ``Retry-After``. uvicorn
  has none of the first two (a connection trickling a byte every few seconds, or a silent one,
  stayed open for good) and its own concurrency limit answers a bare 503.
* An answer goes out in one write (:class:`_HeadWithBody`): uvicorn writes a response's head
  when the application starts it and its body after, two sends and two TCP segments; the send
  was half the CPU of a small answer. The deadlines cost a timer only when a request's head or
  body does not arrive in the read that began it (most requests arrive whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
from collections.abc import Callable, Generator
from http import HTTPStatus
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from plumbing.fsutil import atomic_write
from plumbing.httplimits import CLIENT_KEEPALIVE_EXPIRY, ConnectionLimits
from plumbing.logs import get_logger
from plumbing.netutil import listen_tcp

__all__ = ["CLIENT_KEEPALIVE_EXPIRY", "ConnectionLimits", "ErrorBody", "HttpServer", "base_url"]

log = get_logger(__name__)

#: ``(status, message, retry_after)`` → the JSON body of a refusal the server itself answers
ErrorBody = Callable[[int, str, float | None], dict[str, Any]]


def _plain_error(status: int, message: str, retry_after: float | None) -> dict[str, Any]:
    return {"code": HTTPStatus(status).phrase.replace(" ", ""), "message": message}


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


class _HeadWithBody:
    """What one request's response cycle writes through: the connection's transport, except that
    the cycle's first write (the response head: uvicorn writes it on ``http.response.start``)
    is held and goes out with the next one (the body), so that an answer is one send.

    The held head is never late by more than a turn of the event loop: it goes out with the next
    write, before a close, when the response completes without a body write (a HEAD request's
    answer), or at the latest on the loop's next turn — a stream (Server-Sent Events) that starts
    its response and then waits for its first event sends its head at once, as before.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = b""  # b"": the head is still to come

    def write(self, data: bytes) -> None:
        held = self._held
        if held:
            self._held = None
            self._transport.write(held + data)
        elif held is None:
            self._transport.write(data)
        else:
            self._held = data
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and bounds of :class:`ConnectionLimits`,
    each answer written in one send (:class:`_HeadWithBody`)."""

    limits: ClassVar[ConnectionLimits]
    error_body: ClassVar[ErrorBody]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        #: the current phase's deadline (loop time) and what its expiry does; a timer is armed
        #: for it only once a read ends with the phase unfinished
        self._due: tuple[float, Callable[[], None]] | None = None
        self._in_head = True
        self._head_bytes = 0
        self._refused = False

    # -- deadlines --------------------------------------------------------------------------------

    def _arm(self, seconds: float, expired: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, expired)

    def _disarm(self) -> None:
        self._due = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _due_in(self, seconds: float, expired: Callable[[], None]) -> None:
        """The phase that starts now ends within ``seconds`` (armed after the read, if it has to)."""
        self._disarm()
        self._due = (self.loop.time() + seconds, expired)

    def _head_expired(self) -> None:
        self._deadline = self._due = None
        idle = self.cycle is None or self.cycle.response_complete
        self._refuse(408, f"the request head did not arrive within {self.limits.header_timeout:g}s", idle)

    def _body_expired(self) -> None:
        self._deadline = self._due = None
        log.warning(
            "request body too slow; connection closed",
            client=self._peer(),
            timeout_seconds=self.limits.body_timeout,
        )
        # The application is waiting for the body: closing makes it read a disconnect.
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "unknown"

    def _refuse(self, status: int, message: str, answer: bool = True) -> None:
        """Answer ``status`` (unless a response is under way on this connection) and close."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        log.warning("request refused", status=status, client=self._peer(), reason=message)
        if answer:
            retry = self.limits.retry_after if status == 503 else None
            body = json.dumps(type(self).error_body(status, message, retry)).encode()
            head = [
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
                "content-type: application/json",
                f"content-length: {len(body)}",
                "connection: close",
            ]
            if retry is not None:
                head.append(f"retry-after: {max(1, round(retry))}")
            self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and closing: whatever else arrives is not read
        super().data_received(data)
        if self._in_head and not self._refused:
            # Bytes of a head still incomplete (httptools buffers a partial field without bound).
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(431, f"request head larger than {self.limits.max_header_bytes} bytes")
        due = self._due
        if due is not None and self._deadline is None and not self._refused:
            # A head or body this read left unfinished: its deadline needs a timer now.
            self._deadline = self.loop.call_at(*due)

    # -- httptools callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        if self._deadline is None:  # else the connection's first head, timed from its start
            self._due_in(self.limits.header_timeout, self._head_expired)

    def on_url(self, url: bytes) -> None:
        if not self._refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        self._disarm()
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        if size > self.limits.max_header_bytes:
            self._refuse(431, f"request head larger than {self.limits.max_header_bytes} bytes")
            return
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                f"the server has {len(self.connections)} connections open, its limit is "
                f"{self.limits.max_connections}; retry shortly",
            )
            return
        started = self.cycle
        super().on_headers_complete()
        if self.cycle is not started:  # a request the application will answer
            self.cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        self._due_in(self.limits.body_timeout, self._body_expired)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # A head held for its body goes out before anything else of the connection happens
        # (a HEAD request's answer has no body write).
        transport = self.cycle.transport
        if isinstance(transport, _HeadWithBody):
            transport.flush()
        super().on_response_complete()


def _protocol(
    limits: ConnectionLimits, error_body: ErrorBody, base: type[HttpToolsProtocol]
) -> type[_GuardedProtocol]:
    """A protocol class bound to one server's limits (uvicorn constructs it with its own arguments),
    over ``base``: uvicorn's protocol or a role's subclass of it."""
    if not issubclass(base, HttpToolsProtocol):
        raise TypeError(f"the HTTP protocol must be uvicorn's HttpToolsProtocol or a subclass, not {base}")
    return type(
        "GuardedHttpProtocol",
        (_GuardedProtocol, base),
        {"limits": limits, "error_body": staticmethod(error_body)},
    )


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
    :class:`uvicorn.Config` (``lifespan``, ``timeout_graceful_shutdown``, …; ``http`` may name a
    subclass of uvicorn's ``HttpToolsProtocol``, which the limits wrap). ``limits`` bound
    what a client may take (:class:`ConnectionLimits`); ``error_body`` shapes the JSON of the
    refusals the server answers itself (408, 431, 503), so they read like the application's own.
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
        limits: ConnectionLimits | None = None,
        error_body: ErrorBody = _plain_error,
        **options: Any,
    ) -> None:
        self.limits = limits or ConnectionLimits()
        protocol = _protocol(self.limits, error_body, options.pop("http", HttpToolsProtocol))
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
            http=protocol,
            timeout_keep_alive=self.limits.keep_alive_timeout,
            # No role sits behind a proxy: the peer is the client. uvicorn's default trusts
            # X-Forwarded-For from loopback, so a local client could pick the address that the
            # per-client limits (login, token reviews) count against.
            proxy_headers=False,
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
