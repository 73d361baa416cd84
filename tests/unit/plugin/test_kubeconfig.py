"""The plugin reads plain kubeconfigs without importing the `kubernetes` library (idle RSS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: test
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443/", certificate-authority: ca.crt}
contexts:
- name: test
  context: {cluster: c, user: u, namespace: fabric-dra}
- name: exec
  context: {cluster: c, user: plugin}
users:
- name: u
  user: {token: abc}
- name: plugin
  user:
    exec: {command: /bin/true, apiVersion: client.authentication.k8s.io/v1}
"""


def test_plain_kubeconfig_matches_the_library_without_importing_it(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    (tmp_path / "ca.crt").write_text("unused")
    probe = (
        "import sys\n"
        "from plumbing.kube.client import load_config\n"
        f"c = load_config({str(path)!r})\n"
        "print(c.server, c.ca_file, c.verify, c.token, c.namespace, 'kubernetes' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["https://127.0.0.1:6443", str(tmp_path / "ca.crt"), "True", "abc", "fabric-dra", "False"]

    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    assert (cfg.host, cfg.ssl_ca_cert, cfg.api_key["BearerToken"]) == (out[0], out[1], "Bearer abc")


def test_exec_plugins_still_go_through_the_library(tmp_path: Path) -> None:
    from plumbing.kube.client import _plain_kubeconfig

    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    assert _plain_kubeconfig(str(path), "exec") is None
    assert _plain_kubeconfig(str(path), "test") is not None
