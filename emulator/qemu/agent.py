"""The guest agent of a QEMU host: runs commands inside the guest for the emulator and the tests.

Started by ``guest-init.sh`` as ``python -S agent.py 7000`` (standard library only, no argparse:
under TCG every imported module costs); QEMU forwards a loopback port of the machine to it. One
JSON request per line, one JSON answer per line:

* ``{"op": "ping"}`` → ``{"uptime": seconds}``
* ``{"op": "run", "argv": [...], "env": {...}, "timeout": s}`` → ``{"rc", "stdout", "stderr"}``
* ``{"op": "spawn", "argv": [...], "env": {...}, "log": path}`` → ``{"pid", "forked"}`` (runs in
  the background; ``forked``: started from the zygote, below)
* ``{"op": "signal", "pid": n, "signal": n}`` → ``{"sent": bool}``
* ``{"op": "wait", "pid": n, "timeout": s}`` → ``{"rc": int | null}`` (null: still running)
* ``{"op": "preload", "python": path, "modules": [...], "env": {...}}`` → ``{"started": bool}``
* ``{"op": "preloaded", "timeout": s}`` → ``{"seconds": s}`` once the zygote has imported them

Anything else, or a failure, answers ``{"error": text}``.

**The zygote.** Under TCG a Python program that imports the plugin's dependencies (pydantic,
grpc, httpx, the Kubernetes client) spends 30-60 s in imports alone, so a test that starts the
plugin, the kubelet client and restarts of them would spend minutes there. ``preload`` starts one
interpreter (``python agent.py zygote MODULE...``) that imports the modules once and then only
forks: a later ``spawn`` of ``PYTHON -m MODULE ...`` or ``PYTHON SCRIPT.py ...`` with the same
interpreter and ``PYTHONPATH`` becomes a fork of it that runs the module or script as
``__main__`` (``runpy``), in its own session, with the requested environment and log — what a new
interpreter would do, without the imports. The zygote is single-threaded when it forks, and it
reaps its children and reports their exit to the agent, which answers ``wait`` for them.
"""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from typing import Any

_started = time.monotonic()
_children: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


class _Zygote:
    """The agent's handle on the zygote process (see the module docstring)."""

    def __init__(self, python: str, modules: list[str], env: dict[str, str]) -> None:
        self.python = python
        self.modules = modules
        self.pythonpath = env.get("PYTHONPATH")
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and file
            [python, os.path.abspath(__file__), "zygote", *modules],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._cond = threading.Condition()
        self._next = 0
        self.seconds: float | None = None
        self.error: str | None = None
        self._forked: dict[int, int | str] = {}
        self._exited: dict[int, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        if self.proc.stdout is None:  # started with stdout=PIPE: never
            raise RuntimeError("the zygote has no stdout pipe")
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._cond:
                if "ready" in message:
                    self.seconds = message["ready"]
                elif "failed" in message:
                    self.error = message["failed"]
                elif "forked" in message:
                    self._forked[message["id"]] = message["forked"]
                elif "exited" in message:
                    self._exited[message["exited"]] = message["rc"]
                self._cond.notify_all()
        with self._cond:
            self.error = self.error or f"the zygote exited ({self.proc.wait()})"
            self._cond.notify_all()

    def serves(self, argv: list[str], env: dict[str, str]) -> bool:
        return (
            len(argv) >= 2
            and argv[0] == self.python
            and ((argv[1] == "-m" and len(argv) >= 3) or not argv[1].startswith("-"))
            and env.get("PYTHONPATH") == self.pythonpath
        )

    def wait_ready(self, timeout: float) -> float:
        with self._cond:
            self._cond.wait_for(lambda: self.seconds is not None or self.error is not None, timeout)
            if self.error is not None:
                raise RuntimeError(f"preloading {self.modules} failed: {self.error}")
            if self.seconds is None:
                raise TimeoutError(f"preloading {self.modules} takes longer than {timeout}s")
            return self.seconds

    def fork(self, argv: list[str], env: dict[str, str], log: str) -> int:
        if self.proc.stdin is None:  # started with stdin=PIPE: never
            raise RuntimeError("the zygote has no stdin pipe")
        with self._cond:
            self._next += 1
            ident = self._next
            request = {"id": ident, "argv": argv, "env": env, "log": log, "cwd": os.getcwd()}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            self._cond.wait_for(lambda: ident in self._forked or self.error is not None, 60)
            pid = self._forked.pop(ident, None)
        if not isinstance(pid, int):
            raise RuntimeError(f"the zygote could not fork {argv}: {pid or self.error}")
        return pid

    def wait(self, pid: int, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exited or self.error is not None, timeout)
            return self._exited.get(pid)


_zygote: _Zygote | None = None
#: pids of children forked by the zygote
_forked: set[int] = set()


def _preload(request: dict[str, Any]) -> dict[str, Any]:
    global _zygote
    python, modules, env = request["python"], list(request["modules"]), _env(request.get("env"))
    with _lock:
        current = _zygote
        if (
            current is not None
            and current.error is None
            and (current.python, current.modules, current.pythonpath)
            == (python, modules, env.get("PYTHONPATH"))
        ):
            return {"started": False}
        if current is not None and current.proc.poll() is None:
            current.proc.kill()
        _zygote = _Zygote(python, modules, env)
    return {"started": True}


def _spawn(request: dict[str, Any]) -> dict[str, Any]:
    argv, env, log = list(request["argv"]), _env(request.get("env")), request.get("log", "/dev/null")
    zygote = _zygote
    if zygote is not None and zygote.serves(argv, env):
        # Waiting for a zygote still importing costs less than a second interpreter importing
        # the same modules beside it on the same emulated CPUs.
        try:
            zygote.wait_ready(request.get("timeout", 600))
        except (RuntimeError, TimeoutError) as err:
            print(f"agent: starting {argv} without the zygote: {err}", flush=True)  # noqa: T201 - the console
        else:
            pid = zygote.fork(argv, env, log)
            with _lock:
                _forked.add(pid)
            return {"pid": pid, "forked": True}
    with open(log, "ab") as out:
        child = subprocess.Popen(  # noqa: S603 - the agent exists to run what it is asked
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    with _lock:
        _children[child.pid] = child
    return {"pid": child.pid, "forked": False}


def _wait(request: dict[str, Any]) -> dict[str, Any]:
    pid, timeout = int(request["pid"]), float(request.get("timeout", 0))  # 0: is it still running?
    with _lock:
        waited = _children.get(pid)
        zygote = _zygote if pid in _forked else None
    if zygote is not None:
        return {"rc": zygote.wait(pid, timeout)}
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
        if _zygote is None:
            return {"error": "nothing is preloaded"}
        return {"seconds": _zygote.wait_ready(request.get("timeout", 600))}
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


# -- the zygote process ------------------------------------------------------------------------


def _zygote_main(modules: list[str]) -> dict[str, Any]:
    """Import ``modules``, then fork on request; returns only in a forked child, with its request."""
    import importlib
    import selectors
    import signal
    import traceback

    # the agent reads this process's stdout: whatever an import prints goes to stderr instead
    answers = os.dup(1)
    os.dup2(2, 1)

    def tell(message: dict[str, Any]) -> None:
        os.write(answers, json.dumps(message).encode() + b"\n")

    # sys.path[0] is this file's directory; a program run with -m has its working directory there
    sys.path[0] = os.getcwd()
    started = time.monotonic()
    try:
        for module in modules:
            importlib.import_module(module)
    except BaseException:
        tell({"failed": traceback.format_exc()})
        raise SystemExit(1) from None
    if threading.active_count() != 1:
        # forking a process with threads leaves their locks in the child: refuse rather than hang
        tell({"failed": f"importing {modules} started {threading.active_count() - 1} threads"})
        raise SystemExit(1)
    tell({"ready": round(time.monotonic() - started, 3)})

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                continue
            data = os.read(0, 65536)
            if not data:
                raise SystemExit(0)  # the agent is gone
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as err:
                    tell({"id": request["id"], "forked": str(err)})
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for fd in (wake_r, wake_w, answers):
                        os.close(fd)
                    return dict(request)
                tell({"id": request["id"], "forked": pid})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            tell({"exited": pid, "rc": os.waitstatus_to_exitcode(status)})


def _run_forked(request: dict[str, Any]) -> None:
    """In a child of the zygote: become the requested program, as a new interpreter would run it."""
    import runpy

    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    if argv[1] == "-m":
        sys.argv = argv[2:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.realpath(argv[1]))
        runpy.run_path(argv[1], run_name="__main__")


def main() -> None:
    if sys.argv[1:2] == ["zygote"]:
        # a forked child leaves the zygote's loop here and runs its program; exceptions and
        # SystemExit reach the interpreter as they would in a program started on its own
        _run_forked(_zygote_main(sys.argv[2:]))
        return
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 7000
    with _Server(("0.0.0.0", port), _Handler) as server:  # noqa: S104 - reached only via QEMU's hostfwd
        print(f"fabric-dra guest agent listening on {port}", flush=True)  # noqa: T201 - the console
        server.serve_forever()


if __name__ == "__main__":
    main()
