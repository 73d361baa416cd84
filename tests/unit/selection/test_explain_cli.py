"""``fabric-dra explain`` offline: files in, verdict and exit status out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabric_dra.cli import main

GPU_CLASS = 'device.driver == "fabric-dra.io" && device.attributes["fabric-dra.io"].type == "gpu"'


def _gpu(name: str, switch: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "switch": {"string": switch}}}


@pytest.fixture
def cluster_files(tmp_path: Path) -> tuple[Path, Path]:
    slices = tmp_path / "slices.yaml"
    slices.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": "fabric-pcie-0"},
                        "spec": {
                            "driver": "fabric-dra.io",
                            "pool": {"name": "fabric-pcie", "generation": 1, "resourceSliceCount": 1},
                            "allNodes": True,
                            "devices": [_gpu("gpu-0", "sw1"), _gpu("gpu-1", "sw1"), _gpu("gpu-2", "sw2")],
                        },
                    }
                ],
            }
        )
    )
    classes = tmp_path / "classes.yaml"
    classes.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "fabric-gpu"},
                "spec": {"selectors": [{"cel": {"expression": GPU_CLASS}}]},
            }
        )
    )
    return slices, classes


def _claim(tmp_path: Path, count: int, api: str = "resource.k8s.io/v1") -> Path:
    request: dict[str, Any] = {"name": "gpus"}
    if api.endswith("/v1"):
        request["exactly"] = {"deviceClassName": "fabric-gpu", "count": count}
    else:
        request.update({"deviceClassName": "fabric-gpu", "count": count})
    path = tmp_path / f"claim-{count}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": api,
                "kind": "ResourceClaim",
                "metadata": {"name": f"gpus-{count}", "namespace": "team"},
                "spec": {
                    "devices": {
                        "requests": [request],
                        "constraints": [{"matchAttribute": "fabric-dra.io/switch"}],
                    }
                },
            }
        )
    )
    return path


def test_two_on_one_switch_fits(
    tmp_path: Path, cluster_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    slices, classes = cluster_files
    code = main(["explain", str(_claim(tmp_path, 2)), "--slices", str(slices), "--classes", str(classes)])
    out = capsys.readouterr().out
    assert code == 0
    assert "ResourceClaim team/gpus-2: fits on 1 of 1 node(s)" in out
    assert "allocated: fabric-pcie/gpu-0, fabric-pcie/gpu-1" in out


def test_three_on_two_gpu_switches_does_not(
    tmp_path: Path, cluster_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    slices, classes = cluster_files
    code = main(["explain", str(_claim(tmp_path, 3)), "--slices", str(slices), "--classes", str(classes)])
    out = capsys.readouterr().out
    assert code == 1
    assert "does NOT fit" in out
    assert (
        "needs 3 devices with equal fabric-dra.io/switch (requests: gpus); switch sw1 has 2, switch sw2 has 1"
        in out
    )


def test_v1beta1_claim_and_json_output(
    tmp_path: Path, cluster_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    slices, classes = cluster_files
    claim = _claim(tmp_path, 2, api="resource.k8s.io/v1beta1")
    code = main(["explain", str(claim), "--slices", str(slices), "--classes", str(classes), "-o", "json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    (workload,) = document["workloads"]
    assert workload["satisfiable_on"] == ["<any node>"]
    (report,) = workload["nodes"]
    results = report["allocations"][0]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "kind: ResourceClaim\napiVersion: v1\nmetadata: {name: x}\n",
            "apiVersion v1 is not resource.k8s.io/*",
        ),
        ("a: [unclosed\n", "not valid YAML"),
        (
            "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: {name: x}\n"
            "spec: {devices: {requests: [{name: r, exactly: {count: many}}]}}\n",
            "ResourceClaim x: spec.devices.requests.0.exactly.count",
        ),
        (
            "kind: Pod\napiVersion: v1\nmetadata: {name: p}\nspec:\n  resourceClaims: [{name: c, "
            "resourceClaimTemplateName: missing}]\n  containers: []\n",
            "uses ResourceClaimTemplate missing, which is not in",
        ),
        (
            "kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n",
            "no ResourceClaim, ResourceClaimTemplate or workload",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    cluster_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    content: str,
    message: str,
) -> None:
    slices, classes = cluster_files
    path = tmp_path / "in.yaml"
    path.write_text(content)
    code = main(["explain", str(path), "--slices", str(slices), "--classes", str(classes)])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--kubeconfig",
        "--slices",
        "--classes",
        "--nodes",
        "--claims",
        "--node",
        "--output",
        "--all-devices",
    ):
        assert flag in out


def test_an_unknown_device_class_is_bad_input_naming_the_known_ones(
    tmp_path: Path, cluster_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    slices, classes = cluster_files
    claim = yaml.safe_load(_claim(tmp_path, 1).read_text())
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "fabric-gpus"
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(claim))
    code = main(["explain", str(path), "--slices", str(slices), "--classes", str(classes)])
    err = capsys.readouterr().err
    assert code == 2
    assert "DeviceClass 'fabric-gpus' is not known; known DeviceClasses: fabric-gpu" in err
    assert len(err.strip().splitlines()) == 1


def test_the_best_fitting_node_comes_first(
    tmp_path: Path, cluster_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """node-a is first in the files but has one GPU; node-b has three: node-b is listed and
    detailed first."""
    _, classes = cluster_files
    slices = tmp_path / "per-node.yaml"
    slices.write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"slice-{node}"},
                    "spec": {
                        "driver": "fabric-dra.io",
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "nodeName": node,
                        "devices": [_gpu(f"gpu-{node}-{i}", "sw1") for i in range(count)],
                    },
                }
                for node, count in (("node-a", 1), ("node-b", 3))
            ]
        )
    )
    code = main(["explain", str(_claim(tmp_path, 1)), "--slices", str(slices), "--classes", str(classes)])
    out = capsys.readouterr().out
    assert code == 0
    nodes = out.split("nodes:\n")[1].splitlines()
    assert nodes[0].startswith("  fits    node-b") and nodes[1].startswith("  fits    node-a")
    assert "devices, as seen from node node-b:" in out


def test_relative_paths_are_read_from_the_working_directory(
    tmp_path: Path,
    cluster_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slices, classes = cluster_files
    claim = _claim(tmp_path, 2)
    monkeypatch.chdir(tmp_path)
    code = main(["explain", claim.name, "--slices", slices.name, "--classes", classes.name])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("output", ["table", "wide", "yaml", "json"])
def test_attribute_values_from_the_cluster_reach_the_terminal_as_text(
    tmp_path: Path, cluster_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], output: str
) -> None:
    """A slice's string attribute is whatever the fabric named (the controller cuts it to 64 bytes,
    Kubernetes checks nothing else): its escapes, CR/LF and bidi controls are shown, not acted on."""
    from plumbing.terminal import has_unsafe

    slices, classes = cluster_files
    hostile = "sw\x1b]0;owned\x07\r\nFORGED\u202e1"
    document = yaml.safe_load(slices.read_text())
    for device in document["items"][0]["spec"]["devices"][:2]:
        device["attributes"]["switch"] = {"string": hostile}
    slices.write_text(yaml.safe_dump(document))
    code = main(
        [
            "explain",
            str(_claim(tmp_path, 3)),
            "--slices",
            str(slices),
            "--classes",
            str(classes),
            "-o",
            output,
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert not has_unsafe(out.replace("\n", "")), out
    assert not any(line.lstrip().startswith("FORGED") for line in out.splitlines()), out
    if output in ("table", "wide"):
        assert "switch sw\\x1b]0;owned\\x07\\r\\nFORGED\\u202e1 has 2" in out, out


def _documents(path: Path, *documents: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(list(documents)))
    return path


def _allocated_claim(namespace: str, name: str, *results: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "fabric-any"}}]}},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


ANY_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "fabric-any"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "fabric-dra.io"'}}]},
}


def test_counter_exhaustion_is_explained_naming_the_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = {"name": "node-a-gpus", "generation": 1, "resourceSliceCount": 2}
    counters = {"memory-slice-2": {"value": "1"}, "memory-slice-3": {"value": "1"}}

    def placement(name: str, *slices_used: int) -> dict[str, Any]:
        used = {f"memory-slice-{i}": {"value": "1"} for i in slices_used}
        return {"name": name, "consumesCounters": [{"counterSet": "gpu-3", "counters": used}]}

    slices = _documents(
        tmp_path / "slices.yaml",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "gpu-3-counters"},
            "spec": {
                "driver": "fabric-dra.io",
                "pool": pool,
                "nodeName": "node-a",
                "sharedCounters": [{"name": "gpu-3", "counters": counters}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "gpu-3-devices"},
            "spec": {
                "driver": "fabric-dra.io",
                "pool": pool,
                "nodeName": "node-a",
                "devices": [placement("gpu-3-mig-1g10gb-19-2", 2), placement("gpu-3-mig-2g20gb-14-2", 2, 3)],
            },
        },
    )
    held = _allocated_claim(
        "team-a",
        "trainer",
        {"request": "r", "driver": "fabric-dra.io", "pool": "node-a-gpus", "device": "gpu-3-mig-1g10gb-19-2"},
    )
    claims = _documents(tmp_path / "claims.yaml", held)
    classes = _documents(tmp_path / "classes.yaml", ANY_CLASS)
    wanted = _documents(
        tmp_path / "claim.yaml",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "notebook", "namespace": "team-b"},
            "spec": {
                "devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "fabric-any"}}]}
            },
        },
    )
    code = main(
        ["explain", str(wanted), "--slices", str(slices), "--classes", str(classes), "--claims", str(claims)]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "    counters (1): gpu-3: memory-slice-2 in use by claim team-a/trainer\n"
        "      node-a-gpus/gpu-3-mig-2g20gb-14-2"
    ) in out
    assert "    allocated (1): allocated to claim team-a/trainer" in out


def test_capacity_misfit_is_explained_naming_the_shares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    device = {
        "name": "cxl-pool-1",
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "256Gi",
                "requestPolicy": {"default": "64Gi", "validRange": {"min": "64Gi", "step": "32Gi"}},
            }
        },
    }
    slices = _documents(
        tmp_path / "slices.yaml",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "cxl"},
            "spec": {
                "driver": "fabric-dra.io",
                "pool": {"name": "cxl", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [device],
            },
        },
    )

    def share(share_id: str, amount: str) -> dict[str, Any]:
        return {
            "request": "r",
            "driver": "fabric-dra.io",
            "pool": "cxl",
            "device": "cxl-pool-1",
            "shareID": share_id,
            "consumedCapacity": {"memory": amount},
        }

    claims = _documents(
        tmp_path / "claims.yaml",
        _allocated_claim("team-a", "db", share("8d3f5b7e-2c4a-4e6b-9f1d-0a2b3c4d5e6f", "64Gi")),
        _allocated_claim("team-b", "cache", share("1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", "116Gi")),
    )
    classes = _documents(tmp_path / "classes.yaml", ANY_CLASS)
    request = {
        "name": "mem",
        "exactly": {"deviceClassName": "fabric-any", "capacity": {"requests": {"memory": "96Gi"}}},
    }
    wanted = _documents(
        tmp_path / "claim.yaml",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "analytics", "namespace": "team-c"},
            "spec": {"devices": {"requests": [request]}},
        },
    )
    code = main(
        ["explain", str(wanted), "--slices", str(slices), "--classes", str(classes), "--claims", str(claims)]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "    capacity (1): cxl-pool-1: 180 GiB of 256 GiB in use; 96 GiB asked "
        "(held by claims team-a/db 64 GiB, team-b/cache 116 GiB)\n      cxl/cxl-pool-1"
    ) in out
