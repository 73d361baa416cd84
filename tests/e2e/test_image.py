"""`make image` with a real Docker engine: the image it builds carries the references
`make print-image` names (the ones the manifests and e2e.sh use), the version and revision labels,
the unprivileged user, and a `fabric-dra` that starts on a read-only root filesystem, as every
Deployment runs it.

Needs a Docker engine that can pull the Dockerfile's pinned base image; tests/conftest.py skips it
with the reason elsewhere. Without Docker, tests/unit/deploy checks the same build offline
(test_image.py: the build context makes the whole package) and by dry run (test_production.py:
`make -n image` tags exactly the printed references).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.deploy import REPO_ROOT, make_image_refs, run_make

#: A registry name of the test's own, so the build never replaces an image the developer has
#: under the release names.
VARIABLES = ("REGISTRY=localhost/fabric-dra-test",)


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def built() -> Iterator[list[str]]:
    refs = make_image_refs(*VARIABLES)
    result = run_make("image", *VARIABLES, check=False, timeout=1800)
    try:
        assert result.returncode == 0, f"make image failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        yield refs
    finally:
        _docker("image", "rm", "--force", *refs)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_make_image_builds_the_printed_references(built: list[str]) -> None:
    version = re.search(r'^version = "(.+)"$', (REPO_ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version
    release, build = built
    assert release == f"localhost/fabric-dra-test/fabric-dra:{version.group(1)}"
    revision = build.rsplit(":", 1)[1].removeprefix(f"{version.group(1)}-g")
    ids = set()
    for ref in built:
        inspected = _docker("image", "inspect", ref)
        assert inspected.returncode == 0, f"{ref} was not tagged: {inspected.stderr}"
        (image,) = json.loads(inspected.stdout)
        ids.add(image["Id"])
        config = image["Config"]
        assert config["User"] == "65532:65532"
        assert config["Entrypoint"] == ["fabric-dra"]
        assert config["Labels"]["org.opencontainers.image.version"] == version.group(1)
        assert config["Labels"]["org.opencontainers.image.revision"] == revision
    assert len(ids) == 1, "both tags name one build"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_image_runs_every_role_on_a_read_only_root(built: list[str]) -> None:
    release = built[0]
    shown = _docker("run", "--rm", "--read-only", "--network", "none", release, "--version")
    assert shown.returncode == 0, shown.stderr
    version = re.search(r'^version = "(.+)"$', (REPO_ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version and version.group(1) in shown.stdout
    for role in (["emulator", "serve"], ["manager", "serve"], ["controller"], ["plugin"]):
        # Each role's parser, imported from the installed package as the pod would run it.
        helped = _docker("run", "--rm", "--read-only", "--network", "none", release, *role, "--help")
        assert helped.returncode == 0, (role, helped.stderr)
        assert "usage:" in helped.stdout, role
