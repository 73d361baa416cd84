"""Start ``python -m MODULE ARGS`` as forks of one interpreter that has already imported it.

A role's start is mostly Python importing it: 0.4-0.8 s of the 0.5-1.1 s of CPU a role spends
getting ready (docs/testing.md), and the test suite starts about 500 roles. A :class:`ForkServer`
is one interpreter that imports the given modules once and from then on only forks; an entry
``module:function`` also calls ``function()`` after the import, for work every child would
otherwise repeat at its start (it must not depend on the environment, nor start a thread).
:meth:`ForkServer.spawn` makes a child that runs ``python -m MODULE ARGS`` as a new interpreter
would: its own session (``setsid``, as ``start_new_session``), the requested environment and
working directory, the log file as stdout and stderr, stdin from ``/dev/null``, ``sys.argv`` and
``sys.path[0]`` as ``-m`` sets them. The child leaves the server's loop and runs the module as the
interpreter's ``__main__`` (``runpy``), so its exceptions, ``SystemExit``, atexit handlers and
exit code are those of a program started on its own. A test facility: production starts every
role as its own process (the image's entry point, the demo).

What differs from a new interpreter, and how it is handled:

* Module state computed at import saw the server's environment, not the child's. The one module
  that reads the environment at import, :mod:`plumbing.crashpoints`, reads it again in the child
  (:func:`plumbing.crashpoints.rearm`) before the module runs.
* The server must be single-threaded when it forks (a thread's held lock would stay held in the
  child forever): it refuses to serve if importing started a thread.
* The child's parent is the server, so the caller cannot ``waitpid`` it: the server reaps it and
  sends the exit status over the connection the spawn came on. :class:`ForkedProcess` offers what
  :class:`plumbing.procs.RoleProcess` uses of ``subprocess.Popen``: ``pid``, ``returncode``,
  ``poll()`` and ``wait(timeout)`` (negative signal numbers, ``TimeoutExpired``). Signals go to
  the child's process group as before.
* The interpreter's own settings (``PYTHONPATH``, ``PYTHONHASHSEED``, every ``PYTHON*``
  variable) take effect at its start: a spawn whose environment sets them otherwise than the
  server's is not served (:meth:`ForkServer.serves`), and the caller starts a new interpreter.
* All children share the server's hash seed, and ``/proc/PID/cmdline`` names the server.

Lifetimes: the server checks every second that its caller still lives (its parent process id;
the kernel's parent-death signal follows the *thread* that started it, and callers start roles
from threads), and when told to stop or orphaned it SIGTERMs its children's process groups and
waits up to :data:`GRACE` seconds; each child has SIGKILL as its parent-death signal, so a test
process killed by a timeout leaves no role running behind it (with plain ``Popen`` its roles lived
on as orphans).

Protocol, over a unix socket in a private directory: one connection per spawn; the caller sends
one JSON line ``{"module", "args", "env", "cwd"}`` with the descriptors of the child's stdout and
stderr attached (``SCM_RIGHTS``); the server answers ``{"pid": N}`` (or ``{"error": text}``) and,
when the child has exited, ``{"rc": code}``, then closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ForkServer", "ForkServerError", "ForkedProcess"]

#: seconds the server gives its children to stop after SIGTERM when it is itself told to stop
GRACE = 5.0
_PR_SET_PDEATHSIG = 1
#: how long a caller waits for the server to import its modules
START_TIMEOUT = 60.0


class ForkServerError(RuntimeError):
    """The server could not be started, or could not fork: start the process another way."""


def _die_with_parent(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _interpreter_env(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


class ForkedProcess:
    """A child of the fork server, seen from the process that asked for it (see the module doc)."""

    def __init__(self, conn: socket.socket, pid: int, args: Sequence[str]) -> None:
        self._conn = conn
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._buffer = b""
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        # as Popen.poll: a wait() in another thread holds the lock, and the answer is "not yet"
        if not self._lock.acquire(blocking=False):
            return self.returncode
        try:
            return self._read(0.0)
        finally:
            self._lock.release()

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _read(self, timeout: float | None) -> int | None:
        """The exit status once the server has sent it, waiting up to ``timeout`` (None: for ever);
        the caller holds the lock."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            data = None
            if b"\n" not in self._buffer:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                readable, _, _ = select.select([self._conn], [], [], left)
                if not readable:
                    return None
                try:
                    data = self._conn.recv(4096)
                except OSError:
                    data = b""
                self._buffer += data
            if b"\n" in self._buffer:
                self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["rc"])
            elif not data:
                # The server went away before the child ended: the child was killed with it
                # (its parent-death signal), which is what a caller sees of a SIGKILL.
                self.returncode = -signal.SIGKILL
            else:
                continue
            self._conn.close()
        return self.returncode


class ForkServer:
    """The caller's handle on one fork server; it starts the server at the first :meth:`spawn`."""

    def __init__(
        self, modules: Sequence[str], *, python: str = sys.executable, log_file: Path | None = None
    ) -> None:
        self.modules = list(modules)
        self.python = python
        self.log_file = log_file
        #: the server's environment: this process's when the server was made
        self.env = dict(os.environ)
        self.proc: subprocess.Popen[bytes] | None = None
        self.import_seconds: float | None = None
        self._dir: Path | None = None
        self._socket = ""
        self._lock = threading.Lock()
        self._failed: str | None = None

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a child with ``env`` would start as a new interpreter would: the interpreter's
        own variables are the server's (read once, at its start)."""
        return _interpreter_env(env) == _interpreter_env(self.env)

    def _start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="fdra-fork-"))
        self._socket = str(self._dir / "s")
        log = open(self.log_file or os.devnull, "ab")  # noqa: SIM115 - the server's for its lifetime
        try:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [self.python, "-m", "plumbing.forkserver", self._socket, str(os.getpid()), *self.modules],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                start_new_session=True,
            )
        finally:
            log.close()
        out = self.proc.stdout
        if out is None:  # started with stdout=PIPE: never
            raise ForkServerError("the fork server has no stdout pipe")
        readable, _, _ = select.select([out], [], [], START_TIMEOUT)
        line = out.readline() if readable else b""
        out.close()
        try:
            message = json.loads(line)
        except ValueError:
            message = {"failed": f"no answer within {START_TIMEOUT:.0f}s (exit status {self.proc.poll()})"}
        if "ready" not in message:
            self.close()
            raise ForkServerError(f"the fork server did not start: {message.get('failed')}")
        self.import_seconds = float(message["ready"])

    def spawn(
        self,
        module: str,
        args: Sequence[str],
        *,
        env: dict[str, str],
        stdout: int,
        stderr: int,
        cwd: str | None = None,
    ) -> ForkedProcess:
        """``python -m module *args`` with ``env``, the working directory ``cwd`` (this process's by
        default), and the open descriptors ``stdout`` and ``stderr`` (the caller keeps its own and
        may close them); :class:`ForkServerError` if the server cannot fork it."""
        with self._lock:
            if self._failed is not None:
                raise ForkServerError(self._failed)
            if self.proc is None:
                try:
                    self._start()
                except (OSError, ForkServerError) as err:
                    self._failed = str(err)
                    raise ForkServerError(self._failed) from err
        request = {"module": module, "args": list(args), "env": env, "cwd": cwd or os.getcwd()}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._socket)
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [stdout, stderr])
            answer = b""
            while b"\n" not in answer:
                readable, _, _ = select.select([conn], [], [], 30.0)
                chunk = conn.recv(4096) if readable else b""
                if not chunk:
                    raise ForkServerError("the fork server did not answer")
                answer += chunk
        except (OSError, ForkServerError) as err:
            conn.close()
            raise ForkServerError(f"fork server: {err}") from err
        first, rest = answer.split(b"\n", 1)
        reply = json.loads(first)
        if "pid" not in reply:
            conn.close()
            raise ForkServerError(f"the fork server could not fork: {reply.get('error')}")
        child = ForkedProcess(conn, int(reply["pid"]), [self.python, "-m", module, *args])
        child._buffer = rest  # an exit status that came with the pid
        return child

    def close(self) -> None:
        """Stop the server (its children get SIGTERM, then SIGKILL after :data:`GRACE`)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(GRACE + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


# -- the server process ------------------------------------------------------------------------


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    conn.settimeout(10.0)  # the caller sends its whole request at once
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
    try:
        if len(fds) != 2:
            raise ValueError("a request comes with two descriptors, the child's stdout and stderr")
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                raise ValueError("the request ended early")
            data += chunk
        return json.loads(data), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _serve(path: str, parent: int, modules: list[str]) -> tuple[dict[str, Any], list[int]]:
    """Import ``modules``, then fork on request; returns only in a forked child: its request and
    its stdout and stderr descriptors."""
    import importlib
    import selectors
    import traceback

    answers = os.dup(1)  # the caller reads the ready line here; an import's prints go to stderr
    os.dup2(2, 1)

    def tell(message: dict[str, Any]) -> None:
        os.write(answers, json.dumps(message).encode() + b"\n")

    started = time.monotonic()
    try:
        for entry in modules:
            module, _, function = entry.partition(":")
            try:
                imported = importlib.import_module(module)
            except ModuleNotFoundError as err:
                # an optional package not installed here: the child does without it, as it would
                if not err.name or not module.startswith(err.name):
                    raise
                continue
            if function:  # "module:function": work every child would otherwise repeat
                getattr(imported, function)()
    except BaseException:
        tell({"failed": traceback.format_exc()})
        raise SystemExit(1) from None
    if threading.active_count() != 1:
        tell({"failed": f"importing {modules} started {threading.active_count() - 1} threads"})
        raise SystemExit(1)
    # Freeze what the imports built: the collector of a child then never walks (and so never
    # copies) the server's pages for them.
    import gc

    gc.collect()
    gc.freeze()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping: list[float] = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    tell({"ready": round(time.monotonic() - started, 3)})
    os.close(answers)

    signalled: set[int] = set()
    server = os.getpid()
    while True:
        if not stopping and os.getppid() != parent:
            stopping.append(time.monotonic())  # the caller is gone: so are its roles
        if stopping:
            for pid in children.keys() - signalled:
                signalled.add(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
            if not children or time.monotonic() - stopping[0] > GRACE:
                raise SystemExit(0)  # the children left get SIGKILL from the kernel
        for key, _ in selector.select(timeout=0.2 if stopping else 1.0):
            if key.fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                continue
            conn, _ = listener.accept()
            try:
                request, output = _read_request(conn)
            except (OSError, ValueError) as err:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": str(err)}).encode() + b"\n")
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as err:
                for fd in output:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": str(err)}).encode() + b"\n")
                conn.close()
                continue
            if pid == 0:
                request["server"] = server  # not getppid(): the server may be gone already
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGCHLD, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                selector.close()
                for sock in (listener, conn, *children.values()):
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                return request, output
            for fd in output:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            children[pid] = conn
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            caller = children.pop(pid, None)
            if caller is not None:
                with contextlib.suppress(OSError):
                    caller.sendall(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                caller.close()


def _run_child(request: dict[str, Any], output: list[int]) -> None:
    """In a forked child: become ``python -m MODULE ARGS`` as a new interpreter would run it."""
    import runpy

    os.setsid()
    _die_with_parent(signal.SIGKILL)
    if os.getppid() != request["server"]:  # the server died before the line above took effect
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output[0], 1)
    os.dup2(output[1], 2)
    os.close(null)
    for fd in output:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    crashpoints = sys.modules.get("plumbing.crashpoints")
    if crashpoints is not None:
        crashpoints.rearm()
    module = request["module"]
    sys.argv = [module, *request["args"]]  # runpy puts the module's file name in argv[0]
    sys.path[0] = os.getcwd()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main() -> None:
    path, parent, *modules = sys.argv[1:]
    # a forked child leaves the server's loop here and runs its module; exceptions and SystemExit
    # reach the interpreter as they would in a program started on its own
    request, output = _serve(path, int(parent), modules)
    _run_child(request, output)


if __name__ == "__main__":
    main()
