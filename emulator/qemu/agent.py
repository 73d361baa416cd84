"""The guest agent of a QEMU host: runs commands inside the guest for the emulator and the tests.

Started by ``guest-init.sh`` as ``python -S agent.py --port 7000`` (standard library only, so it
starts in a fraction of a second over 9p); QEMU forwards a loopback port of the machine to it. One
JSON request per line, one JSON answer per line:

* ``{"op": "ping"}`` → ``{"uptime": seconds}``
* ``{"op": "run", "argv": [...], "env": {...}, "timeout": s}`` → ``{"rc", "stdout", "stderr"}``
* ``{"op": "spawn", "argv": [...], "env": {...}, "log": path}`` → ``{"pid"}`` (runs in the background)
* ``{"op": "signal", "pid": n, "signal": n}`` → ``{"sent": bool}``
* ``{"op": "wait", "pid": n, "timeout": s}`` → ``{"rc": int | null}`` (null: still running)

Anything else, or a failure, answers ``{"error": text}``.
"""

from __future__ import annotations

import argparse
import json
import os
import socketserver
import subprocess
import threading
import time
from typing import Any

_started = time.monotonic()
_children: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


def _handle(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "ping":
        return {"uptime": time.monotonic() - _started}
    if op == "run":
        try:
            done = subprocess.run(  # noqa: S603 - the agent exists to run what it is asked
                request["argv"],
                env=_env(request.get("env")),
                capture_output=True,
                timeout=request.get("timeout", 60),
                input=request.get("input", "").encode(),
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            return {"error": f"timed out after {err.timeout}s: {request['argv']}"}
        except OSError as err:
            return {"error": str(err)}
        return {
            "rc": done.returncode,
            "stdout": done.stdout.decode(errors="replace"),
            "stderr": done.stderr.decode(errors="replace"),
        }
    if op == "spawn":
        log = open(request.get("log", "/dev/null"), "ab")  # noqa: SIM115 - the child's for its lifetime
        try:
            child = subprocess.Popen(  # noqa: S603 - the agent exists to run what it is asked
                request["argv"],
                env=_env(request.get("env")),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        with _lock:
            _children[child.pid] = child
        return {"pid": child.pid}
    if op == "signal":
        try:
            os.kill(int(request["pid"]), int(request.get("signal", 15)))
        except ProcessLookupError:
            return {"sent": False}
        return {"sent": True}
    if op == "wait":
        with _lock:
            waited = _children.get(int(request["pid"]))
        if waited is None:
            return {"error": f"no child {request['pid']}"}
        try:
            rc = waited.wait(timeout=request.get("timeout", 0) or None)
        except subprocess.TimeoutExpired:
            return {"rc": None}
        return {"rc": rc}
    return {"error": f"unknown op {op!r}"}


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            try:
                answer = _handle(json.loads(line))
            except Exception as err:  # answer every request, whatever went wrong
                answer = {"error": f"{type(err).__name__}: {err}"}
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7000)
    args = parser.parse_args()
    with _Server(("0.0.0.0", args.port), _Handler) as server:  # noqa: S104 - reached only via QEMU's hostfwd
        print(f"fabric-dra guest agent listening on {args.port}", flush=True)  # noqa: T201 - the console
        server.serve_forever()


if __name__ == "__main__":
    main()
