"""The image gets the whole program: the build context that .dockerignore lets through builds a
package holding every file of the three packages (code, protos, the emulator's topology, typing
markers), and the ``fabric-dra`` command the image's ENTRYPOINT runs.

No Docker needed: the same ``pip`` step the Dockerfile runs (without build isolation, so no
download) on a copy of exactly the files the Docker build would receive.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.deploy import PACKAGED_MANIFESTS, PACKAGES, REPO_ROOT


def _dockerignore() -> tuple[list[str], list[str]]:
    """(included top-level paths, excluded name patterns) of our .dockerignore: "*" first, then
    "!path" re-inclusions and "**/pattern" exclusions."""
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    included = [line[1:].rstrip("/") for line in lines[1:] if line.startswith("!")]
    excluded = [line.removeprefix("**/") for line in lines[1:] if not line.startswith("!")]
    return included, excluded


def _build_context(target: Path) -> None:
    included, excluded = _dockerignore()

    def ignore(_directory: str, names: list[str]) -> set[str]:
        return {n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in excluded)}

    for name in included:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        else:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _source_files() -> set[str]:
    files = set()
    for package in PACKAGES:
        for root, dirs, names in os.walk(REPO_ROOT / package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = Path(root).relative_to(REPO_ROOT)
            files |= {str(rel / n) for n in names if not n.endswith(".pyc")}
    return files


def test_the_build_context_builds_the_whole_program(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    _build_context(context)
    assert sorted(p.name for p in context.iterdir()) == sorted(
        ["README.md", "pyproject.toml", "deploy", *PACKAGES]
    )
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = wheels.glob("fabric_dra-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    missing = sorted(_source_files() - names)
    assert missing == [], "files the image would lack (pyproject.toml package-data?)"
    assert "emulator/topology/default.yaml" in names
    for manifest in PACKAGED_MANIFESTS:  # the demo's, as files with deploy/'s content
        with zipfile.ZipFile(wheel) as archive:
            shipped = archive.read(f"fabric_dra/demo/manifests/{Path(manifest).name}")
        assert shipped == (REPO_ROOT / manifest).read_bytes(), manifest
    assert "fabric-dra = fabric_dra.cli:main" in scripts
