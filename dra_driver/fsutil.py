"""Crash-safe file writes: after a crash a reader sees the old content or the new, never a mix."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Persist a directory entry change (a rename or unlink) in ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes | str, *, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory, fsync, rename.

    With ``durable=False`` the fsyncs are skipped: the rename still makes the change atomic
    for concurrent readers, but a power loss may lose it (fine for ready files and caches).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)
