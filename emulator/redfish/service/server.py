"""Assemble the emulator and run it on uvicorn: state, engine, tree, HTTP(S) server, ready file.

``serve(config)`` loads the topology and the durable state, rebuilds the host views, binds the
listening socket (port 0 picks a free one), writes the base URL to the ready file once it
accepts connections, and runs until SIGTERM/SIGINT. Running tasks are left as they are on
shutdown: the next start marks them Interrupted, exactly as after ``kill -9``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from emulator.errors import ConfigError
from emulator.qemu.host import QemuHosts, qemu_hosts
from emulator.redfish.engine.bindings import Revision
from emulator.redfish.engine.engine import Engine
from emulator.redfish.engine.events import EventBus
from emulator.redfish.model import uris
from emulator.redfish.model.errors import error_body
from emulator.redfish.model.latency import LatencyProfile
from emulator.redfish.model.state import StateStore
from emulator.redfish.service.app import COMMON_HEADERS, RedfishApp, method_not_implemented
from emulator.redfish.sysfs.hostview import HostView
from emulator.redfish.tree.auth import Account, Credentials, Sessions
from emulator.redfish.tree.nodes import Context
from emulator.redfish.tree.render import Renderer
from emulator.redfish.views import build_tree, render_uri
from emulator.topology import FabricIndex
from plumbing.httpserve import HttpServer
from plumbing.logs import get_logger

__all__ = ["EmulatorService", "ServeConfig", "build_service", "serve"]

log = get_logger(__name__)


@dataclass
class ServeConfig:
    index: FabricIndex
    state_dir: Path
    latency: LatencyProfile
    credentials: Credentials | None
    host: str = "127.0.0.1"
    port: int = 0
    ready_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None


@dataclass
class EmulatorService:
    ctx: Context
    app: RedfishApp
    engine: Engine
    store: StateStore


def build_service(config: ServeConfig) -> EmulatorService:
    """Everything but the socket; also used in-process by tests and benchmarks."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    store = StateStore(config.state_dir)
    try:
        store.load()
    except ValueError as err:
        raise ConfigError(
            f"the state file {store.path} or its journal {store.journal_path.name} is not valid "
            f"({str(err).splitlines()[0]}); move both away to start with an unbound fabric"
        ) from None
    revision = Revision()
    events = EventBus(store.state.event_seq)
    guests = frozenset(qemu_hosts(config.index))
    hostview = HostView(config.state_dir / "hosts", guests)
    qemu = QemuHosts(config.index, config.state_dir) if guests else None
    engine = Engine(config.index, store, hostview, events, config.latency, revision, qemu=qemu)
    engine.recover()
    sessions = Sessions(on_change=revision.bump)
    service = config.index.topology.service
    account = (
        Account(config.credentials.username, config.credentials.password) if config.credentials else None
    )
    ctx = Context(
        index=config.index,
        engine=engine,
        sessions=sessions,
        account=account,
        events=events,
        revision=revision,
        renderer=Renderer(revision, etags=config.index.topology.behaviour.etags == "served"),
        service_uuid=str(service.uuid),
        service_name=service.name,
        vendor=service.vendor,
        product=service.product,
    )
    root = build_tree(ctx)
    engine.serve_with(render=lambda uri: render_uri(root, uri), expire_sessions=sessions.expire_all)
    return EmulatorService(ctx, RedfishApp(ctx, root, config.latency), engine, store)


def _unknown_method_response() -> bytes:
    """The whole answer to a request whose method the HTTP parser cannot read: the 501 the
    application gives any method outside DSP0266's table (emulator.redfish.service.app.REDFISH_METHODS),
    with the same headers and Redfish error body; the connection closes after it, since the
    parser cannot find where that request ends."""
    body = json.dumps(error_body(method_not_implemented(None)), separators=(",", ":")).encode()
    head = [f"HTTP/1.1 501 {HTTPStatus(501).phrase}".encode()]
    head += [name + b": " + value for name, value in COMMON_HEADERS]
    head += [
        b"content-type: application/json; charset=utf-8",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_UNKNOWN_METHOD = _unknown_method_response()


class _MethodAwareParser:
    """httptools' request parser, except that a method it does not know (llhttp knows a fixed
    list; ``FAKEMETHODFORTEST`` is not on it) is answered 501 instead of uvicorn's plain-text 400
    "Invalid HTTP request received." Everything else is the parser's own."""

    def __init__(self, parser: httptools.HttpRequestParser, transport: Any) -> None:
        self._parser = parser
        self._transport = transport

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserInvalidMethodError:
            log.info("unknown HTTP method answered 501")
            self._transport.write(_UNKNOWN_METHOD)
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # uvicorn asks the parser for the method, version and keep-alive of every request: each
        # is looked up here once, then found on the instance
        found = getattr(self._parser, name)
        setattr(self, name, found)
        return found


def _emulator_protocol(engine: Engine) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, able to drop a request's connection without any response, and
    answering an unknown method the Redfish way (:class:`_MethodAwareParser`).

    A DropConnections fault must look like a network failure to the client (reset, no HTTP
    status), which an ASGI application cannot produce; so the check sits where the request
    line has been parsed. The admin API is never dropped.
    """

    class EmulatorHttpProtocol(HttpToolsProtocol):
        _dropping = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.parser = _MethodAwareParser(self.parser, transport)  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            if not self._dropping:
                super().data_received(data)

        def on_headers_complete(self) -> None:
            if engine.conditions.faults and self._drops(self.url.split(b"?", 1)[0].decode("latin-1")):
                self._dropping = True
                self.transport.abort()
                return
            super().on_headers_complete()

        @staticmethod
        def _drops(path: str) -> bool:
            return not path.startswith(uris.OEM) and engine.conditions.take_drop()

        def on_body(self, body: bytes) -> None:
            if not self._dropping:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._dropping:
                super().on_message_complete()

    return EmulatorHttpProtocol


async def serve(config: ServeConfig) -> None:
    service = build_service(config)
    if service.engine.qemu is not None:
        # Boot (or attach to) the guests and make each hold exactly what the state binds to it.
        bound: dict[str, set[str]] = {}
        for binding in service.store.state.bindings.values():
            bound.setdefault(binding.host, set()).add(binding.target)
        await service.engine.qemu.start(bound)
    server = HttpServer(
        service.app,
        host=config.host,
        port=config.port,
        backlog=2048,
        tls_cert=config.tls_cert,
        tls_key=config.tls_key,
        # End Server-Sent Event streams first, or the graceful shutdown waits for them.
        on_exit=service.ctx.events.close,
        http=_emulator_protocol(service.engine),
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=3,
    )

    def announce(url: str) -> None:
        log.info(
            "emulator serving",
            url=url,
            topology_hosts=len(config.index.hosts),
            devices=len(config.index.devices),
            latency=config.latency.name,
            state_dir=str(config.state_dir),
            auth="required" if config.credentials else "disabled",
        )

    try:
        await server.serve(config.ready_file, on_ready=announce)
    finally:
        service.engine.close()
        await service.store.drain()
        service.store.close()
        if service.engine.qemu is not None:
            await service.engine.qemu.close()
        log.info("emulator stopped")
