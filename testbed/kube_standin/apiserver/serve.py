"""Run the API test server under uvicorn (:class:`plumbing.httpserve.HttpServer`): bind (port 0
picks a free port), write the ready file once connections are accepted, stop cleanly on
SIGTERM/SIGINT."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from kube_standin.apiserver.app import ApiServer, ApiServerConfig
from plumbing.httpserve import HttpServer
from plumbing.logs import get_logger

__all__ = ["serve_apiserver"]

log = get_logger(__name__)


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
    server = HttpServer(
        api.app,
        host=host,
        port=port,
        tls_cert=tls_cert_file,
        tls_key=tls_key_file,
        # Open watch streams end as soon as shutdown begins, and so do the ones clients open
        # again: a watch would otherwise hold the graceful shutdown until its timeout, and a real
        # API server closes them too (k8s.io/apiserver pkg/server/genericapiserver.go: the watches
        # are drained within ShutdownWatchTerminationGracePeriod, zero by default, as the HTTP
        # server stops). Ending them sooner than upstream is the stricter side for a client.
        on_exit=api.store.shut_down_watches,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ssl_cert_reqs=ssl.CERT_NONE,
    )

    def announce(url: str) -> None:
        if on_ready is not None:
            on_ready(url)
        log.info(
            "API test server ready",
            url=url,
            kubernetes=api.server_version,
            validate=",".join(config.validate_versions) or "none",
            auth="tokens" if config.tokens_file else "none",
        )

    await server.serve(ready_file, on_ready=announce)
    log.info("API test server stopped", url=server.url)
