"""Run the API test server under uvicorn: bind (port 0 picks a free port), write the ready
file once connections are accepted, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from kube_standin.apiserver.app import ApiServer, ApiServerConfig
from plumbing.fsutil import atomic_write
from plumbing.logs import get_logger
from plumbing.netutil import listen_tcp

__all__ = ["serve_apiserver"]

log = get_logger(__name__)


class _Server(uvicorn.Server):
    """Ends open watch streams as soon as shutdown begins: a watch would otherwise hold the
    graceful shutdown until its timeout, and a real API server closes them too."""

    def __init__(self, config: uvicorn.Config, api: ApiServer) -> None:
        super().__init__(config)
        self.api = api

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after a graceful shutdown; a clean stop exits 0 instead.
        self._captured_signals.clear()
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self.api.store.close_watchers)


async def serve_apiserver(
    config: ApiServerConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ready_file: Path | None = None,
    tls_cert_file: Path | None = None,
    tls_key_file: Path | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Once connections are accepted, ``on_ready(url)`` runs and
    then the base URL is written to ``ready_file``."""
    api = ApiServer(config)
    api.warm()
    sock = listen_tcp(host, port)
    sock.setblocking(False)
    bound_port = sock.getsockname()[1]
    scheme = "https" if tls_cert_file else "http"
    shown_host = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown_host}:{bound_port}"
    uv_config = uvicorn.Config(
        api.app,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ssl_certfile=str(tls_cert_file) if tls_cert_file else None,
        ssl_keyfile=str(tls_key_file) if tls_key_file else None,
        ssl_cert_reqs=ssl.CERT_NONE,
    )
    server = _Server(uv_config, api)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(url)
        if ready_file is not None:
            atomic_write(ready_file, url + "\n", durable=False)
        log.info(
            "API test server ready",
            url=url,
            kubernetes=api.server_version,
            validate=",".join(config.validate_versions) or "none",
            auth="tokens" if config.tokens_file else "none",
        )

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
        sock.close()
    log.info("API test server stopped", url=url)
