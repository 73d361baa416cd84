from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from plumbing.fsutil import atomic_write


def test_atomic_write_creates_parents_and_sets_mode_despite_umask(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "file.json"
    old = os.umask(0o077)
    try:
        atomic_write(target, "one", mode=0o644)
    finally:
        os.umask(old)
    assert target.read_text() == "one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    atomic_write(target, b"two", mode=0o600, durable=False)
    assert target.read_bytes() == b"two" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(target.parent) == ["file.json"]  # no temp file left behind


def test_atomic_write_that_fails_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "dir-not-file"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        atomic_write(target, "data")  # a directory cannot be replaced by a file
    assert sorted(os.listdir(tmp_path)) == ["dir-not-file"]
    assert (target / "keep").read_text() == "x"
