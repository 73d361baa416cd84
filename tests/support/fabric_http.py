"""Small real HTTP(S) servers for the fabric manager's tests.

* :class:`MockupServer` serves a DMTF Redfish mockup directory read-only, the way DMTF's own
  mockup server does: ``GET /redfish/v1/<path>`` answers ``<dir>/<path>/index.json``.
* :class:`ScriptedServer` answers each request with a function of the test, and records what
  it received — for client behaviour that a well-behaved service never shows (hangs, dropped
  connections, expired sessions at a chosen moment).

Both listen on 127.0.0.1 with a free port, optionally with TLS, in a background thread.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["MockupServer", "Reply", "Request", "ScriptedServer"]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: close the connection without answering (a crash between request and response)
    drop: bool = False
    #: send the body in pieces of ``chunk_size`` bytes, ``chunk_delay`` seconds apart (a slow service)
    chunk_delay: float = 0.0
    chunk_size: int = 1


Handler = Callable[[Request], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up (tests of huge or slow answers) resets the connection: expected.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _BaseServer:
    def __init__(self, handler: Handler, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        outer = self

        class _RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes: without this each answer on a
                # kept-alive connection waits for the client's delayed ACK (about 40 ms).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                request = Request(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with outer._lock:
                    outer.requests.append(request)
                reply = handler(request)
                if reply.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(reply.body, bytes):
                    payload = reply.body  # anything at all, e.g. truncated or invalid JSON
                elif isinstance(reply.body, str):
                    payload = reply.body.encode()  # raw text, e.g. an event stream
                else:
                    payload = b"" if reply.body is None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if payload and "Content-Type" not in reply.headers:
                    self.send_header("Content-Type", "application/json")
                if "Content-Length" not in reply.headers:  # a test may declare a wrong length
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    if reply.chunk_delay:
                        for start in range(0, len(payload), reply.chunk_size):
                            self.wfile.write(payload[start : start + reply.chunk_size])
                            self.wfile.flush()
                            time.sleep(reply.chunk_delay)
                    elif payload:
                        self.wfile.write(payload)
                except OSError:
                    self.close_connection = True  # the client gave up

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        self._httpd = _Server(("127.0.0.1", 0), _RequestHandler)
        if ssl_context is not None:
            self._httpd.socket = ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="test-http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def count(self, method: str, path_prefix: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.method == method and r.path.startswith(path_prefix))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ScriptedServer(_BaseServer):
    pass


class MockupServer(_BaseServer):
    """A DMTF mockup directory over HTTP.

    Read-only by default: other methods get 405 with ``Allow: GET``. With ``writable`` it acts
    as DMTF's own mockup server does (Redfish-Mockup-Server, which is not on PyPI): the files are
    the start of an in-memory copy; PATCH merges into a resource, POST to a collection adds a
    member (201 with ``Location``), DELETE removes one, and POST to an action answers 204 and
    changes nothing — no action semantics at all. A POST to the Sessions collection answers
    ``login_status`` (DMTF's library accepts any 2xx) with ``X-Auth-Token`` and ``Location``.
    """

    def __init__(
        self,
        root: Path,
        *,
        ssl_context: ssl.SSLContext | None = None,
        writable: bool = False,
        login_status: int = 201,
    ) -> None:
        self.root = root
        #: the in-memory copy: resource path (no trailing slash) → its JSON, read on first use
        self.resources: dict[str, Any] = {}
        store_lock = threading.Lock()

        def load(path: str) -> Any:
            if path in self.resources:
                return self.resources[path]
            relative = path[len("/redfish/v1") :].lstrip("/")
            target = (root / relative / "index.json") if relative else root / "index.json"
            if ".." in relative.split("/") or not target.is_file():
                return None
            body = self.resources[path] = json.loads(target.read_text())
            return body

        def write(request: Request, path: str) -> Reply:
            if request.method == "PATCH":
                body = load(path)
                if body is None:
                    return Reply(404, _error("Base.1.22.1.ResourceMissingAtURI"))
                if not isinstance(request.body, dict):
                    return Reply(400, _error("Base.1.22.1.MalformedJSON"))
                body.update(request.body)
                return Reply(200, body)
            if request.method == "DELETE":
                if load(path) is None:
                    return Reply(404, _error("Base.1.22.1.ResourceMissingAtURI"))
                self.resources[path] = None
                parent = load(path.rsplit("/", 1)[0])
                if isinstance(parent, dict) and isinstance(parent.get("Members"), list):
                    parent["Members"] = [m for m in parent["Members"] if m.get("@odata.id") != path]
                    parent["Members@odata.count"] = len(parent["Members"])
                return Reply(204)
            if request.method != "POST":
                return Reply(
                    405, _error("Base.1.22.1.OperationNotAllowed"), {"Allow": "GET, PATCH, POST, DELETE"}
                )
            if "/Actions/" in path:
                return Reply(204)  # accepted, and nothing happens: the mockup server has no semantics
            collection = load(path)
            if path.endswith("/Sessions") and collection is None:
                collection = self.resources[path] = {"@odata.id": path, "Members": []}
            if not isinstance(collection, dict) or not isinstance(collection.get("Members"), list):
                return Reply(405, _error("Base.1.22.1.OperationNotAllowed"), {"Allow": "GET"})
            if not isinstance(request.body, dict):
                return Reply(400, _error("Base.1.22.1.MalformedJSON"))
            taken = {str(m.get("@odata.id", "")).rsplit("/", 1)[-1] for m in collection["Members"]}
            number = 1
            while str(number) in taken or load(f"{path}/{number}") is not None:
                number += 1
            uri = f"{path}/{number}"
            member = {**request.body, "@odata.id": uri, "Id": str(number)}
            member.pop("Password", None)
            self.resources[uri] = member
            collection["Members"].append({"@odata.id": uri})
            collection["Members@odata.count"] = len(collection["Members"])
            headers = {"Location": uri}
            if path.endswith("/SessionService/Sessions"):
                headers["X-Auth-Token"] = f"mockup-token-{number}"
                return Reply(login_status, None if login_status == 204 else member, headers)
            return Reply(201, member, headers)

        def serve(request: Request) -> Reply:
            path = request.path.split("?", 1)[0].rstrip("/")
            if path == "/redfish" and request.method == "GET":
                return Reply(200, {"v1": "/redfish/v1/"})
            if not path.startswith("/redfish/v1"):
                return Reply(404, _error("Base.1.22.1.ResourceMissingAtURI"))
            with store_lock:
                if request.method != "GET":
                    if not writable:
                        return Reply(405, _error("Base.1.22.1.OperationNotAllowed"), {"Allow": "GET"})
                    return write(request, path)
                body = load(path)
                if body is None:
                    return Reply(404, _error("Base.1.22.1.ResourceMissingAtURI"))
                return Reply(200, json.loads(json.dumps(body)))

        super().__init__(serve, ssl_context=ssl_context)


def _error(message_id: str) -> dict[str, Any]:
    return {
        "error": {
            "code": message_id,
            "message": message_id.rsplit(".", 1)[-1],
            "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message_id.rsplit(".", 1)[-1]}],
        }
    }
