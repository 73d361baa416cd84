"""deploy/kind/e2e.sh's verdicts, checked without a cluster: the script is sourced (it then only
defines its functions), ``k`` (its kubectl) is replaced by a function that prints a fixture, and
each helper the assertions rest on is run against objects shaped exactly as the API server returns
them (the fixtures are validated with kubernetes-validate, strict) or as fabric-dra's own code
writes them (the plugin's CDI specs, the manager's `fabric-dra status -o json`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_driver.plugin.cdi import SpecDevice, build_specs, write_specs
from dra_driver.plugin.hostdev import HostDevice
from fabric.status import render_json
from manager_api import models as api
from tests.support.deploy import DEPLOY_DIR, DRIVER_NAME, KUBERNETES_VERSIONS

E2E_SCRIPT = DEPLOY_DIR / "kind" / "e2e.sh"
CLAIM_UID = "0f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b"


def run_helper(tmp_path: Path, fixture: Any, command: str) -> subprocess.CompletedProcess[str]:
    """Run `command` in a bash that sourced e2e.sh, with `k` printing `fixture` as JSON."""
    data = tmp_path / "fixture.json"
    data.write_text(json.dumps(fixture))
    return subprocess.run(
        [
            "/bin/bash",
            "-c",
            f'source "$1"; fixture="$2"; k() {{ cat "$fixture"; }}; {command}',
            "bash",
            str(E2E_SCRIPT),
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _valid(obj: dict[str, Any]) -> dict[str, Any]:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)
    return obj


def _slice(pool: str, devices: list[str], index: int = 0) -> dict[str, Any]:
    return _valid(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{DRIVER_NAME}-{pool}-{index}"},
            "spec": {
                "driver": DRIVER_NAME,
                "pool": {"name": pool, "generation": 3, "resourceSliceCount": 2},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": f"pool.{DRIVER_NAME}/{pool}", "operator": "In", "values": ["true"]}
                            ]
                        }
                    ]
                },
                "devices": [
                    {"name": d, "attributes": {f"{DRIVER_NAME}/type": {"string": "gpu"}}} for d in devices
                ],
            },
        }
    )


def _list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": f"{kind}List", "items": items}


def _claim(*, allocated: bool, binding_conditions: bool, attached: str | None) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "agent-inference-worker-7d9f-accelerator-claim-x2x9q",
            "namespace": "agent-platform",
            "uid": CLAIM_UID,
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": "dedicated-accelerator", "exactly": {"deviceClassName": "cohdi-pcie-device"}}
                ]
            }
        },
        "status": {},
    }
    if allocated:
        result: dict[str, Any] = {
            "request": "dedicated-accelerator",
            "driver": DRIVER_NAME,
            "pool": "fabric-pcie",
            "device": "gpu-0",
        }
        if binding_conditions:
            result["bindingConditions"] = [f"{DRIVER_NAME}/Attached"]
            result["bindingFailureConditions"] = [f"{DRIVER_NAME}/AttachFailed"]
        claim["status"]["allocation"] = {"devices": {"results": [result]}}
    if attached is not None:
        claim["status"]["devices"] = [
            {
                "driver": DRIVER_NAME,
                "pool": "fabric-pcie",
                "device": "gpu-0",
                "conditions": [
                    {
                        "type": f"{DRIVER_NAME}/Attached",
                        "status": attached,
                        "reason": "Attached" if attached == "True" else "Attaching",
                        "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            }
        ]
    return _valid(claim)


def test_pool_helpers(tmp_path: Path) -> None:
    slices = _list("ResourceSlice", [_slice("fabric-pcie", ["gpu-0", "gpu-1"]), _slice("fabric-cxl", [], 1)])
    assert run_helper(tmp_path, slices, "pool_has_devices").returncode == 0
    assert (
        run_helper(
            tmp_path, _list("ResourceSlice", [_slice("fabric-cxl", [])]), "pool_has_devices"
        ).returncode
        == 1
    )
    summary = run_helper(tmp_path, slices, "pool_summary")
    assert summary.stdout.strip() == "2 devices in 2 slices, pools ['fabric-cxl', 'fabric-pcie']"
    assert run_helper(tmp_path, slices, "pool_has_device fabric-pcie gpu-1").returncode == 0
    assert run_helper(tmp_path, slices, "pool_has_device fabric-cxl gpu-1").returncode == 1


def test_claim_helpers(tmp_path: Path) -> None:
    pending = _list("ResourceClaim", [_claim(allocated=False, binding_conditions=False, attached=None)])
    allocated = _list("ResourceClaim", [_claim(allocated=True, binding_conditions=False, attached=None)])
    assert run_helper(tmp_path, pending, "claim_is_allocated").returncode == 1
    assert run_helper(tmp_path, allocated, "claim_is_allocated").returncode == 0
    field = run_helper(
        tmp_path, allocated, """claim_field 'c["status"]["allocation"]["devices"]["results"][0]["device"]'"""
    )
    assert field.stdout.strip() == "gpu-0"
    two = _list("ResourceClaim", allocated["items"] * 2)
    refused = run_helper(tmp_path, two, "claim_json")
    assert refused.returncode == 1 and "expected one ResourceClaim" in refused.stderr
    assert run_helper(tmp_path, _list("ResourceClaim", []), "no_claims_left").returncode == 0
    assert run_helper(tmp_path, allocated, "no_claims_left").returncode == 1


def test_no_pods_left(tmp_path: Path) -> None:
    pod = _valid(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "agent-inference-worker-7d9f-x2x9q", "namespace": "agent-platform"},
            "spec": {"containers": [{"name": "agent-runner", "image": "agent-runner:latest"}]},
        }
    )
    assert run_helper(tmp_path, _list("Pod", [pod]), "no_pods_left").returncode == 1
    assert run_helper(tmp_path, _list("Pod", []), "no_pods_left").returncode == 0


@pytest.mark.parametrize(
    ("binding_conditions", "attached", "met"),
    [(True, "True", True), (True, "False", False), (True, None, False), (False, None, False)],
    ids=["attached", "attaching", "no-status-yet", "plain-allocation"],
)
def test_binding_conditions_met(
    tmp_path: Path, binding_conditions: bool, attached: str | None, met: bool
) -> None:
    claims = _list(
        "ResourceClaim", [_claim(allocated=True, binding_conditions=binding_conditions, attached=attached)]
    )
    assert (run_helper(tmp_path, claims, "binding_conditions_met").returncode == 0) == met


@pytest.mark.parametrize(
    ("ready", "updated", "leads"), [(1, 2, True), (0, 2, False), (2, 2, False), (1, 1, False)]
)
def test_manager_has_leader(tmp_path: Path, ready: int, updated: int, leads: bool) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "fabric-dra-manager", "namespace": "fabric-dra"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "m", "image": "i"}]},
            },
        },
        "status": {"replicas": 2, "updatedReplicas": updated, "readyReplicas": ready},
    }
    _valid(deployment)
    assert (run_helper(tmp_path, deployment, "manager_has_leader").returncode == 0) == leads


def test_cdi_edits_reads_what_the_plugin_writes(tmp_path: Path) -> None:
    host = tmp_path / "hosts" / "kind-worker" / "sys" / "bus" / "pci" / "devices"
    devices = [
        SpecDevice(
            claim_uid=CLAIM_UID,
            device="gpu-0",
            pool="fabric-pcie",
            type="gpu",
            request_names=("dedicated-accelerator",),
            model="NVIDIA H100 PCIe",
            serial="1652822000123",
            host=HostDevice(sysfs_path=str(host / "0000:41:00.0"), pci_address="0000:41:00.0"),
        ),
        SpecDevice(
            claim_uid=CLAIM_UID,
            device="nvme-3",
            pool="fabric-pcie",
            type="nvme",
            host=HostDevice(sysfs_path=str(host / "0000:42:00.0"), pci_address="0000:42:00.0"),
        ),
    ]
    cdi_root = tmp_path / "cdi"
    paths = write_specs(cdi_root, DRIVER_NAME, CLAIM_UID, build_specs(DRIVER_NAME, devices, real_host=False))
    assert len(paths) == 2
    # The same glob e2e.sh uses on the node.
    matched = sorted(cdi_root.glob(f"k8s.{DRIVER_NAME}-*_{CLAIM_UID}.json"))
    assert matched == sorted(paths)
    concatenated = tmp_path / "specs.json"
    concatenated.write_text("".join(p.read_text() for p in matched))
    result = subprocess.run(
        ["/bin/bash", "-c", 'source "$1"; cdi_edits "$2"', "bash", str(E2E_SCRIPT), str(concatenated)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    expected_env = [
        f"env {e}"
        for p in matched
        for d in json.loads(p.read_text())["devices"]
        for e in d["containerEdits"]["env"]
    ]
    assert [line for line in lines if line.startswith("env ")] == expected_env
    assert "env FABRIC_DRA_GPU_0_SERIAL=1652822000123" in lines
    assert sorted(line for line in lines if line.startswith("mount ")) == [
        "mount /run/fabric-dra/devices/gpu-0",
        "mount /run/fabric-dra/devices/nvme-3",
    ]


def _status_json(states: dict[str, tuple[str, str | None]]) -> str:
    """What `fabric-dra status -o json` prints for devices in the given (state, node)."""
    devices = [
        api.Device(
            name=name,
            pool="fabric-pcie",
            fabric="PCIe",
            type=api.DeviceType.GPU,
            state=api.BindingState(state),
            node=node,
            claim_uid=CLAIM_UID if node else None,
            binding_style="zone",
            redfish_uri=f"/redfish/v1/Fabrics/PCIe/Endpoints/{name}",
        )
        for name, (state, node) in states.items()
    ]
    inventory = api.Inventory(version=7, pools=[], devices=devices, nodes=[])
    return render_json(inventory, [])


@pytest.mark.parametrize(
    ("device", "answer"),
    [
        ("gpu-0", "bound kind-worker2"),
        ("gpu-1", "detaching kind-worker"),
        ("gpu-2", "free -"),
        ("gpu-9", "free -"),
    ],
)
def test_fabric_binding_reads_the_managers_status(tmp_path: Path, device: str, answer: str) -> None:
    status = tmp_path / "status.json"
    status.write_text(
        _status_json(
            {
                "gpu-0": ("bound", "kind-worker2"),
                "gpu-1": ("detaching", "kind-worker"),
                "gpu-2": ("free", None),
            }
        )
    )
    script = 'source "$1"; status="$2"; fabric_status_json() { cat "$status"; }; fabric_binding "$3"'
    result = subprocess.run(
        ["/bin/bash", "-c", script, "bash", str(E2E_SCRIPT), str(status), device],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == answer
