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


def test_demo_verifies_the_articles_four_steps_and_the_sharing_in_both_flows(tmp_path: Path) -> None:
    result = run_demo("--workdir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    plain, _, binding = out.partition("== Pass 2")
    # pass 1: the article's four steps and the memory pool's two; pass 2: the GPU's partitions too
    assert [n for n in range(1, 9) if f"Step {n}/6" in plain] == list(range(1, 7)), plain
    assert [n for n in range(1, 9) if f"Step {n}/8" in binding] == list(range(1, 9)), binding
    assert out.count("-> ok") == 14
    assert "FAILED" not in out
    assert "fabric-dra.io/Attached=True" in out  # pass 2: bound before the pod was
    assert "device gone from sysfs, CDI spec removed" in out
    # partitions: one GPU, one binding, two pods, each its own partition; back whole afterwards
    assert "GPU partitions skipped" in plain and "GPU partitions skipped" not in binding
    assert "bound once, to" in binding and ", for both pods" in binding
    assert binding.count("container gets (CDI) only its partition") == 2
    assert "published whole again, for every node of its pool" in binding
    # memory: 64 GiB carved as one chunk of 65536 MiB, seen as a dax device, given back
    for text in (plain, binding):
        assert "of 64 GiB carved and connected" in text
        assert "of 65536 MiB made in" in text
        assert "dax device gone from sysfs, CDI spec removed" in text
        assert "MiB free again" in text
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
    assert "Step 1/6" in result.stdout
    assert "Step 2/6  FAILED: timed out after 5s waiting for the generated ResourceClaim to be allocated" in (
        result.stdout
    )
    assert "every process stopped" in result.stdout
    assert leftover_processes(workdir) == []


def test_demo_explains_a_missing_deploy_dir(tmp_path: Path) -> None:
    result = run_demo("--deploy-dir", str(tmp_path / "nowhere"), timeout=60)
    assert result.returncode == 2
    assert "run from a source checkout or pass --deploy-dir" in result.stdout
