"""Write a kubeconfig that points kubectl-style clients (and ``--kubeconfig`` of every role)
at an API server."""

from __future__ import annotations

from pathlib import Path

import yaml

from plumbing.fsutil import atomic_write

__all__ = ["kubeconfig_document", "write_kubeconfig"]


def kubeconfig_document(
    server: str,
    *,
    token: str | None = None,
    namespace: str = "default",
    ca_file: str | Path | None = None,
    name: str = "fabric-dra-test",
) -> dict[str, object]:
    cluster: dict[str, object] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority"] = str(ca_file)
    user: dict[str, object] = {"token": token} if token else {}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | Path,
    server: str,
    *,
    token: str | None = None,
    namespace: str = "default",
    ca_file: str | Path | None = None,
) -> Path:
    """Write the kubeconfig atomically (mode 0600: it may hold a token) and return its path."""
    target = Path(path)
    document = kubeconfig_document(server, token=token, namespace=namespace, ca_file=ca_file)
    atomic_write(target, yaml.safe_dump(document, sort_keys=False), mode=0o600, durable=False)
    return target
