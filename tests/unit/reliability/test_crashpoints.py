"""The crash-point facility: an armed point kills the process with SIGKILL and says which point it
was; unarmed points do nothing; every point in the catalogue is placed in the code, and every
placed point is in the catalogue (so the crash-point matrix walks them all)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from plumbing import crashpoints
from tests.support.deploy import PACKAGE_DIRS

_PROGRAM = """
from plumbing.logs import configure
configure()
from plumbing.crashpoints import crash_point
crash_point("plugin.prepare.before-attach")
print("passed the first point", flush=True)
crash_point("plugin.prepare.after-attach")
print("passed the second point", flush=True)
"""


def _run(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV}
    if env_value is not None:
        env[crashpoints.ENV] = env_value
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_an_armed_point_kills_the_process_with_sigkill_and_names_itself() -> None:
    result = _run("plugin.prepare.after-attach")
    assert result.returncode == -signal.SIGKILL
    assert "passed the first point" in result.stdout
    assert "passed the second point" not in result.stdout
    assert "crash point reached" in result.stderr
    assert "point=plugin.prepare.after-attach" in result.stderr


def test_unarmed_points_do_nothing() -> None:
    result = _run(None)
    assert result.returncode == 0, result.stderr
    assert "passed the second point" in result.stdout
    assert "crash point" not in result.stderr


def test_an_unknown_point_is_reported_and_ignored() -> None:
    result = _run("plugin.prepare.no-such-step")
    assert result.returncode == 0
    assert "unknown crash points: plugin.prepare.no-such-step" in result.stderr


def _placed_points() -> set[str]:
    placed: set[str] = set()
    pattern = re.compile(r'"((?:plugin|manager|controller|emulator)\.[a-z]+\.[a-z-]+)"')
    for directory in PACKAGE_DIRS.values():
        for path in directory.rglob("*.py"):
            if path.name == "crashpoints.py":
                continue
            for line in path.read_text().splitlines():
                if "crash_point(" in line:
                    placed.update(pattern.findall(line))
    return placed


def test_every_point_of_the_catalogue_is_placed_and_nothing_else() -> None:
    placed = _placed_points()
    assert placed == set(crashpoints.POINTS), {
        "not placed": sorted(set(crashpoints.POINTS) - placed),
        "not in the catalogue": sorted(placed - set(crashpoints.POINTS)),
    }
