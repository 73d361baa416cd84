"""fabric-dra as a user installs it: wheels of the product (``pyproject.toml``) and of its testbed
(``testbed/pyproject.toml``), installed into a virtualenv of their own
(tests/e2e/test_demo_installed.py, tests/unit/deploy/test_image.py).

No download: the wheels are built without build isolation (this virtualenv's setuptools) from a
copy of what a project's build reads (:func:`copy_project`: setuptools writes its build/ beside the
sources, and two test workers must not build in the same place), and the new virtualenv sees the
dependencies of this one through a directory of links to them that leaves out what this checkout
installed of itself (its editable fabric-dra and fabric-dra-testbed, whose import hooks and entry
points would otherwise stand in for the wheels under test).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Installed", "build_wheel", "copy_project", "install", "wheel_names"]

_PIP = (sys.executable, "-m", "pip")
#: what this checkout installed of itself into its virtualenv, by name in site-packages
_OWN = ("fabric_dra", "fabric_dra_testbed", "kube_standin", "__editable__", "__editable___")


def copy_project(source: Path, packages: Sequence[str], into: Path) -> Path:
    """What the build of the project at ``source`` reads — its pyproject.toml, README.md and
    ``packages``, links followed (a wheel holds their targets as files) — copied into ``into``."""
    into.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(source / name, into / name)
    for package in packages:
        shutil.copytree(
            source / package, into / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return into


def build_wheel(project: Path, wheels: Path) -> Path:
    """The wheel of ``project`` (a copy of the repository's product or testbed), built as pip builds
    it for an install."""
    before = set(wheels.glob("*.whl"))
    done = subprocess.run(
        [
            *_PIP,
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = set(wheels.glob("*.whl")) - before
    return wheel


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _dependencies(farm: Path) -> Path:
    """Links to every entry of this virtualenv's site-packages but what this checkout installed of
    itself (see the module doc)."""
    site = Path(sysconfig.get_paths()["purelib"])
    farm.mkdir(parents=True)
    for entry in site.iterdir():
        if entry.name.startswith(_OWN) or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)
    return farm


class Installed:
    """A virtualenv holding the given wheels (and this one's dependencies, :func:`install`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"
        self.command = root / "bin" / "fabric-dra"

    @property
    def site_packages(self) -> Path:
        (site,) = (self.root / "lib").glob("python3*/site-packages")
        return site

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment without what would reach past the virtualenv (PYTHONPATH)."""
        environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        return {**environment, **extra}

    def run(
        self, *args: str, cwd: Path, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``fabric-dra ARGS`` as the installed command runs it."""
        return subprocess.run(
            [str(self.command), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(**env),
            cwd=cwd,
            check=False,
        )

    def python_run(self, code: str, *, cwd: Path) -> subprocess.CompletedProcess[str]:
        """``python -c CODE`` with the virtualenv's interpreter; it must succeed."""
        return subprocess.run(
            [str(self.python), "-c", code],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=cwd,
            check=True,
        )


def install(root: Path, wheels: list[Path], dependencies: Path) -> Installed:
    """A new virtualenv at ``root`` with ``wheels`` installed by pip (byte-compiled, the console
    script written, as the image's install does) and the links of ``dependencies``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    installed = Installed(root)
    if not dependencies.exists():
        _dependencies(dependencies)
    (installed.site_packages / "dependencies.pth").write_text(f"{dependencies}\n")
    done = subprocess.run(
        [
            *_PIP,
            "--python",
            str(installed.python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            *map(str, wheels),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return installed
