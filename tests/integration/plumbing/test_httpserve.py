"""plumbing.httpserve.HttpServer: the ready file only once connections are accepted, a clean
exit 0 on SIGTERM with the exit hook run first, and stop() for roles that own their signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from plumbing.httpserve import HttpServer, base_url

_CHILD = """
import asyncio, sys
from pathlib import Path
from plumbing.httpserve import HttpServer

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})

marker = Path(sys.argv[2])
server = HttpServer(app, host="127.0.0.1", port=0, on_exit=lambda: marker.write_text("exit hook ran"),
                    lifespan="off")
asyncio.run(server.serve(Path(sys.argv[1])))
print("served to the end", flush=True)
"""


async def _hello(scope: dict[str, object], receive: object, send: object) -> None:
    assert callable(send)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def test_ready_file_then_sigterm_exits_zero_after_the_exit_hook(tmp_path: Path) -> None:
    ready, marker = tmp_path / "url", tmp_path / "exited"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(ready), str(marker)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert child.poll() is None, "the server died during start-up"
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.02)
        url = ready.read_text().strip()
        # The file names a server that answers at once.
        assert httpx.get(url, timeout=5).text == "hello"
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0  # not re-raised: the process's own cleanup ran
    assert "served to the end" in out
    assert marker.read_text() == "exit hook ran"


async def test_stop_ends_a_server_that_leaves_signals_to_its_role(tmp_path: Path) -> None:
    server = HttpServer(_hello, host="127.0.0.1", port=0, handle_signals=False, lifespan="off")
    assert server.url == f"http://127.0.0.1:{server.port}"
    await server.start(tmp_path / "url")
    assert (tmp_path / "url").read_text() == server.url + "\n"
    async with httpx.AsyncClient() as client:
        assert (await client.get(server.url)).text == "hello"
    server.stop()
    await server.close()
    assert server.serving.done()
    assert server.listener.fileno() == -1


def test_base_url_names_a_reachable_address() -> None:
    assert base_url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert base_url("::", 443, tls=True) == "https://[::1]:443"
    assert base_url("fe80::1", 8) == "http://[fe80::1]:8"
    assert base_url("localhost", 8) == "http://localhost:8"


async def test_a_forwarded_header_does_not_change_who_the_client_is(tmp_path: Path) -> None:
    """Per-client limits (the manager's login and token-review budgets) count against the peer's
    address. uvicorn's proxy-headers layer, on by default, would take it from ``X-Forwarded-For``
    for any loopback peer: a local client could name any address it liked. No role sits behind a
    proxy, so the peer's address is the client."""
    seen: list[tuple[str, int] | None] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        assert callable(send)
        client = scope.get("client")
        seen.append((str(client[0]), int(client[1])) if isinstance(client, (list, tuple)) else None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    server = HttpServer(app, host="127.0.0.1", port=0, handle_signals=False, lifespan="off")
    await server.start()
    try:
        async with httpx.AsyncClient() as client:
            headers = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}
            answer = await client.get(server.url, headers=headers)
        assert answer.status_code == 200
    finally:
        server.stop()
        await server.close()
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0][0] == "127.0.0.1"
