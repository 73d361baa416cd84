"""Run fabric-dra roles as real child processes — for the local demo, the tests and benchmarks.

Every server role accepts ``--port 0`` (pick a free port) and ``--ready-file PATH``: once it
accepts connections it writes its base URL (or socket path) there atomically. A
:class:`RoleProcess` starts ``fabric-dra <role> ...``, waits for that file, and always stops
the process (SIGTERM, then SIGKILL) — also when the caller fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from plumbing.cli import emit
from plumbing.errors import PlumbingError
from plumbing.forkserver import ForkedProcess, ForkServer, ForkServerError

__all__ = ["CPU_LOG_ENV", "RoleProcess", "RoleStartError", "run", "use_fork_server"]

#: test-only measurement, off by default: when set to a file path, every :class:`RoleProcess`
#: appends lines to it, ``ready|stop name role pid cpu wall`` — user+system CPU seconds of the
#: child (from /proc) and seconds since it was started, when its ready file appeared and just
#: before it is signalled to stop — so a test run can say where its CPU went. A life that ends
#: by itself (a crash point) has only its ``ready`` line: its last CPU is gone with it.
CPU_LOG_ENV = "FABRIC_DRA_ROLE_CPU_LOG"


def _cpu_seconds(pid: int) -> float | None:
    """User+system CPU of a live (or not yet reaped) process, from ``/proc/PID/stat``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RoleStartError(PlumbingError, RuntimeError):
    """A role's child process did not come up (exited, or wrote no ready file in time)."""


#: where :class:`RoleProcess` starts its children; None: a new interpreter each (the default)
_fork_server: ForkServer | None = None


def use_fork_server(server: ForkServer | None) -> ForkServer | None:
    """Start every later :class:`RoleProcess` of this process as a fork of ``server``, which has
    imported the roles once (see :mod:`plumbing.forkserver`; the test suite does this), or again
    as a new interpreter each (None). Returns the server used before."""
    global _fork_server
    previous, _fork_server = _fork_server, server
    return previous


def _spawn(
    module: str, args: Sequence[str], env: dict[str, str], stdout: int, stderr: int, cwd: str | None = None
) -> ForkedProcess | None:
    """``python -m module args`` from the fork server in use; None when there is none, or when it
    failed (its reason is said once, and every later start is a new interpreter again)."""
    global _fork_server
    server = _fork_server
    if server is None or server.python != sys.executable or not server.serves(env):
        return None
    try:
        return server.spawn(["-m", module, *args], env=env, stdout=stdout, stderr=stderr, cwd=cwd)
    except ForkServerError as err:
        _fork_server = None
        emit(f"fabric-dra: starting roles as new interpreters from now on: {err}", file=sys.stderr)
        return None


def run(
    args: Sequence[str],
    *,
    module: str = "fabric_dra",
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` to its end, as ``subprocess.run(..., capture_output=True,
    text=True, timeout=timeout)`` would — a fork of the fork server in use when there is one
    (:func:`use_fork_server`). ``env`` is the whole environment (this process's by default)."""
    environment = dict(os.environ if env is None else env)
    command = [sys.executable, "-m", module, *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = _spawn(
            module, args, environment, out.fileno(), err.fileno(), None if cwd is None else str(cwd)
        )
        if child is None:
            return subprocess.run(  # noqa: S603 - our own interpreter and module
                command,
                env=environment,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        return subprocess.CompletedProcess(command, code, _text(out), _text(err))


def _text(output: IO[bytes]) -> str:
    """A child's whole output as ``subprocess.run(text=True)`` decodes it: the locale's encoding,
    universal newlines."""
    output.seek(0)
    with io.TextIOWrapper(output) as text:
        return text.read()


class RoleProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        ready_file: Path | None,
        log_file: Path,
        env: dict[str, str] | None = None,
        name: str | None = None,
        start_timeout: float = 30.0,
        module: str = "fabric_dra",
    ) -> None:
        self.args = list(args)
        #: the ``python -m`` entry point; ``fabric_dra`` is the ``fabric-dra`` command line.
        self.module = module
        self.ready_file = ready_file
        self.log_file = log_file
        self.env = {**os.environ, **(env or {})}
        self.name = name or (self.args[0] if self.args else "fabric-dra")
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.address: str = ""
        self._started = 0.0
        self._cpu_logged = False  # the "stop" line of this life is written

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.pid

    def start(self) -> RoleProcess:
        if self.ready_file is not None and self.ready_file.exists():
            self.ready_file.unlink()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._started = time.monotonic()
        log = open(self.log_file, "ab")  # noqa: SIM115 - the child's for its lifetime
        try:
            self.proc = _spawn(self.module, self.args, self.env, log.fileno(), log.fileno())
            if self.proc is None:
                self.proc = subprocess.Popen(  # noqa: S603 - our own CLI with our own arguments
                    [sys.executable, "-m", self.module, *self.args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                )
        finally:
            log.close()
        self._started = time.monotonic()
        if self.ready_file is None:
            return self
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                self.address = self.ready_file.read_text().strip()
                if self.address:
                    self._log_cpu("ready")
                    return self
            if self.proc.poll() is not None:
                raise RoleStartError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; "
                    f"last log lines:\n{self.tail()}"
                )
            time.sleep(0.02)
        self.stop()
        raise RoleStartError(f"{self.name} was not ready after {self.start_timeout:.0f}s:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _log_cpu(self, event: str) -> None:
        """One line of :data:`CPU_LOG_ENV` for this life: ``ready``, or ``stop`` (once, before it
        is signalled)."""
        path = os.environ.get(CPU_LOG_ENV)
        if not path or self.proc is None or (event == "stop" and self._cpu_logged):
            return
        cpu = _cpu_seconds(self.proc.pid)
        if cpu is None:
            return
        self._cpu_logged = event == "stop"
        words = list(self.args)
        while words and words[0].startswith("--log-"):  # the global options and their values
            del words[:2]
        role = "/".join(words[:2])  # "manager/serve", "standin/apiserver", ...
        wall = time.monotonic() - self._started
        line = f"{event} {self.name} {self.module}:{role} {self.proc.pid} {cpu:.2f} {wall:.2f}\n"
        with open(path, "a") as handle:  # one short append per line: whole lines across workers
            handle.write(line)

    def kill(self) -> None:
        """SIGKILL, as a crash would: no cleanup runs in the child."""
        if self.alive() and self.proc is not None:
            self._log_cpu("stop")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        self.terminate()
        return self.reap(timeout)

    def terminate(self) -> None:
        """SIGTERM, without waiting: :meth:`reap` waits. Apart so that a caller stopping many
        processes signals them all first and they shut down side by side."""
        if self.alive() and self.proc is not None:
            self._log_cpu("stop")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def reap(self, timeout: float = 10.0) -> int | None:
        """Wait up to ``timeout`` for a process told to stop, then SIGKILL; the exit code."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        return self.proc.returncode

    def __enter__(self) -> RoleProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
