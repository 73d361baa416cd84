"""kubectl against the API test server: the article's manifest applies as written for
v1beta1 clusters, kubectl get prints the server's columns, and validation errors reach the user."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from plumbing.kube.resources import NAMESPACES
from tests.support.apiserver import BETA_APIS, ApiServerProcess, start_apiserver
from tests.unit.kube_standin.objects import resource_slice

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")

ARTICLE_MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata:
  name: agent-platform
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata:
  name: cohdi-accelerator-template
  namespace: agent-platform
spec:
  spec:
    devices:
      requests:
        - name: dedicated-accelerator
          deviceClassName: cohdi-pcie-device
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: agent-inference-worker
  namespace: agent-platform
spec:
  selector:
    matchLabels:
      app: agent-inference-worker
  template:
    metadata:
      labels:
        app: agent-inference-worker
    spec:
      containers:
        - name: agent-runner
          image: agent-runner:latest
          command: ["/bin/sh", "-c", "tail -f /dev/null"]
          resources:
            claims:
              - name: accelerator-claim
      resourceClaims:
        - name: accelerator-claim
          resourceClaimTemplateName: cohdi-accelerator-template
"""


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    # kubectl (client-go) sends a kubeconfig's token only over TLS.
    with start_apiserver(tmp_path_factory.mktemp("tls-apiserver"), tls=True, extra_args=BETA_APIS) as server:
        yield server


def kubectl(
    server: ApiServerProcess, tmp_path: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(server.kubeconfig), "--cache-dir", str(tmp_path / "cache"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_article_manifest_applies_and_scales(tls_server: ApiServerProcess, tmp_path: Path) -> None:
    apiserver = tls_server
    applied = kubectl(apiserver, tmp_path, "apply", "-f", "-", stdin=ARTICLE_MANIFEST)
    assert applied.returncode == 0, applied.stderr
    assert "resourceclaimtemplate.resource.k8s.io/cohdi-accelerator-template created" in applied.stdout
    template = kubectl(
        apiserver,
        tmp_path,
        "get",
        "resourceclaimtemplates.v1.resource.k8s.io",
        "-n",
        "agent-platform",
        "cohdi-accelerator-template",
        "-o",
        "json",
    )
    requests = json.loads(template.stdout)["spec"]["spec"]["devices"]["requests"]
    assert requests[0]["exactly"]["deviceClassName"] == "cohdi-pcie-device"
    scaled = kubectl(
        apiserver,
        tmp_path,
        "scale",
        "deployment",
        "agent-inference-worker",
        "--replicas=0",
        "-n",
        "agent-platform",
    )
    assert scaled.returncode == 0, scaled.stderr
    replicas = kubectl(
        apiserver,
        tmp_path,
        "get",
        "deployment",
        "agent-inference-worker",
        "-n",
        "agent-platform",
        "-o",
        "jsonpath={.spec.replicas}",
    )
    assert replicas.stdout == "0"


def test_get_prints_the_servers_columns_and_create_reports_the_bad_field(
    tls_server: ApiServerProcess, tmp_path: Path
) -> None:
    apiserver = tls_server
    created = kubectl(
        apiserver, tmp_path, "create", "-f", "-", stdin=json.dumps(resource_slice("pool-0", devices=2))
    )
    assert created.returncode == 0, created.stderr
    listed = kubectl(apiserver, tmp_path, "get", "resourceslices")
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert row.split()[:3] == ["pool-0", "fabric-dra.io", "fabric-pcie"]
    bad = resource_slice("pool-1", devices=2)
    bad["spec"]["devices"][1]["attributes"]["fabric-dra.io/model"] = {"str": "H100"}
    rejected = kubectl(apiserver, tmp_path, "create", "-f", "-", stdin=json.dumps(bad))
    assert rejected.returncode != 0
    assert "spec.devices[1].attributes[fabric-dra.io/model].str: unknown field" in rejected.stderr


async def test_the_shared_client_and_hooks_speak_tls_too(tls_server: ApiServerProcess) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    async with tls_server.client() as kube:
        assert (await kube.get(NAMESPACES, "default"))["status"]["phase"] == "Active"
    assert "namespaces" in tls_server.hooks.requests()["requests"]


BAD_BUDGET = """\
apiVersion: fabric-dra.io/v1alpha1
kind: DeviceBudget
metadata:
  name: bad-budget
  namespace: default
spec:
  tree:
    label:
      key: agents.example.com/tree
  limits:
    gpuMemory: 12XB
"""


def test_kubectl_applies_the_budget_crd_and_examples_and_reports_a_bad_budget(
    tls_server: ApiServerProcess, tmp_path: Path
) -> None:
    deploy = Path(__file__).resolve().parents[3] / "deploy"
    crd = kubectl(tls_server, tmp_path, "apply", "-f", str(deploy / "base" / "devicebudget-crd.yaml"))
    assert crd.returncode == 0, crd.stderr
    assert "customresourcedefinition.apiextensions.k8s.io/devicebudgets.fabric-dra.io created" in crd.stdout
    examples = kubectl(tls_server, tmp_path, "apply", "-f", str(deploy / "kind" / "budget-example.yaml"))
    assert examples.returncode == 0, examples.stderr
    assert "devicebudget.fabric-dra.io/task-847 created" in examples.stdout
    listed = kubectl(tls_server, tmp_path, "get", "devbudget", "-n", "default")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TREE-LABEL", "TREE-OWNER", "ENFORCEMENT", "READY", "AGE"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    # An empty cell (a path that finds nothing) prints as nothing, as for a real CRD.
    assert rows["every-agent-tree"][:2] == ["agents.example.com/tree", "Enforce"]
    assert rows["per-job-week"][:2] == ["Job", "Warn"]
    # kubectl validates strictly by default: an unknown field is the server's strict decoding error.
    unknown = kubectl(tls_server, tmp_path, "apply", "-f", "-", stdin=BAD_BUDGET + "  color: red\n")
    assert unknown.returncode != 0
    assert 'strict decoding error: unknown field "spec.color"' in unknown.stderr
    rejected = kubectl(tls_server, tmp_path, "apply", "-f", "-", stdin=BAD_BUDGET)
    assert rejected.returncode != 0
    assert (
        'spec.limits.gpuMemory: Invalid value: "12XB": must be a positive quantity, e.g. 160Gi'
        in rejected.stderr
    )
