"""The emulator's answers byte for byte on the wire: status line, header fields in their order,
body — for reads, conditional reads, queries, and the refusals the HTTP layer and the application
give (400, 401, 404, 405, 412, 501, the parser's own 501). ``wire_answers.json`` holds them as the
service answered before its HTTP path was made cheaper (each answer written in one send); the
bytes must not have moved. The ``date`` field is left out (it is the clock's).

Regenerate (only for a deliberate change of an answer): ``python -m
tests.integration.emulator.test_wire_answers OUT.json`` runs the requests against a fresh emulator.
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.emulator import RunningEmulator, run_emulator

GOLDEN = Path(__file__).with_name("wire_answers.json")
_ZONE = "/redfish/v1/Fabrics/PCIe/Zones/kind-worker"

#: (name, request bytes with {auth} for the Basic credentials); each on a connection of its own
REQUESTS: list[tuple[str, str]] = [
    ("versions", "GET /redfish HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("service root", "GET /redfish/v1/ HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("service root HEAD", "HEAD /redfish/v1/ HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("service root revalidated", "GET /redfish/v1/ HTTP/1.1\r\nhost: x\r\nif-none-match: *\r\n\r\n"),
    ("metadata", "GET /redfish/v1/$metadata HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("odata version", "GET /redfish/v1/ HTTP/1.1\r\nhost: x\r\nodata-version: 4.1\r\n\r\n"),
    ("no credentials", f"GET {_ZONE} HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("method not in the table", "PROPFIND /redfish/v1/ HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("zone", f"GET {_ZONE} HTTP/1.1\r\nhost: x\r\nauthorization: {{auth}}\r\n\r\n"),
    ("zone HEAD", f"HEAD {_ZONE} HTTP/1.1\r\nhost: x\r\nauthorization: {{auth}}\r\n\r\n"),
    (
        "zones listing",
        "GET /redfish/v1/Fabrics/PCIe/Zones?$expand=.($levels=1)&$select=Id HTTP/1.1\r\n"
        "host: x\r\nauthorization: {auth}\r\n\r\n",
    ),
    (
        "query not served",
        "GET /redfish/v1/Fabrics/PCIe/Zones?$top=1 HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\r\n",
    ),
    ("not found", "GET /redfish/v1/Nope HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\r\n"),
    ("not allowed", "DELETE /redfish/v1/ HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\r\n"),
    (
        "if-match fails",
        f"POST {_ZONE}/Actions/Zone.AddEndpoint HTTP/1.1\r\nhost: x\r\nauthorization: {{auth}}\r\n"
        'if-match: "stale"\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}',
    ),
    (
        "malformed body",
        f"POST {_ZONE}/Actions/Zone.AddEndpoint HTTP/1.1\r\nhost: x\r\nauthorization: {{auth}}\r\n"
        "content-type: application/json\r\ncontent-length: 5\r\n\r\n{nope",
    ),
    ("method the parser does not know", "FAKEMETHODFORTEST /redfish/v1/ HTTP/1.1\r\nhost: x\r\n\r\n"),
]


def _exchange(port: int, request: bytes) -> str:
    """The whole answer to ``request`` (the connection is closed after it), ``date`` left out."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.replace(b"\r\nhost: x\r\n", b"\r\nhost: x\r\nconnection: close\r\n", 1))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return (b"\r\n".join(lines) + b"\r\n\r\n" + body).decode("latin-1")


def answers(emu: RunningEmulator) -> dict[str, str]:
    user, password = emu.username, emu.password
    auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    port = urlsplit(emu.url).port
    assert port is not None
    return {name: _exchange(port, text.replace("{auth}", auth).encode("latin-1")) for name, text in REQUESTS}


def test_answers_are_byte_for_byte_what_they_were(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        got = answers(emu)
    want = json.loads(GOLDEN.read_text())
    assert list(got) == list(want)
    for name, answer in want.items():
        assert got[name] == answer, name


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp, run_emulator(Path(tmp)) as running:
        Path(sys.argv[1]).write_text(json.dumps(answers(running), indent=1) + "\n")
