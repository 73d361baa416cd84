"""``fabric-dra demo`` as an installed package runs it: outside the source tree (no deploy/ beside
the code, the manifests the package ships), with the ports its processes would once have defaulted
to (8080, 8081) taken by something else, printing how long each step took."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import PACKAGES, REPO_ROOT

pytestmark = pytest.mark.slow(seconds=23)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages as a wheel installs them: files only (links to deploy/ followed), no deploy/."""
    site = tmp_path_factory.mktemp("site-packages")
    for package in PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return site


def _environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


@pytest.fixture
def busy_ports() -> Iterator[list[int]]:
    """Listen on 127.0.0.1:8080 and :8081 (or leave them to whoever holds them already)."""
    held: list[socket.socket] = []
    for port in (8080, 8081):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        except OSError:  # taken already: busy either way
            sock.close()
    yield [8080, 8081]
    for sock in held:
        sock.close()


def test_the_installed_demo_runs_outside_the_tree_with_the_usual_ports_taken(
    installed: Path, tmp_path: Path, busy_ports: list[int]
) -> None:
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fabric_dra_testbed.demo.run as r; print(r.__file__, r.packaged_manifests())",
        ],
        capture_output=True,
        text=True,
        env=_environment(installed),
        cwd=tmp_path,
        check=True,
    )
    module, manifests = where.stdout.split()
    assert module.startswith(str(installed)) and manifests.startswith(str(installed)), where.stdout
    assert not any(p.is_symlink() for p in Path(manifests).iterdir())
    for port in busy_ports:
        with pytest.raises(OSError):
            socket.create_server(("127.0.0.1", port)).close()

    workdir = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, "-m", "fabric_dra", "demo", "--no-binding-conditions", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=240,
        env=_environment(installed),
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    for number in range(1, 5):
        assert f"Step {number}/4" in done.stdout
    # each step says how long it took
    assert done.stdout.count(" -> ok in ") == 4, done.stdout
    assert "All steps verified" in done.stdout


def test_a_missing_extra_is_named(installed: Path, tmp_path: Path) -> None:
    """Without kubernetes-validate (the demo extra) the demo says which extra to install, in one line."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # None in sys.modules: an import of it fails, and importlib.util.find_spec finds nothing
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['kubernetes_validate'] = None\n")
    done = subprocess.run(
        [sys.executable, "-m", "fabric_dra", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{installed}"},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip().splitlines() == [
        "fabric-dra demo: the demo needs kubernetes-validate: pip install 'fabric-dra[demo]'"
    ]
