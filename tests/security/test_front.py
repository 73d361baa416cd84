"""The manager's front and the operator's command line against hostile names and a hostile node
(issue 33, findings 3, 4, 6, 7, 8 and 10), with real processes on loopback.

One stack for the module: the API test server, the emulator serving a topology whose H100 model
and manufacturer carry terminal escapes, CR/LF and bidi controls (as a hostile Redfish service
would send them), and the manager with API access, static tokens and a metrics token file. The
operator's commands run as real subprocesses (:func:`plumbing.procs.run`); the hostile node is a
plugin token talking to the REST API directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from emulator.topology import default_topology_path
from fabric_dra_testbed.stack import ApiServer, Emulator, Manager, Role, Stack
from plumbing.procs import run
from plumbing.terminal import UNSAFE_CHARACTERS
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

NODE = "kind-worker"
DRIVER = "fabric-dra.io"
TENANT = "team-a"
PLUGIN_TOKEN = "plugin-token-front-kind-worker-01"
CONTROLLER_TOKEN = "controller-token-front-000001"
OPERATOR_TOKEN = "operator-token-front-0000001"
METRICS_TOKEN = "metrics-token-front-000000001"

#: what a hostile Redfish service names the H100s: a window title, a screen clear, a forged table
#: row after CR/LF, a right-to-left override, a C1 CSI and a bidi isolate
MODEL = "H100\x1b]0;owned\x07\x1b[2J\r\nFORGED-ROW  fabric-pcie  gpu  9\u202egnp.exe\x9b31m\u2066"
MANUFACTURER = "NVIDIA\x1b[5m\u2028FORGED-MAKER\u200f"
#: the name a Kubernetes user gives a claim's owner (ownerReferences names are not validated)
OWNER = "train\x1b]0;owned\x07\r\nFORGED-WORKLOAD\u202e0-niart"


@dataclass
class Front:
    stack: Stack
    api: ApiServer
    emulator: Emulator
    manager: Manager
    root: Path

    @property
    def url(self) -> str:
        return self.manager.url

    def http(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def cli(
        self, *args: str, token: str | None = OPERATOR_TOKEN, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``fabric-dra ARGS --manager-url URL`` as a subprocess; its CompletedProcess."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
        if token is not None:
            environment["FABRIC_DRA_TOKEN"] = token
        environment.update(env or {})
        return run([*args, "--manager-url", self.url], env=environment, timeout=60)


def _hostile_topology(path: Path) -> Path:
    topology = yaml.safe_load(default_topology_path().read_text())
    topology["models"]["h100"].update(model=MODEL, manufacturer=MANUFACTURER)
    path.write_text(yaml.safe_dump(topology, allow_unicode=False))
    return path


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    with Stack.temporary("fdra-front-", driver_name=DRIVER) as stack:
        api = stack.apiserver()
        with api.http() as http:
            for namespace in (TENANT, "kube-system"):
                answer = http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
                assert answer.status_code in (201, 409), answer.text
            for node in ("kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"):
                answer = http.post("/api/v1/nodes", json={"metadata": {"name": node}})
                assert answer.status_code in (201, 409), answer.text
        emulator = stack.emulator(topology=_hostile_topology(stack.root / "hostile-topology.yaml"))
        metrics_token = stack.root / "metrics-token" / "token"
        metrics_token.parent.mkdir()
        metrics_token.write_text(METRICS_TOKEN + "\n")
        manager = stack.manager(
            emulator,
            kube=api,
            namespace="fabric-dra",
            static_tokens={
                PLUGIN_TOKEN: ("plugin", NODE),
                CONTROLLER_TOKEN: ("controller", None),
                OPERATOR_TOKEN: ("operator", None),
            },
            args=["--metrics-token-file", str(metrics_token)],
        )
        yield Front(stack, api, emulator, manager, stack.root)


def _claim(front: Front, device: dict[str, Any], *, owner: str | None = None) -> str:
    """A ResourceClaim in :data:`TENANT` allocated ``device`` on :data:`NODE`; its UID."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    metadata: dict[str, Any] = {"name": name, "namespace": TENANT}
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": str(uuid.uuid4()), "controller": True}
        ]
    path = f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaims"
    with front.api.http() as http:
        created = http.post(
            path,
            json={
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": metadata,
                "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "x"}}]}},
            },
        )
        assert created.status_code == 201, created.text
        claim = created.json()
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "dev", "driver": DRIVER, "pool": device["pool"], "device": device["name"]}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                    ]
                },
            }
        }
        updated = http.put(f"{path}/{name}/status", json=claim)
        assert updated.status_code == 200, updated.text
    return str(claim["metadata"]["uid"])


def _free(front: Front, *, hostile: bool) -> dict[str, Any]:
    with front.http(OPERATOR_TOKEN) as http:
        devices = http.get("/api/v1/devices").json()
    return next(
        d
        for d in devices
        if d["state"] == "free" and d["type"] == "gpu" and ("FORGED" in d["model"]) == hostile
    )


def _attach(front: Front, device: dict[str, Any], claim: str, **extra: Any) -> httpx.Response:
    with front.http(PLUGIN_TOKEN) as http:
        return http.post(
            "/api/v1/attachments",
            params={"waitSeconds": 30},
            json={"device": device["name"], "node": NODE, "claimUid": claim, "pool": device["pool"], **extra},
        )


def _detach(front: Front, device: dict[str, Any], claim: str) -> None:
    with front.http(PLUGIN_TOKEN) as http:
        answer = http.delete(
            f"/api/v1/attachments/{device['name']}",
            params={"claimUid": claim, "node": NODE, "waitSeconds": 30},
        )
        assert answer.status_code == 200, answer.text


def _raw(text: str) -> list[str]:
    """The characters of ``text`` that no output may carry raw (its own line feeds aside)."""
    return sorted({m.group() for m in UNSAFE_CHARACTERS.finditer(text.replace("\n", ""))})


def _log(front: Front) -> str:
    return front.manager.role.log_file.read_bytes().decode("utf-8", "replace")


# -- finding 3: names from Redfish and Kubernetes reach the terminal as text ------------------------


def test_status_and_usage_show_hostile_names_as_text(front: Front) -> None:
    device = _free(front, hostile=True)
    claim = _claim(front, device, owner=OWNER)
    attached = _attach(front, device, claim, namespace=TENANT)
    assert attached.status_code == 200, attached.text
    try:
        runs = {
            " ".join(args): front.cli(*args)
            for args in (
                ("status",),
                ("status", "-o", "wide"),
                ("status", "-o", "yaml"),
                ("status", "-o", "json"),
                ("usage", "--by", "model"),
                ("usage", "--by", "workload"),
                ("usage", "--by", "workload", "-o", "wide"),
                ("usage", "--by", "workload", "-o", "csv"),
                ("usage", "--by", "model", "-o", "yaml"),
            )
        }
    finally:
        _detach(front, device, claim)
    for command, done in runs.items():
        assert done.returncode == 0, (command, done.stderr)
        output = done.stdout + done.stderr
        assert _raw(output) == [], f"fabric-dra {command} wrote {_raw(output)} raw:\n{output}"
        lines = output.splitlines()
        # CR/LF in a name forged no row: what follows it stays on the name's own line.
        assert not any(line.lstrip("- \"'").startswith("FORGED") for line in lines), (command, output)
    table = runs["status"].stdout
    assert any("FORGED-ROW" in line and line.split()[0] == "fabric-pcie" for line in table.splitlines()), (
        table
    )
    # Shown, not dropped: the operator sees that the owner's name holds escapes.
    workloads = runs["usage --by workload"].stdout
    assert f"{TENANT}/Pod/train\\x1b]0;owned\\x07\\r\\nFORGED-WORKLOAD\\u202e0-niart" in workloads, workloads
    # The documents still say exactly what the fabric and the cluster said.
    models = {g["name"] for g in yaml.safe_load(runs["usage --by model -o yaml"].stdout)["groups"]}
    assert any(name.startswith("H100") and "FORGED-ROW" in name for name in models), models
    assert yaml.safe_load(runs["status -o yaml"].stdout) == json.loads(runs["status -o json"].stdout)


# -- finding 4 and the class fix: what a node sends is validated, the claim's namespace wins ----------


HOSTILE_FIELDS = [
    ("namespace", "team-b\nfake", "body.namespace"),
    ("namespace", "Kube-System", "body.namespace"),
    ("pool", "fabric-pcie\x1b[2J", "body.pool"),
    ("claimUid", "c1\r\nlevel=error", "body.claimUid"),
    ("node", f"{NODE}\u202e", "body.node"),
    ("device", "gpu0\x00", "body.device"),
]


def test_a_node_cannot_bill_another_namespace(front: Front) -> None:
    device = _free(front, hostile=False)
    claim = _claim(front, device)
    # Every field a node sends is its Kubernetes type; anything else is 422, naming the field.
    for field, value, where in HOSTILE_FIELDS:
        body = {
            "device": device["name"],
            "node": NODE,
            "claimUid": claim,
            "pool": device["pool"],
            field: value,
        }
        with front.http(PLUGIN_TOKEN) as http:
            answer = http.post("/api/v1/attachments", json=body)
        assert answer.status_code == 422, (field, answer.text)
        assert where in answer.json()["message"], answer.text
    with front.http(PLUGIN_TOKEN) as http:
        report = http.put(
            f"/api/v1/nodes/{NODE}/claims", json={"claims": [{"claimUid": "x\n", "devices": []}]}
        )
        assert report.status_code == 422 and "body.claims.0.claimUid" in report.json()["message"], report.text
        operation = http.get("/api/v1/operations/op-%1b%5b2J%0d%0a")
        assert operation.status_code == 422, operation.text
    assert front.emulator.bound_hosts() == {}

    # A valid namespace that is not the claim's: the API server's word wins, the billing stays true.
    attached = _attach(front, device, claim, namespace="kube-system")
    assert attached.status_code == 200, attached.text
    try:
        # What the binding records (a warm device's last tenant; the billing once the claim is gone).
        ledger = front.root / "manager" / "ledger.json"
        recorded = wait_until(
            lambda: json.loads(ledger.read_text())["entries"].get(device["name"]),
            what="the attach's ledger entry",
        )
        assert recorded["namespace"] == TENANT, recorded
        with front.http(OPERATOR_TOKEN) as http:
            since = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() - 3600))
            groups = wait_until(
                lambda: {
                    g["name"]: g
                    for g in http.get("/api/v1/usage", params={"since": since}).json()["groups"]
                    if g["bound"] > 0
                },
                what="bound seconds in the usage report",
            )
        with front.http(METRICS_TOKEN) as http:
            metrics = http.get("/metrics").text
    finally:
        _detach(front, device, claim)
    assert TENANT in groups and "kube-system" not in groups, groups
    assert f'namespace="{TENANT}"' in metrics and 'namespace="kube-system"' not in metrics
    assert "attach names another namespace than its claim's" in _log(front)


def test_without_api_access_a_namespace_is_still_a_dns_label(front: Front) -> None:
    """Without Kubernetes API access the manager cannot read the claim: the node's word is all it
    has (documented), but that word is a namespace's name, never rows or escapes."""
    manager = front.stack.manager(
        front.emulator,
        name="manager-no-api",
        static_tokens={PLUGIN_TOKEN: ("plugin", NODE), OPERATOR_TOKEN: ("operator", None)},
    )
    try:
        for namespace in ("team-b\nfake", "team-b\x1b[2J", "a" * 64):
            with httpx.Client(
                base_url=manager.url, headers={"Authorization": f"Bearer {PLUGIN_TOKEN}"}
            ) as http:
                answer = http.post(
                    "/api/v1/attachments",
                    json={
                        "device": "gpu4",
                        "node": NODE,
                        "claimUid": str(uuid.uuid4()),
                        "namespace": namespace,
                    },
                    timeout=30,
                )
            assert answer.status_code == 422 and "body.namespace" in answer.json()["message"], answer.text
        assert front.emulator.bound_hosts() == {}
    finally:
        manager.stop()


# -- finding 6: a time past UTC's years is a clear refusal, on both sides -----------------------------


def test_usage_since_beyond_the_calendar_is_a_clear_refusal(front: Front) -> None:
    with front.http(OPERATOR_TOKEN) as http:
        for since in ("0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"):
            answer = http.get("/api/v1/usage", params={"since": since})
            assert answer.status_code == 422, answer.text
            assert answer.json()["code"] == "InvalidRequest" and "query.since" in answer.json()["message"]
    assert "Traceback" not in _log(front)
    for since in ("3000000d", "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"):
        done = front.cli("usage", "--since", since)
        assert done.returncode == 1, done
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("fabric-dra: error: "), done.stderr
        assert "Traceback" not in done.stderr and "not a fabric-dra manager" not in done.stderr
        assert "after 9999-12-31" in done.stderr, done.stderr


# -- finding 7: a token file is never echoed ---------------------------------------------------------


SECRET = "SECRET-second-line-0123456789"


def _token_files(root: Path) -> dict[str, Path]:
    files = {
        "two lines": (f"{OPERATOR_TOKEN}\n{SECRET}\n").encode(),
        "non-ASCII": f"{OPERATOR_TOKEN}é{SECRET}".encode(),
        "binary": b"\x00\xff" + SECRET.encode() + b"\x1b[2J",
        "large": (SECRET * 1000).encode(),
    }
    out = {}
    for name, content in files.items():
        path = root / f"token-{name.replace(' ', '-')}"
        path.write_bytes(content)
        out[name] = path
    out["/etc/shadow"] = Path("/etc/shadow")
    return out


def _secrets_of(path: Path) -> list[str]:
    """Pieces of the file that must not appear in any output."""
    if path == Path("/etc/shadow"):
        return [line.split(":")[0] + ":" for line in path.read_text().splitlines() if line.count(":") > 2]
    return [SECRET]


def test_token_files_are_never_echoed(front: Front, tmp_path: Path) -> None:
    for name, path in _token_files(tmp_path).items():
        if not os.access(path, os.R_OK):
            continue  # /etc/shadow, for a user who cannot read it: nothing to leak
        for command in (("status",), ("usage",)):
            done = front.cli(*command, "--token-file", str(path), token=None)
            output = done.stdout + done.stderr
            assert done.returncode == 1, (name, output)
            assert output.count("\n") == 1 and "Traceback" not in output, (name, output)
            assert f"token file {path}" in output and "bearer token" in output, (name, output)
            for secret in _secrets_of(path):
                assert secret not in output, (name, output)
    # The variable too.
    done = front.cli("status", token=f"{OPERATOR_TOKEN}\n{SECRET}")
    assert done.returncode == 1 and "FABRIC_DRA_TOKEN" in done.stderr and SECRET not in done.stderr, done
    assert "Traceback" not in done.stderr


def test_plugin_and_controller_never_log_their_token_file(front: Front, tmp_path: Path) -> None:
    bad = tmp_path / "bad.token"
    bad.write_text(f"{PLUGIN_TOKEN}\n{SECRET}\n")
    plugin = front.stack.plugin(
        NODE,
        front.manager,
        front.api,
        name="plugin-bad-token",
        sysfs_root=front.emulator.sysfs(NODE),
        token_file=bad,
        args=["--report-seconds", "0.5"],
    )
    controller = front.stack.controller(front.manager, front.api, name="controller-bad-token", token_file=bad)
    try:
        for role in (plugin.role, controller.role):

            def said_so(role: Role = role) -> str | None:
                text = role.log_since_start()
                return text if "does not hold one bearer token" in text else None

            log = wait_until(said_so, what=f"{role.name} to say its token file holds no token")
            assert SECRET not in log and "Traceback" not in log, log
            assert role.alive(), role.tail()
    finally:
        plugin.role.stop()
        controller.role.stop()


# -- finding 8: no documentation page on the token's origin ------------------------------------------


def test_no_documentation_page_runs_on_the_managers_origin(front: Front) -> None:
    with front.http(None) as http:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            answer = http.get(path)
            assert answer.status_code == 404, (path, answer.text)
            assert "swagger" not in answer.text.lower() and "cdn" not in answer.text.lower()
        document = http.get("/openapi.json")
        assert document.status_code == 200 and document.json()["openapi"].startswith("3.")
        for answer in (document, http.get("/healthz"), http.get("/api/v1/devices")):
            assert answer.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"
            assert answer.headers["x-content-type-options"] == "nosniff"
        page = http.get("/ui")
        assert "script-src 'self'" in page.headers["content-security-policy"]


# -- finding 10: who may read usage and metrics ------------------------------------------------------


def test_usage_and_metrics_are_for_operators_and_the_scraper(front: Front) -> None:
    since = {"since": "2026-01-01T00:00:00Z"}
    expected = {
        None: (401, 401, 401),
        PLUGIN_TOKEN: (403, 403, 200),
        CONTROLLER_TOKEN: (403, 403, 200),
        OPERATOR_TOKEN: (200, 200, 200),
        METRICS_TOKEN: (200, 403, 403),
    }
    for token, (metrics, usage, inventory) in expected.items():
        with front.http(token) as http:
            got = (
                http.get("/metrics").status_code,
                http.get("/api/v1/usage", params=since).status_code,
                http.get("/api/v1/inventory").status_code,
            )
        assert got == (metrics, usage, inventory), (token, got)
    with front.http(PLUGIN_TOKEN) as http:
        refused = http.get("/metrics").json()
    assert refused["code"] == "PermissionDenied" and "operator or metrics" in refused["message"], refused


def test_the_metrics_token_is_read_again_when_its_secret_changes(front: Front) -> None:
    token_file = front.root / "metrics-token" / "token"
    rotated = "metrics-token-front-rotated-0002"
    token_file.write_text(rotated + "\n")
    try:

        def scrapes(token: str) -> int:
            with front.http(token) as http:
                return http.get("/metrics").status_code

        wait_until(lambda: scrapes(rotated) == 200, timeout=10, what="the rotated metrics token to work")
        assert scrapes(METRICS_TOKEN) == 401
        token_file.unlink()  # an optional Secret deleted: no metrics token, operators still scrape
        wait_until(lambda: scrapes(rotated) == 401, timeout=10, what="the deleted metrics token to stop")
        assert scrapes(OPERATOR_TOKEN) == 200
    finally:
        token_file.write_text(METRICS_TOKEN + "\n")
    wait_until(lambda: scrapes(METRICS_TOKEN) == 200, timeout=10, what="the metrics token back")
