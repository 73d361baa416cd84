"""What one client may take of fabric-dra's HTTP servers, and how long clients keep idle
connections to them: apart from :mod:`plumbing.httpserve` so that a role that is only a client
(the plugin, the controller, the stand-in cluster) does not import uvicorn to read two numbers."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLIENT_KEEPALIVE_EXPIRY", "ConnectionLimits"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one client may take of a server: time to send a request, header bytes, connections."""

    #: from a request's first byte (or the connection's start) to the end of its head
    header_timeout: float = 10.0
    #: from the end of the head to the end of the body
    body_timeout: float = 10.0
    #: an idle connection between requests
    keep_alive_timeout: int = 5
    #: request line and header fields together (nginx allows 4 buffers of 8 KiB by default)
    max_header_bytes: int = 32 * 1024
    #: open connections; each one beyond is answered 503 (one long poll per node counts here)
    max_connections: int = 1024
    #: seconds a refused client is told to wait (``Retry-After``)
    retry_after: float = 1.0


#: Seconds a client keeps an idle connection to one of these servers for reuse: half their keep-alive
#: timeout. httpx's default (5 s) equals it, so a request sent just as the server closes the idle
#: connection meets a closed socket ("Server disconnected", a ReadError), and a write (an attach, a
#: ledger ConfigMap PUT) cannot be resent blindly. The manager's client and the Kubernetes client
#: (whose API test server is one of these servers) use it.
CLIENT_KEEPALIVE_EXPIRY = ConnectionLimits().keep_alive_timeout / 2
