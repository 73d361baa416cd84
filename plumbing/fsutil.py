"""Crash-safe file writes: after a crash a reader sees the old content or the new, never a mix."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir"]

#: temp names: ``.<name>.<pid>-<n>-<random>.tmp``, unique within this process and across processes
_SEQUENCE = itertools.count()
_TOKEN = secrets.token_hex(3)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: str | Path) -> None:
    """Persist a directory entry change (a rename or unlink) in ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temp(directory: str, name: str, mode: int) -> tuple[int, str]:
    while True:
        tmp = os.path.join(directory, f".{name}.{os.getpid()}-{next(_SEQUENCE)}-{_TOKEN}.tmp")
        try:
            return os.open(tmp, _CREATE, mode), tmp
        except FileExistsError:  # left over by an earlier process with our pid: take the next name
            continue
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            return os.open(tmp, _CREATE, mode), tmp


def atomic_write(path: str | Path, data: bytes | str, *, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory, fsync, rename.

    With ``durable=False`` the fsyncs are skipped: the rename still makes the change atomic
    for concurrent readers, but a power loss may lose it (fine for ready files and caches).
    The parent directory is created when missing. The file gets ``mode`` whatever the umask.
    """
    target = os.fspath(path)
    directory, name = os.path.split(target)
    directory = directory or "."
    payload = memoryview(data.encode() if isinstance(data, str) else data)
    fd, tmp = _create_temp(directory, name, mode)
    try:
        try:
            while payload:
                payload = payload[os.write(fd, payload) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)
