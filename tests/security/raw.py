"""HTTP/1.1 spoken by hand over a socket, as a hostile client speaks it: bodies larger than they
should be, heads that never end, bytes one at a time, from a chosen loopback source address (every
``127.x.y.z`` reaches a server listening on 127.0.0.1, so each attack is a client of its own)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Answer", "connect", "head", "read_answer", "send_body", "vm_hwm_mib", "wait_closed"]

MiB = 1 << 20


@dataclass
class Answer:
    #: None: the server closed the connection without answering
    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


def connect(url: str, source: str = "127.0.0.1", timeout: float = 30.0) -> socket.socket:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout, source_address=(source, 0))


def head(method: str, path: str, headers: Mapping[str, str] = {}) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_answer(sock: socket.socket) -> Answer:
    """One response (headers and a ``Content-Length`` body), or ``Answer(None)`` on close/reset."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return Answer(None)
            data += chunk
        raw_head, _, body = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except (ConnectionResetError, TimeoutError):
        return Answer(None)
    return Answer(int(lines[0].split()[1]), headers, body[:length])


def _chunks(total: int, size: int, chunked: bool) -> Iterator[bytes]:
    block = b"x" * size
    sent = 0
    while sent < total:
        piece = block[: min(size, total - sent)]
        sent += len(piece)
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    if chunked:
        yield b"0\r\n\r\n"


def send_body(
    url: str,
    method: str,
    path: str,
    headers: Mapping[str, str],
    total: int,
    *,
    chunked: bool = False,
    source: str = "127.0.0.1",
) -> tuple[Answer, int]:
    """Send a head announcing ``total`` body bytes (or a chunked body) and the body in 1 MiB pieces,
    while another thread reads the answer; stop sending as soon as it came. Returns the answer and
    how many body bytes were sent by then."""
    framing = {"transfer-encoding": "chunked"} if chunked else {"content-length": str(total)}
    sock = connect(url, source)
    answer: list[Answer] = []
    reader = threading.Thread(target=lambda: answer.append(read_answer(sock)), daemon=True)
    sent = 0
    try:
        sock.sendall(head(method, path, {**headers, **framing}))
        reader.start()
        for piece in _chunks(total, MiB, chunked):
            if answer:
                break
            sock.sendall(piece)
            sent += len(piece)
        reader.join(timeout=60)
    except OSError:  # the server closed or reset the connection: it stopped reading
        reader.join(timeout=10)
    finally:
        sock.close()
    return (answer[0] if answer else Answer(None)), sent


def wait_closed(sock: socket.socket, within: float) -> tuple[Answer, float]:
    """Read until the server answers or closes; the answer and the seconds it took (``within`` +
    1 when it still had not by then)."""
    start = time.monotonic()
    sock.settimeout(within)
    got = read_answer(sock)
    elapsed = time.monotonic() - start
    if got.status is None and elapsed >= within:
        return got, within + 1.0
    return got, elapsed


def vm_hwm_mib(pid: int) -> float:
    """The peak resident set size of a process (``VmHWM`` in ``/proc/PID/status``), in MiB."""
    for line in open(f"/proc/{pid}/status", encoding="ascii").read().splitlines():  # noqa: SIM115
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for process {pid}")
