"""Start ``python -m MODULE ARGS`` (or ``python SCRIPT ARGS``) as forks of one interpreter that has
already imported what they import.

A program's start is mostly Python importing it. A :class:`ForkServer` is one interpreter that
imports the given modules once and from then on only forks; an entry ``module:function`` also
calls ``function()`` after the import, for work every child would otherwise repeat at its start
(it must not depend on the environment, nor start a thread). :meth:`ForkServer.spawn` makes a
child that runs the program as a new interpreter would: its own session (``setsid``, as
``start_new_session``), the requested environment and working directory, the given descriptors as
stdout and stderr, stdin from ``/dev/null``, ``sys.argv`` and ``sys.path[0]`` as ``-m`` (or a
script's path) sets them. The child leaves the server's loop and runs the program as the
interpreter's ``__main__`` (``runpy``), so its exceptions, ``SystemExit``, atexit handlers and exit
code are those of a program started on its own.

The one fork server of the project, with two users, both test facilities (production starts every
role as its own process: the image's entry point, the demo):

* the test suite starts its roles as forks (:class:`plumbing.procs.RoleProcess`, ``tests/conftest.py``):
  a role's start is 0.4-0.8 s of the 0.5-1.1 s of CPU it spends getting ready (docs/testing.md), and
  the suite starts about 500;
* the QEMU guest agent (``emulator/qemu/agent.py``) starts the plugin and the kubelet client inside
  a guest as forks of one preloaded in it: under TCG their imports alone take 30-60 s each. A
  server there may take minutes to import: :meth:`ForkServer.start` returns at once and
  :meth:`ForkServer.wait_ready` waits as long as its caller says.

What differs from a new interpreter, and how it is handled:

* Module state computed at import saw the server's environment, not the child's. The one module
  that reads the environment at import, :mod:`plumbing.crashpoints`, reads it again in the child
  (:func:`plumbing.crashpoints.rearm`) before the program runs.
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

Protocol, over a unix socket in a private directory: the server writes one JSON line to its
stdout once it has imported its modules, ``{"ready": seconds}`` (or ``{"failed": text}``); then
one connection per spawn: the caller sends one JSON line ``{"argv", "env", "cwd"}`` (``argv``: what
follows the interpreter on a command line) with the descriptors of the child's stdout and stderr
attached (``SCM_RIGHTS``); the server answers ``{"pid": N}`` (or ``{"error": text}``) and, when
the child has exited, ``{"rc": code}``, then closes.

Standard library only, imported lazily where only one side needs it: the guest agent loads this
file on its own, under ``python -S``, where every module costs (``emulator/qemu/agent.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # pathlib is left out at run time: the guest agent pays for every module it imports
    from pathlib import Path

__all__ = ["ForkServer", "ForkServerError", "ForkedProcess"]

#: seconds the server gives its children to stop after SIGTERM when it is itself told to stop
GRACE = 5.0
_PR_SET_PDEATHSIG = 1
#: how long :meth:`ForkServer.spawn` waits for the server to import its modules
START_TIMEOUT = 60.0


class ForkServerError(RuntimeError):
    """The server could not be started, or could not fork: start the process another way."""


def _die_with_parent(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it exits."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _interpreter_env(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


def runs(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (what follows the interpreter) is a program a fork can run: ``-m MODULE
    ...`` or ``SCRIPT ...``, no interpreter options."""
    if len(argv) >= 2 and argv[0] == "-m":
        return True
    return len(argv) >= 1 and not argv[0].startswith("-")


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
        # a wait in another thread holds the lock: this one waits for it at most its own timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        try:
            code = self._read(timeout)
        finally:
            self._lock.release()
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
    """The caller's handle on one fork server: it starts the server at :meth:`start` (or the
    first :meth:`spawn`), which imports ``modules`` with ``python`` in ``env`` (this process's
    environment by default)."""

    def __init__(
        self,
        modules: Sequence[str],
        *,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.modules = list(modules)
        self.python = python
        self.log_file = log_file
        #: the server's environment
        self.env = dict(os.environ if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None
        #: seconds the server took to import its modules, once it has
        self.import_seconds: float | None = None
        self._dir: str | None = None
        self._socket = ""
        self._answers: IO[bytes] | None = None
        self._lock = threading.Lock()
        self.failure: str | None = None

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a child with ``env`` would start as a new interpreter would: the interpreter's
        own variables are the server's (read once, at its start)."""
        return _interpreter_env(env) == _interpreter_env(self.env)

    def start(self) -> None:
        """Start the server (once); it imports its modules in the background (:meth:`wait_ready`)."""
        with self._lock:
            if self.proc is None and self.failure is None:
                self._launch()

    def _launch(self) -> None:
        import tempfile

        self._dir = tempfile.mkdtemp(prefix="fdra-fork-")
        self._socket = os.path.join(self._dir, "s")
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
        except OSError as err:
            self.failure = f"the fork server did not start: {err}"
            raise ForkServerError(self.failure) from err
        finally:
            log.close()
        self._answers = self.proc.stdout

    def wait_ready(self, timeout: float = START_TIMEOUT) -> float:
        """Wait until the server has imported its modules (starting it if need be); the seconds
        that took. :class:`ForkServerError` when it failed, ``TimeoutError`` when it is still
        importing after ``timeout`` (a later call may wait again)."""
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError(f"importing {self.modules} takes longer than {timeout:.0f}s")
        try:
            if self.proc is None and self.failure is None:
                self._launch()
            if self.failure is not None:
                raise ForkServerError(self.failure)
            if self.import_seconds is None:
                self.import_seconds = self._read_ready(deadline, timeout)
            return self.import_seconds
        finally:
            self._lock.release()

    def _read_ready(self, deadline: float, timeout: float) -> float:
        """The server's ready line; the caller holds the lock."""
        out = self._answers
        if out is None:  # started with stdout=PIPE: never
            raise ForkServerError("the fork server has no stdout pipe")
        readable, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            raise TimeoutError(f"importing {self.modules} takes longer than {timeout:.0f}s")
        line = out.readline()  # one short write of the server: whole once readable
        out.close()
        self._answers = None
        try:
            message = json.loads(line)
        except ValueError:
            message = {"failed": f"no answer (exit status {self.proc.poll() if self.proc else None})"}
        if "ready" not in message:
            self.failure = f"the fork server did not start: {message.get('failed')}"
            self._stop()
            raise ForkServerError(self.failure)
        return float(message["ready"])

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        stdout: int,
        stderr: int,
        cwd: str | None = None,
    ) -> ForkedProcess:
        """``python *argv`` (``-m MODULE ARGS`` or ``SCRIPT ARGS``) with ``env``, the working
        directory ``cwd`` (this process's by default), and the open descriptors ``stdout`` and
        ``stderr`` (the caller keeps its own and may close them); :class:`ForkServerError` if the
        server cannot fork it (or did not get ready within :data:`START_TIMEOUT`)."""
        if not runs(argv):
            raise ForkServerError(f"a fork runs -m MODULE or a script, not {list(argv)}")
        try:
            self.wait_ready(START_TIMEOUT)
        except TimeoutError as err:
            with self._lock:
                self.failure = f"the fork server did not start: {err}"
                self._stop()
            raise ForkServerError(self.failure) from err
        request = {"argv": list(argv), "env": env, "cwd": cwd or os.getcwd()}
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
        child = ForkedProcess(conn, int(reply["pid"]), [self.python, *argv])
        child._buffer = rest  # an exit status that came with the pid
        return child

    def close(self) -> None:
        """Stop the server (its children get SIGTERM, then SIGKILL after :data:`GRACE`)."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        import shutil

        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(GRACE + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._answers is not None:
            self._answers.close()
            self._answers = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


# -- the server process ------------------------------------------------------------------------


def _tell(answers: int, message: dict[str, Any]) -> None:
    os.write(answers, json.dumps(message).encode() + b"\n")


def _preload(modules: list[str], answers: int) -> None:
    """Import ``modules`` (and run their ``module:function`` warm-ups); on failure tell the caller
    why and exit. The server must then still be one thread, and what it built is frozen: the
    collector of a child then never walks (and so never copies) the server's pages for it."""
    import gc
    import importlib
    import traceback

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
        _tell(answers, {"failed": traceback.format_exc()})
        raise SystemExit(1) from None
    if threading.active_count() != 1:
        # forking a process with threads leaves their locks in the child: refuse rather than hang
        _tell(answers, {"failed": f"importing {modules} started {threading.active_count() - 1} threads"})
        raise SystemExit(1)
    gc.collect()
    gc.freeze()


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
        request = json.loads(data)
        if not runs(request.get("argv") or ()):
            raise ValueError(f"a fork runs -m MODULE or a script, not {request.get('argv')}")
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the caller is gone: nobody to tell
        conn.sendall(json.dumps(message).encode() + b"\n")


class _Server:
    """The server's loop: forks on request, reaps its children and tells their callers, stops
    them when told to stop or when its own caller is gone (see the module doc)."""

    def __init__(self, path: str, parent: int) -> None:
        import selectors

        self.parent = parent
        self.pid = os.getpid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        #: when the server was told to stop (or found its caller gone)
        self.stopping: list[float] = []
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.append(time.monotonic()))
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        #: child pid → the connection its exit status goes to
        self.children: dict[int, socket.socket] = {}
        self.signalled: set[int] = set()

    def run(self) -> tuple[dict[str, Any], list[int]]:
        """Serve until told to stop; returns only in a forked child: its request and descriptors."""
        while True:
            self._stop_when_asked()
            for key, _ in self.selector.select(timeout=0.2 if self.stopping else 1.0):
                if key.fd == self.wake_r:
                    self._drain_wakeups()
                    continue
                forked = self._fork_one()
                if forked is not None:
                    return forked
            self._reap()

    def _stop_when_asked(self) -> None:
        """Once told to stop, or orphaned: SIGTERM every child's process group, and exit when they
        are gone or :data:`GRACE` has passed (the children left get SIGKILL from the kernel)."""
        if not self.stopping and os.getppid() != self.parent:
            self.stopping.append(time.monotonic())  # the caller is gone: so are its children
        if not self.stopping:
            return
        for pid in self.children.keys() - self.signalled:
            self.signalled.add(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        if not self.children or time.monotonic() - self.stopping[0] > GRACE:
            raise SystemExit(0)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _fork_one(self) -> tuple[dict[str, Any], list[int]] | None:
        """Accept one spawn and fork it; in the child, its request and descriptors."""
        conn, _ = self.listener.accept()
        try:
            request, output = _read_request(conn)
        except (OSError, ValueError) as err:
            _answer(conn, {"error": str(err)})
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as err:
            for fd in output:
                os.close(fd)
            _answer(conn, {"error": str(err)})
            conn.close()
            return None
        if pid == 0:
            self._leave(conn)
            request["server"] = self.pid  # not getppid(): the server may be gone already
            return request, output
        for fd in output:
            os.close(fd)
        _answer(conn, {"pid": pid})
        self.children[pid] = conn
        return None

    def _leave(self, conn: socket.socket) -> None:
        """In a forked child: drop everything of the server's."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        self.selector.close()
        for sock in (self.listener, conn, *self.children.values()):
            sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _reap(self) -> None:
        """Every child that has exited: its status to its caller."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            caller = self.children.pop(pid, None)
            if caller is not None:
                _answer(caller, {"rc": os.waitstatus_to_exitcode(status)})
                caller.close()


def _serve(path: str, parent: int, modules: list[str]) -> tuple[dict[str, Any], list[int]]:
    """Import ``modules``, then fork on request; returns only in a forked child: its request and
    its stdout and stderr descriptors."""
    import ctypes  # noqa: F401 - what every child needs (_run_child), imported once for all
    import runpy  # noqa: F401

    answers = os.dup(1)  # the caller reads the ready line here; an import's prints go to stderr
    os.dup2(2, 1)
    started = time.monotonic()
    _preload(modules, answers)
    server = _Server(path, parent)
    _tell(answers, {"ready": round(time.monotonic() - started, 3)})
    os.close(answers)
    return server.run()


def _run_child(request: dict[str, Any], output: list[int]) -> None:
    """In a forked child: become ``python ARGV`` as a new interpreter would run it."""
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
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file name in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def main() -> None:
    path, parent, *modules = sys.argv[1:]
    # a forked child leaves the server's loop here and runs its program; exceptions and SystemExit
    # reach the interpreter as they would in a program started on its own
    request, output = _serve(path, int(parent), modules)
    _run_child(request, output)


if __name__ == "__main__":
    main()
