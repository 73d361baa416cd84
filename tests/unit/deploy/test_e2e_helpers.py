"""deploy/kind/e2e.sh's verdicts, checked without a cluster: the script is sourced (it then only
defines its functions), ``k`` (its kubectl) is replaced by a function that prints a fixture, and
each helper the assertions rest on is run against objects shaped exactly as the API server returns
them (the fixtures are validated with kubernetes-validate, strict) or as fabric-dra's own code
writes them (the plugin's CDI specs, the manager's `fabric-dra status -o json`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_driver.controller.resourcenames import pool_label_key
from dra_driver.plugin.cdi import SpecDevice, build_specs, write_specs
from dra_driver.plugin.hostdev import HostDevice
from fabric.commands.status import render_json
from manager_api import models as api
from tests.support.deploy import DEPLOY_DIR, DRIVER_NAME, KUBERNETES_VERSIONS, REPO_ROOT, make_image_refs

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
                                {
                                    "key": pool_label_key(DRIVER_NAME, pool),
                                    "operator": "In",
                                    "values": ["true"],
                                }
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


# --- versions, image loading and the node image ---------------------------------------------


def _source_and_run(
    command: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", "-c", f'source "$1"; shift; {command}', "bash", str(E2E_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("kind v0.32.0 go1.26.3 linux/amd64", "0.32.0"),
        ("kind v0.30.0 go1.24.6 darwin/arm64", "0.30.0"),
        ("kind v0.33.0-alpha+1a2b3c4d go1.26.5 linux/amd64", "0.33.0-alpha"),
        ("kind v0.32.0-alpha.1 go1.26.1 linux/amd64", "0.32.0-alpha.1"),
        ("containerd github.com/containerd/containerd/v2 v2.3.1 8a9d0e4c1b2f", "2.3.1"),
        ("containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", "1.7.27"),
        ("containerd github.com/containerd/containerd/v2 v2.2.0-rc.1 abc", "2.2.0-rc.1"),
        ("kind version unknown", None),
        ("go1.26.3", None),
    ],
)
def test_version_of(text: str, version: str | None) -> None:
    result = _source_and_run('version_of "$1"', text)
    if version is None:
        assert result.returncode == 1 and result.stdout == ""
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == version


@pytest.mark.parametrize(
    ("have", "want", "holds"),
    [
        ("0.32.0", "0.32.0", True),
        ("0.32.1", "0.32.0", True),
        ("0.31.9", "0.32.0", False),
        ("1.0.0", "0.32.0", True),
        ("0.32.0-alpha", "0.32.0", False),  # a build from before the release
        ("0.33.0-alpha", "0.32.0", True),
        ("0.30.0", "0.30.0", True),
        ("0.29.0", "0.30.0", False),
        ("2.10.0", "2.3.0", True),  # numbers, not strings
    ],
)
def test_version_at_least(have: str, want: str, holds: bool) -> None:
    assert (_source_and_run('version_at_least "$1" "$2"', have, want).returncode == 0) == holds


@pytest.mark.parametrize(
    ("setting", "kind", "containerd", "method"),
    [
        ("auto", "0.32.0", "2.3.1", "kind"),  # kind v0.32 loads into containerd 2.3 nodes
        ("auto", "0.31.0", "2.3.1", "ctr"),  # an older kind cannot: import with ctr in the node
        ("auto", "0.32.0-alpha", "2.3.0", "ctr"),
        ("auto", "0.30.0", "2.1.4", "kind"),  # node images of its own era
        ("auto", "0.31.0", "2.2.0", "kind"),
        ("auto", "0.33.0", "2.4.0", "kind"),
        ("ctr", "0.33.0", "2.4.0", "ctr"),  # forced (e.g. Docker's containerd image store)
        ("kind", "0.30.0", "2.3.1", "kind"),
    ],
)
def test_image_load_method(setting: str, kind: str, containerd: str, method: str) -> None:
    result = _source_and_run('image_load_method "$1" "$2" "$3"', setting, kind, containerd)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == method


def test_image_load_method_refuses_an_unknown_setting() -> None:
    result = _source_and_run('image_load_method "$1" 0.32.0 2.3.1', "podman")
    assert result.returncode == 1
    assert "FABRIC_DRA_E2E_IMAGE_LOAD must be auto, kind or ctr, not 'podman'" in result.stderr


def _stub_bin(tmp_path: Path, tools: dict[str, str]) -> tuple[Path, Path]:
    """A directory of stub commands that each append their command line to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.log"
    for name, body in tools.items():
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >>"{calls}"\n{body}\n')
        stub.chmod(0o755)
    return bin_dir, calls


_KIND_NODES = 'if [ "$1" = get ] && [ "$2" = nodes ]; then echo kind-control-plane; echo kind-worker; fi'


@pytest.mark.parametrize(
    ("kind_version", "containerd", "expected"),
    [
        ("v0.32.0", "v2.3.1", "kind"),
        ("v0.31.0", "v2.3.1", "ctr"),
        ("v0.30.0", "v2.1.4", "kind"),
    ],
)
def test_load_image_uses_the_chosen_method_in_every_node(
    tmp_path: Path, kind_version: str, containerd: str, expected: str
) -> None:
    bin_dir, calls = _stub_bin(
        tmp_path,
        {
            "kind": f'[ "$1" = version ] && echo "kind {kind_version} go1.26.3 linux/amd64"\n'
            f"{_KIND_NODES}\nexit 0",
            "docker": '[ "$1" = exec ] && [ "$3" = containerd ] && '
            f'echo "containerd github.com/containerd/containerd/v2 {containerd} abc"\n'
            '[ "$1" = save ] && echo image-archive\n'
            '[ "$1" = exec ] && [ "$2" = --privileged ] && cat >/dev/null\nexit 0',
            "timeout": 'shift; exec "$@"',
        },
    )
    result = _source_and_run(
        'load_image "$1"', "fabric-dra:kind", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    )
    assert result.returncode == 0, result.stderr
    log = calls.read_text().splitlines()
    if expected == "kind":
        assert "kind load docker-image fabric-dra:kind --name kind" in log
        assert not [line for line in log if "images import" in line]
    else:
        imports = [line for line in log if "images import" in line and line.startswith("docker ")]
        assert imports == [
            f"docker exec --privileged -i {node} ctr --namespace=k8s.io images import --digests "
            "--snapshotter=overlayfs -"
            for node in ("kind-control-plane", "kind-worker")
        ]
        assert log.count("docker save fabric-dra:kind") == 2
        assert not [line for line in log if line.startswith("kind load")]


#: `containerd config dump` of a containerd 2.x node (config version 3), abridged to the tables
#: that matter, and of a containerd 1.7 node (version 2).
_DUMP_V3 = """
version = 3
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '/etc/containerd/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
"""
_DUMP_V2 = """
version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    enable_cdi = true
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/certs.d"
"""


@pytest.mark.parametrize(
    ("dump", "problem"),
    [
        (_DUMP_V3, None),
        (_DUMP_V2, None),
        (_DUMP_V3.replace("enable_cdi = true", "enable_cdi = false"), "CDI is off (enable_cdi)"),
        (
            _DUMP_V2.replace('config_path = "/etc/containerd/certs.d"', 'config_path = ""'),
            "registry config_path",
        ),
        ("this is = not [toml", "containerd config dump printed no valid TOML"),
    ],
    ids=["v3", "v2", "cdi-off", "no-certs-d", "not-toml"],
)
def test_containerd_config_ok(tmp_path: Path, dump: str, problem: str | None) -> None:
    data = tmp_path / "dump.toml"
    data.write_text(dump)
    result = _source_and_run('containerd_config_ok <"$1"', str(data))
    if problem is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1 and problem in result.stderr


def test_make_image_tags_the_image_the_kind_overlay_deploys() -> None:
    """e2e.sh builds with `make image` and the variables it names; the tags `make print-image`
    reports for them include the kind overlay's image (the same check e2e.sh makes at run time)."""
    result = _source_and_run(
        'make -C "$1" --no-print-directory -s print-image "${MAKE_IMAGE_VARS[@]}"; echo "$IMAGE"',
        str(REPO_ROOT),
    )
    assert result.returncode == 0, result.stderr
    *tags, image = result.stdout.split()
    assert image == "fabric-dra:kind"
    assert image in tags


def _run_until_cluster_create(
    tmp_path: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """e2e.sh from the start with stub tools; `kind create cluster` fails, so it stops there and
    cleans up. Returns the run and the stubs' command lines in order."""
    bin_dir, calls = _stub_bin(
        tmp_path,
        {
            "kind": '[ "$1" = version ] && echo "kind v0.32.0 go1.26.3 linux/amd64"\n'
            '[ "$1" = create ] && exit 1\nexit 0',
            # No registry container is left over; every other docker command succeeds.
            "docker": '[ "$1" = container ] && exit 1\nexit 0',
            "kubectl": "exit 0",
            "make": "exit 0",
            "timeout": 'shift; exec "$@"',
        },
    )
    for name in ("date", "dirname", "sed", "grep", "mktemp", "rm", "mkdir", "head", "tail"):
        real = shutil.which(name)
        assert real, name
        (bin_dir / name).symlink_to(real)
    (bin_dir / "python3").symlink_to(sys.executable)
    result = subprocess.run(
        ["/bin/bash", str(E2E_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **env},
    )
    return result, calls.read_text().splitlines()


def _created_with_image(calls: list[str]) -> str:
    (create,) = [c for c in calls if c.startswith("kind create cluster")]
    words = create.split()
    return words[words.index("--image") + 1]


def test_the_node_image_defaults_to_kubernetes_1_36_and_can_be_overridden(tmp_path: Path) -> None:
    default_run, default_calls = _run_until_cluster_create(tmp_path / "default", {})
    assert default_run.returncode == 1
    image = _created_with_image(default_calls)
    assert re.fullmatch(r"kindest/node:v1\.36\.\d+@sha256:[0-9a-f]{64}", image), image
    override = "kindest/node:v1.35.4@sha256:" + "ab" * 32
    custom_run, custom_calls = _run_until_cluster_create(
        tmp_path / "custom", {"FABRIC_DRA_E2E_NODE_IMAGE": override}
    )
    assert custom_run.returncode == 1
    assert _created_with_image(custom_calls) == override


def test_the_shared_directory_is_emptied_only_after_the_cluster_is_gone(tmp_path: Path) -> None:
    run, calls = _run_until_cluster_create(tmp_path, {})
    assert run.returncode == 1
    deleted = next(i for i, c in enumerate(calls) if c.startswith("kind delete cluster"))
    emptied = [i for i, c in enumerate(calls) if c.startswith("docker run") and "rm -rf /shared/*" in c]
    assert emptied, calls
    assert all(i > deleted for i in emptied)
    # Nothing reaches into a node to delete files while it runs.
    assert not [c for c in calls if c.startswith("docker exec") and "rm -rf" in c]
    assert not list(tmp_path.glob("fabric-dra-e2e.*")), "the work directory is removed"


def test_build_images_runs_make_image_and_loads_what_it_tagged(tmp_path: Path) -> None:
    """build_images with the real make and stub docker/kind: `make image` builds the repository's
    Dockerfile with the kind overlay's tag, and that tag is what gets loaded into the nodes."""
    bin_dir, calls = _stub_bin(
        tmp_path,
        {
            "kind": f'[ "$1" = version ] && echo "kind v0.32.0 go1.26.3 linux/amd64"\n{_KIND_NODES}\nexit 0',
            "docker": '[ "$1" = exec ] && [ "$3" = containerd ] && '
            'echo "containerd github.com/containerd/containerd/v2 v2.3.1 abc"\nexit 0',
            "timeout": 'shift; exec "$@"',
        },
    )
    result = _source_and_run("build_images", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    log = calls.read_text().splitlines()
    builds = [line.split() for line in log if line.startswith("docker build")]
    fabric_dra, runner = builds
    tags = [fabric_dra[i + 1] for i, word in enumerate(fabric_dra) if word == "--tag"]
    assert "fabric-dra:kind" in tags and tags == make_image_refs(
        "REGISTRY=", "IMAGE_NAME=fabric-dra", "IMAGE_TAG=kind"
    )
    assert fabric_dra[-1] == "."  # make runs in the repository: its Dockerfile and .dockerignore
    assert runner[-1] == str(DEPLOY_DIR / "kind" / "agent-runner")
    loads = [i for i, line in enumerate(log) if line.startswith("kind load docker-image fabric-dra:kind")]
    assert loads and loads[0] > log.index(" ".join(fabric_dra))
