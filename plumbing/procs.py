"""Run fabric-dra roles as real child processes — for the local demo, the tests and benchmarks.

Every server role accepts ``--port 0`` (pick a free port) and ``--ready-file PATH``: once it
accepts connections it writes its base URL (or socket path) there atomically. A
:class:`RoleProcess` starts ``fabric-dra <role> ...``, waits for that file, and always stops
the process (SIGTERM, then SIGKILL) — also when the caller fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["RoleProcess", "RoleStartError"]


class RoleStartError(RuntimeError):
    pass


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
        self.proc: subprocess.Popen[bytes] | None = None
        self.address: str = ""

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.pid

    def start(self) -> RoleProcess:
        if self.ready_file is not None and self.ready_file.exists():
            self.ready_file.unlink()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        try:
            self.proc = subprocess.Popen(  # noqa: S603 - our own CLI with our own arguments
                [sys.executable, "-m", self.module, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        finally:
            log.close()
        if self.ready_file is None:
            return self
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                self.address = self.ready_file.read_text().strip()
                if self.address:
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

    def kill(self) -> None:
        """SIGKILL, as a crash would: no cleanup runs in the child."""
        if self.alive() and self.proc is not None:
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
