"""The image gets the whole product and nothing of its testbed: the build context that .dockerignore
lets through builds a package holding every file of the product's packages (code, protos, the
emulator's topology, typing markers) and the ``fabric-dra`` command the image's ENTRYPOINT runs, and
that package, installed alone, runs every role's command line. The testbed's own package
(testbed/pyproject.toml) holds the demo's manifests as files and adds its commands.

No Docker needed: the same ``pip`` step the Dockerfile runs (without build isolation, so no
download) on a copy of exactly the files the Docker build would receive.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.deploy import PACKAGED_MANIFESTS, PACKAGES, REPO_ROOT, TESTBED_DIR, TESTBED_PACKAGES
from tests.support.install import build_wheel, copy_project, install, wheel_names

pytestmark = pytest.mark.slow(seconds=67)


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


def _source_files(root: Path, packages: tuple[str, ...]) -> set[str]:
    files = set()
    for package in packages:
        for directory, dirs, names in os.walk(root / package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = Path(directory).relative_to(root)
            files |= {str(rel / n) for n in names if not n.endswith(".pyc")}
    return files


def test_the_build_context_builds_the_whole_product_and_no_testbed(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    _build_context(context)
    assert sorted(p.name for p in context.iterdir()) == sorted(["README.md", "pyproject.toml", *PACKAGES])
    wheel = build_wheel(context, tmp_path / "wheels")
    names = wheel_names(wheel)
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    missing = sorted(_source_files(REPO_ROOT, PACKAGES) - names)
    assert missing == [], "files the image would lack (pyproject.toml package-data?)"
    assert "emulator/topology/default.yaml" in names
    assert not {name.split("/")[0] for name in names} & set(TESTBED_PACKAGES), "the testbed is in the image"
    assert "fabric-dra = fabric_dra.cli:main" in scripts
    assert "fabric_dra.commands" not in scripts, "the product adds no command of the testbed's"

    image = install(tmp_path / "venv", [wheel], tmp_path / "dependencies")
    version = image.run("--version", cwd=tmp_path)  # the Dockerfile's check of its build
    assert version.returncode == 0 and version.stdout.startswith("fabric-dra "), version.stderr
    for command in (["--help"], ["manager", "serve", "--help"], ["emulator", "serve", "--help"]):
        done = image.run(*command, cwd=tmp_path)
        assert done.returncode == 0 and done.stdout.startswith("usage: fabric-dra"), done.stderr


def test_the_testbed_package_holds_its_manifests_and_commands(tmp_path: Path) -> None:
    project = copy_project(TESTBED_DIR, TESTBED_PACKAGES, tmp_path / "testbed")
    wheel = build_wheel(project, tmp_path / "wheels")
    names = wheel_names(wheel)
    assert sorted(_source_files(TESTBED_DIR, TESTBED_PACKAGES) - names) == []
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == set(TESTBED_PACKAGES)
    with zipfile.ZipFile(wheel) as archive:
        for manifest in PACKAGED_MANIFESTS:  # the demo's, as files with deploy/'s content
            shipped = archive.read(f"fabric_dra_testbed/demo/manifests/{Path(manifest).name}")
            assert shipped == (REPO_ROOT / manifest).read_bytes(), manifest
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        commands = archive.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = archive.read(metadata).decode()
    assert "[fabric_dra.commands]" in commands
    assert "demo = fabric_dra_testbed.demo.cli:register" in commands
    assert "standin = kube_standin.cli:register_role" in commands
    # one version for both: the [testbed] extra of the product names the testbed of its own version
    product = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert f"Version: {product['version']}" in requires.splitlines()
    assert f"Requires-Dist: fabric-dra=={product['version']}" in requires.splitlines()
    assert product["optional-dependencies"]["testbed"] == [f"fabric-dra-testbed=={product['version']}"]
