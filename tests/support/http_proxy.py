"""A small real HTTP proxy for the Redfish client's tests: ``CONNECT`` tunnels and absolute-form
requests, as squid or tinyproxy serve them (RFC 9110 §9.3.6, RFC 9112 §3.2.2), on 127.0.0.1 with a
free port, in a background thread. It records what it was asked (method, target, whether a
``Proxy-Authorization`` came along) and can refuse every tunnel with a status of the test's choice.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import socketserver
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

__all__ = ["HttpProxy", "ProxyRequest"]


@dataclass(frozen=True)
class ProxyRequest:
    method: str
    target: str
    #: the ``Proxy-Authorization`` value, or None
    authorization: str | None


def _read_head(sock: socket.socket, buffered: bytes) -> tuple[bytes, bytes]:
    """The head of the next request (without its blank line) and what came after it."""
    while b"\r\n\r\n" not in buffered:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before the end of the head")
        buffered += data
    head, _, rest = buffered.partition(b"\r\n\r\n")
    return head, rest


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    sockets = [a, b]
    while True:
        readable, _, _ = select.select(sockets, [], [], 30)
        if not readable:
            return
        for source in readable:
            data = source.recv(65536)
            if not data:
                return
            (b if source is a else a).sendall(data)


class HttpProxy:
    def __init__(self, *, refuse: int | None = None) -> None:
        self.requests: list[ProxyRequest] = []
        self.refuse = refuse
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                client: socket.socket = self.request
                with contextlib.suppress(OSError, ValueError):
                    buffered = b""
                    while True:  # one request after another on a kept-alive connection
                        head, buffered = _read_head(client, buffered)
                        lines = head.decode("latin-1").split("\r\n")
                        method, target, _version = lines[0].split(" ", 2)
                        fields = {
                            name.strip().lower(): value.strip()
                            for name, _, value in (line.partition(":") for line in lines[1:])
                        }
                        outer.requests.append(ProxyRequest(method, target, fields.get("proxy-authorization")))
                        if method == "CONNECT":
                            self._tunnel(client, target)
                            return
                        length = int(fields.get("content-length") or 0)
                        while len(buffered) < length:
                            buffered += client.recv(65536)
                        body, buffered = buffered[:length], buffered[length:]
                        self._forward(client, method, target, lines[1:], body)

            def _tunnel(self, client: socket.socket, target: str) -> None:
                if outer.refuse is not None:
                    client.sendall(f"HTTP/1.1 {outer.refuse} Refused\r\nContent-Length: 0\r\n\r\n".encode())
                    return
                host, port = target.rsplit(":", 1)
                with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as upstream:
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    _pipe(client, upstream)

            def _forward(
                self, client: socket.socket, method: str, target: str, lines: list[str], body: bytes
            ) -> None:
                """An absolute-form request: sent on to the origin in the origin form."""
                url = urlsplit(target)
                upstream = http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=10)
                try:
                    upstream.putrequest(method, url.path + (f"?{url.query}" if url.query else ""), True, True)
                    for name, _, value in (line.partition(":") for line in lines):
                        if not name.lower().startswith("proxy-"):
                            upstream.putheader(name.strip(), value.strip())
                    upstream.endheaders(body or None)
                    answer = upstream.getresponse()
                    content = answer.read()
                    head = [f"HTTP/1.1 {answer.status} {answer.reason}"]
                    head += [f"{k}: {v}" for k, v in answer.getheaders() if k.lower() != "content-length"]
                    head.append(f"Content-Length: {len(content)}")
                    client.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + content)
                finally:
                    upstream.close()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
