"""`fabric-dra demo` is the README's main job: it must pass from a clean checkout, and fail loudly
(exit 1, a line saying which step and why, nothing left running) when a step does not hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow(seconds=34)


def run_demo(*args: str, timeout: float = 170) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric_dra", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def leftover_processes(workdir: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in ps.stdout.splitlines() if str(workdir) in line and "pytest" not in line]


def test_demo_verifies_the_articles_four_steps_in_both_flows(tmp_path: Path) -> None:
    result = run_demo("--workdir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    for number in range(1, 5):
        assert out.count(f"Step {number}/4") == 2, out
    assert out.count("-> ok") == 8
    assert "FAILED" not in out
    assert "fabric-dra.io/Attached=True" in out  # pass 2: bound before the pod was
    assert "device gone from sysfs, CDI spec removed" in out
    assert "All steps verified" in out
    assert leftover_processes(tmp_path) == []


def test_demo_fails_with_the_step_and_the_reason(tmp_path: Path) -> None:
    manifest = tmp_path / "impossible.yaml"
    manifest.write_text(
        """apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: cohdi-accelerator-template, namespace: agent-platform}
spec:
  spec:
    devices:
      requests:
      - name: dedicated-accelerator
        exactly:
          deviceClassName: cohdi-pcie-device
          selectors:
          - cel: {expression: 'device.attributes["fabric-dra.io"].model == "no-such-model"'}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: agent-inference-worker, namespace: agent-platform}
spec:
  selector: {matchLabels: {app: agent-inference-worker}}
  template:
    metadata: {labels: {app: agent-inference-worker}}
    spec:
      containers:
      - name: agent-runner
        image: agent-runner:latest
        resources: {claims: [{name: accelerator-claim}]}
      resourceClaims:
      - {name: accelerator-claim, resourceClaimTemplateName: cohdi-accelerator-template}
"""
    )
    workdir = tmp_path / "work"
    result = run_demo(
        "--workdir",
        str(workdir),
        "--manifest",
        str(manifest),
        "--no-binding-conditions",
        "--step-timeout",
        "5",
    )
    assert result.returncode == 1, result.stdout
    assert "Step 1/4" in result.stdout
    assert "Step 2/4  FAILED: timed out after 5s waiting for the generated ResourceClaim to be allocated" in (
        result.stdout
    )
    assert "every process stopped" in result.stdout
    assert leftover_processes(workdir) == []


def test_demo_explains_a_missing_deploy_dir(tmp_path: Path) -> None:
    result = run_demo("--deploy-dir", str(tmp_path / "nowhere"), timeout=60)
    assert result.returncode == 2
    assert "run from a source checkout or pass --deploy-dir" in result.stdout
