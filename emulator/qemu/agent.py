"""The guest agent of a QEMU host: runs commands inside the guest for the emulator and the tests.

Started by ``guest-init.sh`` as ``python -S agent.py 7000`` (standard library only, no argparse:
under TCG every imported module costs); QEMU forwards a loopback port of the machine to it.
``agent.py PORT HOST`` listens on ``HOST`` only (the tests run it on this machine's loopback). One
JSON request per line, one JSON answer per line:

* ``{"op": "ping"}`` → ``{"uptime": seconds}``
* ``{"op": "run", "argv": [...], "env": {...}, "timeout": s}`` → ``{"rc", "stdout", "stderr"}``
* ``{"op": "spawn", "argv": [...], "env": {...}, "log": path}`` → ``{"pid", "forked"}`` (runs in
  the background; ``forked``: started from the preloaded fork server, below)
* ``{"op": "signal", "pid": n, "signal": n}`` → ``{"sent": bool}``
* ``{"op": "wait", "pid": n, "timeout": s}`` → ``{"rc": int | null}`` (null: still running)
* ``{"op": "preload", "python": path, "modules": [...], "env": {...}}`` → ``{"started": bool}``
* ``{"op": "preloaded", "timeout": s}`` → ``{"seconds": s}`` once the fork server has imported them

Anything else, or a failure, answers ``{"error": text}``.

**Preloading.** Under TCG a Python program that imports the plugin's dependencies (pydantic,
grpc, httpx, the Kubernetes client) spends 30-60 s in imports alone, so a test that starts the
plugin, the kubelet client and restarts of them would spend minutes there. ``preload`` starts the
project's one fork server (:mod:`plumbing.forkserver`, the tests' too) with ``python``: it imports
the modules once, in the background, and then only forks. A later ``spawn`` of ``PYTHON -m MODULE
...`` or ``PYTHON SCRIPT.py ...`` with the same interpreter and ``PYTHON*`` variables becomes a
fork of it that runs the module or script as ``__main__``, in its own session, with the requested
environment and the log as stdout and stderr — what a new interpreter would do, without the
imports. The server reaps its children and reports each exit to the agent, which answers ``wait``
for them. A second ``preload`` of other modules starts another server; the first keeps the
children it forked (and reports their exits) but starts no new ones.

**Where the fork server comes from.** The guest runs this machine's own root filesystem, read-only
over 9p (:mod:`emulator.qemu.image`): this file and ``plumbing/forkserver.py`` beside it in the same
tree are the very files the machine runs, so there is nothing to copy into the guest. The agent
loads that one file on its own (:func:`_fork_server`), not the ``plumbing`` package, whose
``__init__`` reads the installed distribution's metadata: a second of emulated CPU at every boot,
for nothing the agent uses. The fork server's own process runs ``python -m plumbing.forkserver``
with the preloaded interpreter, which imports the project anyway.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plumbing.forkserver import ForkedProcess, ForkServer

_started = time.monotonic()
_children: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()
#: the fork server of the last preload, and the children forked by any
_server: ForkServer | None = None
_forked: dict[int, ForkedProcess] = {}


def _fork_server() -> ModuleType:
    """``plumbing/forkserver.py`` of this tree, loaded as a file (see the module doc)."""
    name = "plumbing.forkserver"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "plumbing", "forkserver.py"))
    if spec is None or spec.loader is None:
        raise RuntimeError(f"no fork server beside the agent in {root}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


def _preload(request: dict[str, Any]) -> dict[str, Any]:
    global _server
    python, modules, env = request["python"], list(request["modules"]), _env(request.get("env"))
    with _lock:
        current = _server
        if (
            current is not None
            and current.failure is None
            and current.proc is not None
            and current.proc.poll() is None
            and (current.python, current.modules, current.env.get("PYTHONPATH"))
            == (python, modules, env.get("PYTHONPATH"))
        ):
            return {"started": False}
        server: ForkServer = _fork_server().ForkServer(modules, python=python, env=env)
        server.start()
        _server = server
    return {"started": True}


def _preloaded_for(argv: list[str], env: dict[str, str]) -> ForkServer | None:
    """The preloaded fork server, if it runs ``argv`` as ``env`` asks."""
    server = _server
    if server is None or argv[:1] != [server.python] or not server.serves(env):
        return None
    return server if _fork_server().runs(argv[1:]) else None


def _fork(server: ForkServer, argv: list[str], env: dict[str, str], log: str, timeout: float) -> int | None:
    """``argv`` forked from ``server``, its log as stdout and stderr; None when the server cannot
    (the console says why). Waiting for a server still importing costs less than a second
    interpreter importing the same modules beside it on the same emulated CPUs."""
    try:
        server.wait_ready(timeout)
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            child = server.spawn(argv[1:], env=env, stdout=output, stderr=output, cwd=os.getcwd())
        finally:
            os.close(output)
    except (RuntimeError, TimeoutError) as err:
        print(f"agent: starting {argv} without the fork server: {err}", flush=True)  # noqa: T201 - the console
        return None
    with _lock:
        _forked[child.pid] = child
    return child.pid


def _spawn(request: dict[str, Any]) -> dict[str, Any]:
    argv, env, log = list(request["argv"]), _env(request.get("env")), request.get("log", "/dev/null")
    server = _preloaded_for(argv, env)
    if server is not None:
        pid = _fork(server, argv, env, log, request.get("timeout", 600))
        if pid is not None:
            return {"pid": pid, "forked": True}
    with open(log, "ab") as out:
        popen = subprocess.Popen(  # noqa: S603 - the agent exists to run what it is asked
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    with _lock:
        _children[popen.pid] = popen
    return {"pid": popen.pid, "forked": False}


def _wait(request: dict[str, Any]) -> dict[str, Any]:
    pid, timeout = int(request["pid"]), float(request.get("timeout", 0))  # 0: is it still running?
    with _lock:
        waited = _children.get(pid)
        forked = _forked.get(pid)
    if forked is not None:
        if timeout <= 0:
            return {"rc": forked.poll()}
        try:
            return {"rc": forked.wait(timeout)}
        except subprocess.TimeoutExpired:
            return {"rc": None}
    if waited is None:
        return {"error": f"no child {pid}"}
    try:
        return {"rc": waited.wait(timeout=timeout)}
    except subprocess.TimeoutExpired:
        return {"rc": None}


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
        return _spawn(request)
    if op == "signal":
        try:
            os.kill(int(request["pid"]), int(request.get("signal", 15)))
        except ProcessLookupError:
            return {"sent": False}
        return {"sent": True}
    if op == "wait":
        return _wait(request)
    if op == "preload":
        return _preload(request)
    if op == "preloaded":
        if _server is None:
            return {"error": "nothing is preloaded"}
        return {"seconds": _server.wait_ready(request.get("timeout", 600))}
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
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 7000
    # every address of the guest, reached only via QEMU's hostfwd; the tests run it on loopback
    host = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"  # noqa: S104
    with _Server((host, port), _Handler) as server:
        port = int(server.server_address[1])
        print(f"fabric-dra guest agent listening on {port}", flush=True)  # noqa: T201 - the console
        server.serve_forever()


if __name__ == "__main__":
    main()
