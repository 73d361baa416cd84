"""A hostile Redfish service: a real process in front of a real emulator that turns on the manager.

    python -m tests.support.hostile_redfish --upstream http://127.0.0.1:PORT --mode MODE \\
        --ports-file ports.json --record record.jsonl

It forwards every request to ``--upstream`` (the emulator) and answers it as ``--mode`` says; a
second listener (the *recorder*, another port: another origin) answers ``{}`` to anything and
records every request it gets, headers and body, so a test can check that no credential reached it.
``ports.json`` gets ``{"port": ..., "recorder": ...}`` once both listen. Every request the hostile
service itself answers is recorded too (``"origin": "service"``). ``POST /_hostile/mode/NAME``
switches the mode of a running fixture.

Modes, one per attack of docs/reliability.md's "Hostile Redfish service" table:

* ``passthrough`` — the emulator as it is.
* ``foreign-sessions`` — the service root's ``Links.Sessions`` is ``@127.0.0.1:RECORDER/...``: a
  client that appends it to its base URL posts the credentials to the recorder. (Resolved as a
  URI reference it is a path of this service, which answers 404 to any path with ``@``.)
* ``foreign-sessions-url`` — ``Links.Sessions`` is ``http://127.0.0.1:RECORDER/...``.
* ``foreign-task`` — every POST/PATCH but a login is answered 202 with ``TaskMonitor`` =
  ``@127.0.0.1:RECORDER/...`` and no ``Location``, and not forwarded: nothing is bound.
* ``foreign-location`` — the same with ``Location: http://127.0.0.1:RECORDER/...``.
* ``huge`` — every read below a collection (members) is answered with 31 MB of chunked JSON
  (no ``Content-Length``), just under the 32 MiB cap of one answer.
* ``endless`` — the same, but the answer never ends.
* ``pages`` — every collection pages on for ever: ``Members@odata.nextLink`` always names a new page.
* ``expire`` — every 5th authenticated GET is answered 401, as if the session had expired.
* ``hang`` — every GET but the service root is never answered (the connection stays open).
* ``event-bomb`` — the event stream (``/redfish/v1/EventService/SSE``) is answered with
  ``Content-Encoding: gzip, gzip``: 590 bytes that decode to one 256 MiB ``data:`` line.
* ``members-bomb`` — every Zones collection is answered ``Content-Encoding: gzip`` with 16 MiB of
  ``{"Members": [{}, {}, …]}`` (16 KiB on the wire): 5.6 million members, under the 32 MiB cap.
* ``long-strings`` — every ``Model``, ``Manufacturer`` and ``SerialNumber`` the emulator answers is
  200,000 characters long; serial numbers differ only in their last characters (the emulator's).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import itertools
import json
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MODES"]

MODES = (
    "passthrough",
    "foreign-sessions",
    "foreign-sessions-url",
    "foreign-task",
    "foreign-location",
    "huge",
    "endless",
    "pages",
    "expire",
    "hang",
    "event-bomb",
    "members-bomb",
    "long-strings",
)

HUGE_BYTES = 31_000_000  # just below the manager's 32 MiB per-answer cap
PAGE_MEMBERS = 50
EVENT_BOMB_BYTES = 256 << 20  # decoded
MEMBERS_BOMB_BYTES = 16 << 20  # decoded
LONG_STRING = 200_000
LONG_FIELDS = ("Model", "Manufacturer", "SerialNumber")
SSE_PATH = "/redfish/v1/EventService/SSE"


def _gzip(chunks: Iterator[bytes]) -> bytes:
    """gzip of what ``chunks`` yield, compressed as they come (the bombs are never whole in memory)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(packer.compress(chunk) for chunk in chunks) + packer.flush()


def _repeat(head: bytes, unit: bytes, size: int, tail: bytes) -> Iterator[bytes]:
    yield head
    block = unit * ((1 << 20) // len(unit))
    for _ in range(size // len(block)):
        yield block
    yield tail


@functools.cache
def event_bomb() -> bytes:
    """One ``data:`` line of 256 MiB, gzipped twice."""
    return _gzip(iter([_gzip(_repeat(b"data: ", b"x", EVENT_BOMB_BYTES, b"\n\n"))]))


@functools.cache
def members_bomb() -> bytes:
    """16 MiB of ``{"Members": [{}, {}, …]}``, gzipped once."""
    return _gzip(_repeat(b'{"Members": [', b"{},", MEMBERS_BOMB_BYTES, b"{}]}"))


def _lengthen(value: Any) -> Any:
    """Every Model, Manufacturer and SerialNumber in ``value`` 200,000 characters long."""
    if isinstance(value, list):
        return [_lengthen(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _lengthen(v) for k, v in value.items()}
    for name in LONG_FIELDS:
        if isinstance(out.get(name), str):
            # the emulator's value at the end: a cut that keeps only the start makes them all one
            out[name] = (name[0] * LONG_STRING + out[name])[-LONG_STRING:]
    return out


class _State:
    def __init__(self, upstream: str, mode: str, record: Path) -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.mode = mode
        self.recorder_port = 0
        self._record = record
        self._lock = threading.Lock()
        self._gets = itertools.count(1)

    def record(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry) + "\n"
        with self._lock, self._record.open("a") as out:
            out.write(line)

    def next_get(self) -> int:
        return next(self._gets)

    @property
    def foreign(self) -> str:
        """A URI reference that, appended to ``http://host:port``, names the recorder instead."""
        return f"@127.0.0.1:{self.recorder_port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State
    origin = "service"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, body: bytes, status: int | None, location: str | None = None) -> None:
        self.state.record(
            {
                "origin": self.origin,
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers.items()),
                "body": body.decode(errors="replace"),
                "status": status,
                "location": location,
            }
        )

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._answer(
            status, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        )

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        body = self._body()
        if self.path.startswith("/_hostile/mode/"):
            mode = self.path.rsplit("/", 1)[1]
            if mode not in MODES:
                self._json(400, {"error": f"no mode {mode}"})
                return
            self.state.mode = mode
            self._json(200, {"mode": mode})
            return
        self._location: str | None = None
        status = self._hostile(body)
        if status is None:
            status = self._forward(body)
        self._record(body, status, self._location)

    # -- the attacks -------------------------------------------------------------------------

    def _hostile(self, body: bytes) -> int | None:
        """Answer as the mode says; None: forward to the emulator."""
        mode = self.state.mode
        path = self.path.split("?", 1)[0].rstrip("/")
        authenticated = "X-Auth-Token" in self.headers or "Authorization" in self.headers
        login = self.command == "POST" and path.endswith("/Sessions")
        if "@" in path:
            self._json(404, {"error": {"code": "Base.1.0.ResourceMissingAtURI", "message": path}})
            return 404
        if mode in ("foreign-task", "foreign-location") and self.command in ("POST", "PATCH") and not login:
            monitor = "/redfish/v1/TaskService/TaskMonitors/1"
            if mode == "foreign-task":
                self._json(202, {"TaskMonitor": self.state.foreign + monitor}, {"Retry-After": "0"})
            else:
                location = f"http://127.0.0.1:{self.state.recorder_port}{monitor}"
                self._json(202, {}, {"Location": location, "Retry-After": "0"})
            return 202
        if self.command != "GET":
            return None
        if mode == "event-bomb" and path == SSE_PATH:
            self._answer(
                200,
                event_bomb(),
                {"Content-Type": "text/event-stream", "Content-Encoding": "gzip, gzip"},
            )
            return 200
        if mode == "members-bomb" and path.endswith("/Zones"):
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            self._answer(200, members_bomb(), headers)
            return 200
        depth = len([p for p in path.split("/") if p])
        if mode in ("huge", "endless") and depth >= 4:
            self._stream_huge(endless=mode == "endless")
            return 200
        if mode == "expire" and authenticated and self.state.next_get() % 5 == 0:
            self._json(401, {"error": {"code": "Base.1.0.NoValidSession", "message": "expired"}})
            return 401
        if mode == "hang" and depth > 2:
            time.sleep(600)
            return None
        return None

    def _stream_huge(self, *, endless: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pad = b"x" * (1 << 20)
        try:
            self._chunk(b'{"Id": "huge", "Name": "')
            sent = 0
            while endless or sent < HUGE_BYTES:
                self._chunk(pad)
                sent += len(pad)
            self._chunk(b'"}')
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    # -- forwarding --------------------------------------------------------------------------

    def _forward(self, body: bytes) -> int:
        upstream = http.client.HTTPConnection(self.state.upstream_host, self.state.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            content = answer.read()
            answer_headers = {
                k: v
                for k, v in answer.getheaders()
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server")
            }
        finally:
            upstream.close()
        status = answer.status
        self._location = answer.getheader("Location")
        content = self._rewrite(status, content)
        self._answer(status, content, answer_headers)
        return status

    def _rewrite(self, status: int, content: bytes) -> bytes:
        mode = self.state.mode
        if (
            self.command != "GET"
            or status != 200
            or mode not in ("foreign-sessions", "foreign-sessions-url", "pages", "long-strings")
        ):
            return content
        try:
            resource = json.loads(content)
        except ValueError:
            return content
        if not isinstance(resource, dict):
            return content
        if mode == "long-strings":
            return json.dumps(_lengthen(resource)).encode()
        path, _, query = self.path.partition("?")
        if mode.startswith("foreign-sessions") and path.rstrip("/") == "/redfish/v1":
            where = (
                self.state.foreign
                if mode == "foreign-sessions"
                else f"http://127.0.0.1:{self.state.recorder_port}"
            )
            resource.setdefault("Links", {})["Sessions"] = {
                "@odata.id": f"{where}/redfish/v1/SessionService/Sessions"
            }
            # The fixed path (DSP0266) must not be an escape: the service root offers no other.
            resource.pop("SessionService", None)
        if mode == "pages" and isinstance(resource.get("Members"), list):
            page = int(query.split("page=", 1)[1]) if "page=" in query else 0
            base = path.rstrip("/")
            resource["Members"] = resource["Members"] + [
                {"@odata.id": f"{base}/page{page}-member{i}"} for i in range(PAGE_MEMBERS)
            ]
            resource["Members@odata.count"] = len(resource["Members"])
            resource["Members@odata.nextLink"] = f"{base}?page={page + 1}"
        return json.dumps(resource).encode()


class _Recorder(_Handler):
    origin = "recorder"

    def _handle(self) -> None:
        body = self._body()
        self._record(body, 200)
        self._json(200, {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--mode", choices=MODES, default="passthrough")
    parser.add_argument("--ports-file", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    state = _State(args.upstream, args.mode, args.record)
    if args.mode == "event-bomb":
        event_bomb()  # made before the port is announced: the first stream gets it at once
    elif args.mode == "members-bomb":
        members_bomb()
    service_handler = type("ServiceHandler", (_Handler,), {"state": state})
    recorder_handler = type("RecorderHandler", (_Recorder,), {"state": state})
    service = ThreadingHTTPServer(("127.0.0.1", 0), service_handler)
    recorder = ThreadingHTTPServer(("127.0.0.1", 0), recorder_handler)
    service.daemon_threads = recorder.daemon_threads = True
    state.recorder_port = recorder.server_address[1]
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    tmp = args.ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": service.server_address[1], "recorder": state.recorder_port}))
    tmp.rename(args.ports_file)
    service.serve_forever()


if __name__ == "__main__":
    main()
