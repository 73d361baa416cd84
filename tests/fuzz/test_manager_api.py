"""The fabric manager's REST API fuzzed from its own OpenAPI document with schemathesis, against a
real manager process on a real emulator, with authentication.

Every operation, as each role (controller: attaches anywhere; plugin: its own node only;
operator: read-only). Schemathesis' checks run on every answer: no 5xx, status codes and bodies
as documented (errors are ErrorBody), content types, headers, requests without or with a wrong
token refused, schema-valid requests accepted and invalid ones rejected. Part of the generated
values come from small dictionaries of real device, node and claim names so that the requests
reach the binder (attach, join, busy, detach by holder and by strangers), not only validation.

Afterwards the fabric and the manager must agree binding for binding, and detaching what is
left must leave the fabric empty: nothing half-done.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from manager_api.client import ManagerClient
from manager_api.models import BindingState
from tests.fuzz.budget import examples
from tests.support.emulator import RunningEmulator, run_emulator
from tests.support.fabric_manager import running_manager, static_tokens_file
from tests.support.uids import claim_uid

TOKENS = {
    "controller": "controller-token-fuzz-0123456789",
    "plugin": "plugin-token-fuzz-kind-worker-0123",
    "operator": "operator-token-fuzz-0123456789",
}
DEVICES = ["gpu0", "gpu1", "nvme0", "nic0", "fpga0", "cxlmem0-chunk1", "cxlmem1-chunk3"]
NODES = ["kind-worker", "kind-worker2", "kind-worker3"]
CLAIMS = [claim_uid(name) for name in ("claim-a", "claim-b", "claim-c")]

#: schemathesis runs, each a new interpreter: ~57 s for the module in a 4-worker run
pytestmark = pytest.mark.slow(seconds=135)


@dataclass
class Fabric:
    emulator: RunningEmulator
    manager_url: str


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    root = tmp_path_factory.mktemp("fuzz-api")
    tokens = static_tokens_file(
        root / "tokens.json",
        {
            TOKENS["controller"]: ("controller", None),
            TOKENS["plugin"]: ("plugin", "kind-worker"),
            TOKENS["operator"]: ("operator", None),
        },
    )
    tokens.chmod(0o600)
    with run_emulator(root) as emulator:
        args = [
            *("--redfish-credentials-file", str(emulator.state_dir / "credentials.json")),
            *("--state-dir", str(root / "manager"), "--static-tokens", str(tokens)),
        ]
        with running_manager(root, emulator.url, args=args) as manager:
            yield Fabric(emulator, manager.address)


CONFIG = """
[dictionaries.devices]
values = DEVICES
[dictionaries.nodes]
values = NODES
[dictionaries.claims]
values = CLAIMS
[parameters]
"path.device" = {dictionary = "devices", probability = 0.7}
"body.device" = {dictionary = "devices", probability = 0.7}
"path.node" = {dictionary = "nodes", probability = 0.7}
"body.node" = {dictionary = "nodes", probability = 0.7}
"query.node" = {dictionary = "nodes", probability = 0.7}
"body.claimUid" = {dictionary = "claims", probability = 0.7}
"query.claimUid" = {dictionary = "claims", probability = 0.7}
# 413: the manager caps every body at the largest claim report (fabric/api/request_guard.py), a bound on
# the total size that no JSON schema of the body expresses; 410: a change-feed cursor (epoch, version)
# the manager's bounded history does not hold, which no schema can tell from one it holds (both are
# documented per operation); the defaults otherwise.
[checks.negative_data_rejection]
expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "410", "413", "415", "422", "428", "429", "5xx",
]
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "413", "429", "5xx"]
"""


def _schemathesis(fabric: Fabric, role: str, examples: int, work: Path) -> tuple[int, str]:
    """``schemathesis run`` with every phase (examples, coverage, fuzzing, stateful) and every
    check; returns its exit code and output."""
    config = work / f"schemathesis-{role}.toml"
    config.write_text(
        CONFIG.replace("values = DEVICES", f"values = {json.dumps(DEVICES)}")
        .replace("values = NODES", f"values = {json.dumps(NODES)}")
        .replace("values = CLAIMS", f"values = {json.dumps(CLAIMS)}")
    )
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        *("--config-file", str(config), "--no-color"),
        *("run", f"{fabric.manager_url}/openapi.json"),
        *("--header", f"Authorization: Bearer {TOKENS[role]}"),
        *("--checks", "all", "--max-examples", str(examples), "--workers", "1"),
        *("--request-timeout", "60", "--suppress-health-check", "all"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=work, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(("role", "ci_examples"), [("controller", 15), ("plugin", 5), ("operator", 5)])
def test_every_operation_as_every_role(fabric: Fabric, role: str, ci_examples: int, tmp_path: Path) -> None:
    """Controller: attaches anywhere; plugin: its own node only (403 elsewhere); operator:
    read-only (403 on attach and detach)."""
    code, output = _schemathesis(fabric, role, examples(ci_examples), tmp_path)
    tried = re.search(r"(\d+) generated", output)
    print(f"schemathesis as {role}: {tried.group(0) if tried else '?'}")
    assert code == 0, output[-6000:]
    assert tried is not None and int(tried.group(1)) > 0, output[-2000:]


def test_the_document_declares_bearer_auth_and_error_bodies(fabric: Fabric) -> None:
    document = httpx.get(f"{fabric.manager_url}/openapi.json", timeout=30).json()
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            assert operation["security"] == [{"bearerAuth": []}], where
            assert not any(p["in"] == "header" for p in operation.get("parameters", [])), where
            for status in ("401", "422", "503"):
                body = operation["responses"][status]["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/ErrorBody"}, where


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"\x10\x16\xffsD\x02", "application/json"), (b"{", "application/json"), (b"[]", "application/json")],
)
def test_a_body_that_is_no_json_object_is_an_invalid_request(
    fabric: Fabric, body: bytes, content_type: str
) -> None:
    answer = httpx.post(
        f"{fabric.manager_url}/api/v1/attachments",
        content=body,
        headers={"Authorization": f"Bearer {TOKENS['controller']}", "Content-Type": content_type},
        timeout=30,
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "InvalidRequest"
    assert answer.json()["message"].startswith("malformed request")


def test_unknown_paths_and_methods_answer_error_bodies(fabric: Fabric) -> None:
    # Without a token every /api/v1 path is 401, found or not: nothing is told to a stranger.
    stranger = httpx.get(f"{fabric.manager_url}/api/v1/nothing", timeout=30)
    assert (stranger.status_code, stranger.json()["code"]) == (401, "Unauthenticated")
    auth = {"Authorization": f"Bearer {TOKENS['controller']}"}
    missing = httpx.get(f"{fabric.manager_url}/api/v1/nothing", headers=auth, timeout=30)
    assert (missing.status_code, missing.json()["code"]) == (404, "NotFound")
    wrong = httpx.put(f"{fabric.manager_url}/api/v1/devices", headers=auth, timeout=30)
    assert (wrong.status_code, wrong.json()["code"]) == (405, "MethodNotAllowed")
    assert "GET" in wrong.headers["Allow"]


def test_zz_after_fuzzing_fabric_and_manager_agree_and_everything_detaches(fabric: Fabric) -> None:
    """Runs last in this module: what the fuzzing left bound is the same in both, and goes away."""

    async def scenario() -> None:
        async with ManagerClient(fabric.manager_url, token=TOKENS["controller"], timeout=60) as client:
            devices = await client.devices()
            held = {(d.name, d.host) for d in devices if d.state is not BindingState.FREE}
            fabric_side = {(b["Target"], b["Host"]) for b in fabric.emulator.bindings()["Bindings"]}
            assert held == fabric_side, f"manager {sorted(held)} vs fabric {sorted(fabric_side)}"
            assert all(d.managed and d.claim_uid for d in devices if d.state is not BindingState.FREE)
            for device in devices:
                if device.state is not BindingState.FREE:
                    assert device.node is not None and device.claim_uid is not None
                    await client.detach(device.name, device.node, device.claim_uid, wait_seconds=30)
            assert all(d.state is BindingState.FREE for d in await client.devices())
        table = fabric.emulator.bindings()
        assert table["Bindings"] == [] and table["InFlight"] == []

    asyncio.run(scenario())
    # The last detach's outcome is written after its answer (its intent was durable before).
    # A run whose fuzzed attaches were all refused never writes the ledger: no file, no entries.
    ledger_file = Path(fabric.emulator.state_dir).parent / "manager" / "ledger.json"
    entries: object = {}
    for _ in range(100):
        entries = json.loads(ledger_file.read_text())["entries"] if ledger_file.exists() else {}
        if entries == {}:
            break
        time.sleep(0.05)
    assert entries == {}
