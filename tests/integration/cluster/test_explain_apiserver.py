"""``fabric-dra explain --kubeconfig`` against the API test server."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import yaml

from plumbing import procs
from plumbing.kube import KubeClient
from plumbing.kube.resources import DEVICE_CLASSES, NODES, RESOURCE_SLICES
from tests.integration.cluster.conftest import DRIVER


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


def _claim(path: Path, count: int, device_class: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"gpus-{count}", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}
                        ],
                        "constraints": [{"matchAttribute": "fabric-dra.io/switch"}],
                    }
                },
            }
        )
    )
    return path


async def test_explain_against_the_api_server(kube: KubeClient, apiserver_url: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    device_class = f"fabric-gpu-{tag}"
    await kube.create(NODES, {"metadata": {"name": f"node-{tag}", "labels": {"fabric-dra.io/test": tag}}})
    await kube.create(
        DEVICE_CLASSES,
        {
            "metadata": {"name": device_class},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.attributes["fabric-dra.io"].type == "gpu"'}}]
            },
        },
    )
    gpus = [
        {
            "name": f"gpu-{i}",
            "attributes": {"type": {"string": "gpu"}, "switch": {"string": f"sw{i // 2 + 1}"}},
        }
        for i in range(4)
    ]
    await kube.create(
        RESOURCE_SLICES,
        {
            "metadata": {"name": f"fabric-pcie-{tag}"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": f"fabric-pcie-{tag}", "generation": 1, "resourceSliceCount": 1},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "fabric-dra.io/test", "operator": "In", "values": [tag]}
                            ]
                        }
                    ]
                },
                "devices": gpus,
            },
        },
    )
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", apiserver_url)
    try:

        def explain(count: int) -> subprocess.CompletedProcess[str]:
            claim = _claim(tmp_path / f"claim-{count}.yaml", count, device_class)
            return procs.run(
                [
                    "explain",
                    str(claim),
                    "--kubeconfig",
                    str(kubeconfig),
                    "--node",
                    f"node-{tag}",
                ],
                timeout=120,
            )

        two, three = await asyncio.gather(asyncio.to_thread(explain, 2), asyncio.to_thread(explain, 3))
        assert two.returncode == 0, two.stderr
        assert f"fits on 1 of 1 node(s): node-{tag}" in two.stdout
        assert f"allocated: fabric-pcie-{tag}/gpu-0, fabric-pcie-{tag}/gpu-1" in two.stdout
        assert three.returncode == 1, three.stderr
        assert "does NOT fit" in three.stdout
        expected = "needs 3 devices with equal fabric-dra.io/switch (requests: gpus); "
        assert expected + "switch sw1 has 2, switch sw2 has 2" in three.stdout
        assert "found 1 ResourceSlices" in three.stderr or "ResourceSlices (" in three.stderr
    finally:
        await kube.delete_ignore_missing(NODES, f"node-{tag}")
        await kube.delete_ignore_missing(RESOURCE_SLICES, f"fabric-pcie-{tag}")
        await kube.delete_ignore_missing(DEVICE_CLASSES, device_class)
