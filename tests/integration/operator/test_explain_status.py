"""What an operator runs against a live manager with no cluster: ``explain --manager-url`` and
``status`` (columns, --watch, the wrong service, a missing token)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from fabric_dra_testbed.stack import Emulator, Manager, Stack
from plumbing import procs
from tests.support.uids import claim_uid

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"
CLASSES = Path(__file__).resolve().parents[3] / "deploy" / "base" / "deviceclasses.yaml"


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[Emulator, Manager]]:
    with Stack.temporary("fdra-op-") as stack:
        emulator = stack.emulator(auth=False)
        manager = stack.manager(
            emulator,
            static_tokens={CONTROLLER_TOKEN: ("controller", None), OPERATOR_TOKEN: ("operator", None)},
        )
        yield emulator, manager


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(OPERATOR_TOKEN + "\n")
    return path


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``fabric-dra ARGS`` with none of the caller's FABRIC_DRA_* variables (only ``env``'s)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    return procs.run(args, env={**environment, **(env or {})}, cwd=cwd)


def _claim(tmp_path: Path, device_class: str, count: int = 1) -> Path:
    path = tmp_path / "claim.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "gpus", "namespace": "team"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "g", "exactly": {"deviceClassName": device_class, "count": count}}
                        ]
                    }
                },
            }
        )
    )
    return path


def _attach(manager: Manager, device: str, node: str, claim: str, **share: object) -> None:
    with httpx.Client(base_url=manager.url, timeout=60) as http:
        http.post(
            "/api/v1/attachments",
            params={"waitSeconds": 30},
            json={"device": device, "node": node, "claimUid": claim, **share},
            headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
        ).raise_for_status()


def _detach(manager: Manager, device: str, node: str, claim: str, **share: str) -> None:
    with httpx.Client(base_url=manager.url, timeout=60) as http:
        http.delete(
            f"/api/v1/attachments/{device}",
            params={"claimUid": claim, "node": node, "waitSeconds": 30, **share},
            headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
        ).raise_for_status()


def test_explain_from_the_manager_without_a_cluster(
    stack: tuple[Emulator, Manager], tmp_path: Path, token_file: Path
) -> None:
    _, manager = stack
    base = [
        "explain",
        "--manager-url",
        manager.url,
        "--token-file",
        str(token_file),
        "--classes",
        str(CLASSES),
    ]
    fits = _cli(*base, str(_claim(tmp_path, "fabric-gpu")))
    assert fits.returncode == 0, fits.stderr
    assert "ResourceClaim team/gpus: fits on" in fits.stdout
    assert "allocated: fabric-pcie/gpu" in fits.stdout
    assert "HTTP Request" not in fits.stderr and "httpx" not in fits.stderr
    assert fits.stderr.startswith(f"reading the fabric inventory from {manager.url}")

    # A device a claim holds counts as allocated.
    _attach(manager, "gpu0", "kind-worker", claim_uid("claim-explain"))
    try:
        held = _cli(*base, "--all-devices", "-o", "text", str(_claim(tmp_path, "fabric-gpu", count=1)))
        assert (
            f"allocated (1): allocated to claim (fabric manager)/{claim_uid('claim-explain')}" in held.stdout
        ), held.stdout
    finally:
        _detach(manager, "gpu0", "kind-worker", claim_uid("claim-explain"))

    typo = _cli(*base, str(_claim(tmp_path, "fabric-gpus")))
    assert typo.returncode == 2
    assert (
        "DeviceClass 'fabric-gpus' is not known; known DeviceClasses: cohdi-pcie-device, "
        "fabric-a100-40gb-partition, fabric-cxl-memory, fabric-cxl-memory-pool, fabric-fpga, fabric-gpu, "
        in typo.stderr
    )
    no_classes = _cli("explain", "--manager-url", manager.url, str(_claim(tmp_path, "fabric-gpu")))
    assert no_classes.returncode == 2 and "--manager-url needs --classes FILE" in no_classes.stderr


def test_status_columns_and_watch(stack: tuple[Emulator, Manager], token_file: Path) -> None:
    _, manager = stack
    _attach(manager, "gpu1", "kind-worker2", claim_uid("claim-status"))
    try:
        table = _cli("status", "--manager-url", manager.url, "--token-file", str(token_file))
        assert table.returncode == 0, table.stderr
        header = next(line for line in table.stdout.splitlines() if line.startswith("NODE "))
        assert header.split() == [
            "NODE",
            "DEVICE",
            "TYPE",
            "MODEL",
            "SWITCH",
            "PORT",
            "HEALTH",
            "STATE",
            "CLAIM",
            "MANAGED",
        ]
        row = next(line for line in table.stdout.splitlines() if " gpu1 " in line)
        assert "switch0" in row and " OK " in row and claim_uid("claim-status") in row
    finally:
        _detach(manager, "gpu1", "kind-worker2", claim_uid("claim-status"))
    # The manager's attach and detach log lines carry how long each took.
    log = manager.role.log_since_start().splitlines()
    for event in ("attached", "detached"):
        line = next(line for line in log if event in line and "device=gpu1" in line)
        assert re.search(r"\bseconds=\d+(\.\d+)?\b", line), line

    # --watch: a change made while it runs shows up in a later drawing, without restarting it.
    command = ["status", "--watch", "--manager-url", manager.url, "--token-file", str(token_file)]
    watch = subprocess.Popen(
        [sys.executable, "-m", "fabric_dra", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def wait_for(text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in list(lines)):
            assert time.monotonic() < deadline, f"{text!r} not shown: {''.join(lines)}"
            time.sleep(0.1)

    try:
        wait_for("inventory version", 60)
        first = "".join(lines)
        _attach(manager, "gpu2", "kind-worker3", claim_uid("claim-watch"))
        wait_for(claim_uid("claim-watch"), 15)
    finally:
        watch.terminate()
        watch.wait(timeout=20)
        reader.join(timeout=10)
        _detach(manager, "gpu2", "kind-worker3", claim_uid("claim-watch"))
    assert first.startswith("--- ") and claim_uid("claim-watch") not in first
    assert "".join(lines).count("--- ") >= 2


def test_status_shows_partitions_and_shares(stack: tuple[Emulator, Manager], token_file: Path) -> None:
    """A GPU serving a partition (its node, the holder's placement and claim) and a memory pool with
    a share (used and free, the share's node, size and claim), as a table and as json."""
    _, manager = stack
    part, mem = claim_uid("status-part"), claim_uid("status-mem")
    share = "5b0e4b5e-7f9d-4c55-9c7e-0a1b2c3d4e5f"
    _attach(manager, "gpu1-2g20gb-4", "kind-worker", part)
    _attach(manager, "cxlpool0-pool", "kind-worker2", mem, shareId=share, memoryBytes=3 << 30)
    try:
        table = _cli("status", "--manager-url", manager.url, "--token-file", str(token_file))
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        section = lines[lines.index("PARTITIONS AND SHARES") :]
        assert section[1].split() == ["GPU", "NODE", "PARTITION", "PLACEMENT", "CLAIM"]
        gpu_row = next(line for line in section if line.startswith("gpu1 "))
        assert gpu_row.split() == [
            "gpu1",
            "kind-worker",
            "gpu1-2g20gb-4",
            "2g.20gb",
            "@",
            "slices",
            "4-5",
            part,
        ]
        pool_header = next(line for line in section if line.startswith("POOL "))
        assert pool_header.split() == ["POOL", "USED", "FREE", "SHARE", "NODE", "SIZE", "STATE", "CLAIM"]
        pool_row = next(line for line in section if line.startswith("cxlpool0-pool "))
        cells = pool_row.split()
        assert cells[1:3] == ["3", "GiB"] and cells[5:] == [share, "kind-worker2", "3", "GiB", "bound", mem]
        document = json.loads(
            _cli("status", "--manager-url", manager.url, "--token-file", str(token_file), "-o", "json").stdout
        )
        assert document["partitions"] == [
            {
                "gpu": "gpu1",
                "partitions": [{"partition": "gpu1-2g20gb-4", "claimUid": part, "node": "kind-worker"}],
            }
        ]
        pool = next(p for p in document["memoryPools"] if p["pool"] == "cxlpool0-pool")
        assert pool["usedBytes"] == 3 << 30 and [s["shareId"] for s in pool["shares"]] == [share]
    finally:
        _detach(manager, "gpu1-2g20gb-4", "kind-worker", part)
        _detach(manager, "cxlpool0-pool", "kind-worker2", mem, shareId=share)
    after = _cli("status", "--manager-url", manager.url, "--token-file", str(token_file)).stdout
    assert "gpu1-2g20gb-4" not in after and share not in after


def test_status_says_what_is_wrong_in_words(stack: tuple[Emulator, Manager], tmp_path: Path) -> None:
    emulator, manager = stack
    missing = _cli("status", "--manager-url", manager.url)
    assert missing.returncode != 0
    assert "--token-file" in missing.stderr and "FABRIC_DRA_TOKEN" in missing.stderr
    assert "Traceback" not in missing.stderr

    wrong = _cli("status", "--manager-url", emulator.url, env={"FABRIC_DRA_TOKEN": OPERATOR_TOKEN})
    assert wrong.returncode != 0
    assert f"{emulator.url.removeprefix('http://').removeprefix('https://')}" in wrong.stderr
    assert "is not a fabric-dra manager" in wrong.stderr and "Redfish service" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1

    relative = tmp_path / "t"
    relative.write_text(OPERATOR_TOKEN)
    here = _cli("status", "--manager-url", manager.url, "--token-file", "t", cwd=tmp_path)
    assert here.returncode == 0, here.stderr


@pytest.mark.parametrize("output", ["table", "wide", "json", "yaml"])
def test_every_output_format_of_status_and_explain(
    stack: tuple[Emulator, Manager], tmp_path: Path, token_file: Path, output: str
) -> None:
    """One grammar: ``-o table|wide|json|yaml`` on the data commands that talk to the manager."""
    _, manager = stack
    auth = ["--manager-url", manager.url, "--token-file", str(token_file)]
    _attach(manager, "gpu3", "kind-worker4", claim_uid(f"claim-{output}"))
    try:
        status = _cli("status", *auth, "-o", output)
    finally:
        _detach(manager, "gpu3", "kind-worker4", claim_uid(f"claim-{output}"))
    explain = _cli(
        "explain", *auth, "--classes", str(CLASSES), "-o", output, str(_claim(tmp_path, "fabric-gpu"))
    )
    assert status.returncode == 0, status.stderr
    assert explain.returncode == 0, explain.stderr
    if output in ("json", "yaml"):
        for done, key in ((status, "inventoryVersion"), (explain, "workloads")):
            document = json.loads(done.stdout) if output == "json" else yaml.safe_load(done.stdout)
            assert key in document
        assert yaml.safe_load(status.stdout)["pools"]
    else:
        header = next(line for line in status.stdout.splitlines() if line.startswith("NODE "))
        assert ("LINK" in header) == (output == "wide")
        assert "ResourceClaim team/gpus: fits on" in explain.stdout
        # wide lists every device instead of at most 8 per reason
        assert ("… (" in explain.stdout) == (output == "table")
