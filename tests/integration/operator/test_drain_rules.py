"""Drains as DeviceTaintRules, where the cluster serves them (issue 38): ``fabric-dra drain`` against a
real manager on the emulator, the controller (``--drain-taints auto``) writing one rule per drained
device to an API test server of Kubernetes 1.36 with the gate ``DRADeviceTaintRules`` and the beta
``resource.k8s.io/v1beta2`` turned on, and the stand-in control plane's device taint eviction
reading the rules.

A drain makes a rule (selector driver, pool, device; taint ``<driver>/drain``) and no slice taint,
and the command says so; ``--evict`` makes the rule NoExecute and the pod using the device is
evicted through it; undrain deletes the rule. A restarted controller writes nothing when its rules
match the drains, deletes a stale rule of its own and recreates a missing one. (Without the gate,
drains are slice taints as before: tests/integration/operator/test_drains.py.)"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabric_dra_testbed.stack import ApiServer, Controller, Manager, Stack
from plumbing import procs
from tests.support.waiting import wait_until

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"
NAMESPACE = "team"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
GATED = [
    *("--server-version", "1.36.0", "--validate-versions", "1.36"),
    *("--feature-gates", "DRADeviceTaintRules=true", "--runtime-config", "resource.k8s.io/v1beta2=true"),
]


@dataclass
class Rules:
    stack: Stack
    manager: Manager
    api: ApiServer
    controller: Controller
    token_dir: Path
    driver: str
    devices: dict[str, dict[str, Any]]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_DRA_", "KUBECONFIG"))}
        connection = ["--manager-url", self.manager.url, "--token-file", str(self.token_dir / "operator")]
        if args[0] == "drain":
            connection += ["--kubeconfig", str(self.api.kubeconfig)]
        return procs.run([*args, *connection], env=env)

    def http(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.api.http() as http:
            response = http.request(method, path, json=body)
        assert response.status_code in (200, 201), response.text
        return dict(response.json())

    def rules(self) -> dict[str, dict[str, Any]]:
        return {r["metadata"]["name"]: r for r in self.http("GET", RULES)["items"]}

    def rule_for(self, device: str) -> dict[str, Any] | None:
        return next(
            (r for r in self.rules().values() if r["spec"]["deviceSelector"].get("device") == device), None
        )

    def slice_taints(self, device: str) -> list[Any]:
        found = self.http("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        return [
            t
            for s in found
            for d in s["spec"].get("devices") or []
            if d["name"] == device
            for t in d.get("taints") or []
        ]


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rules]:
    with Stack.temporary("fdra-rules-") as stack:
        emulator = stack.emulator(auth=False)
        api = stack.apiserver(extra_args=GATED)
        manager = stack.manager(
            emulator,
            static_tokens={CONTROLLER_TOKEN: ("controller", None), OPERATOR_TOKEN: ("operator", None)},
        )
        tokens = tmp_path_factory.mktemp("tokens")
        (tokens / "controller").write_text(CONTROLLER_TOKEN + "\n")
        (tokens / "operator").write_text(OPERATOR_TOKEN + "\n")
        controller = stack.controller(manager, api, token_file=tokens / "controller")
        stack.cluster(api, ["idle-node"])  # its device taint eviction is what runs here
        with httpx.Client(base_url=manager.url, timeout=30) as http:
            listed = http.get("/api/v1/devices", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        listed.raise_for_status()
        found = Rules(
            stack, manager, api, controller, tokens, stack.driver_name, {d["name"]: d for d in listed.json()}
        )
        wait_until(
            lambda: found.http("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"],
            what="the pool published",
        )
        yield found


def _bound_pod(r: Rules, device: str, pod: str) -> None:
    """A pod bound to kind-worker using a claim allocated ``device`` and reserved for the pod."""
    r.http(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    created = r.http(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod},
            "spec": {
                "nodeName": "kind-worker",
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{pod}-gpu"}],
            },
        },
    )
    claim = r.http(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"{pod}-gpu"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]}
            },
        },
    )
    result = {"request": "gpu", "driver": r.driver, "pool": r.devices[device]["pool"], "device": device}
    claim["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": created["metadata"]["uid"]}],
    }
    r.http("PUT", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{pod}-gpu/status", claim)


def _pod_exists(r: Rules, pod: str) -> bool:
    with r.api.http() as http:
        return http.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}").status_code == 200


def test_a_drain_is_a_rule_not_a_slice_taint_evict_evicts_through_it_undrain_deletes_it(rules: Rules) -> None:
    r = rules
    _bound_pod(r, "gpu1", "trainer")
    done = r.cli("drain", "device", "gpu1", "--reason", "firmware-2.1")
    assert done.returncode == 0, done.stderr
    rule = wait_until(lambda: r.rule_for("gpu1"), what="gpu1's drain rule")
    assert rule["spec"]["deviceSelector"] == {
        "driver": r.driver,
        "pool": r.devices["gpu1"]["pool"],
        "device": "gpu1",
    }
    assert {k: v for k, v in rule["spec"]["taint"].items() if k != "timeAdded"} == {
        "key": f"{r.driver}/drain",
        "value": "firmware-2.1",
        "effect": "NoSchedule",
    }
    assert rule["metadata"]["labels"] == {f"{r.driver}/drain-rule": "default"}
    assert f"tainted through DeviceTaintRule(s): {rule['metadata']['name']}" in done.stdout, done.stdout
    assert r.slice_taints("gpu1") == []  # the rule, not the slice, carries it
    assert _pod_exists(r, "trainer")  # NoSchedule evicts nobody

    evict = r.cli("drain", "device", "gpu1", "--reason", "firmware-2.1", "--evict")
    assert evict.returncode == 0, evict.stderr
    wait_until(
        lambda: (found := r.rule_for("gpu1")) and found["spec"]["taint"]["effect"] == "NoExecute",
        what="the rule made NoExecute",
    )
    wait_until(lambda: not _pod_exists(r, "trainer"), timeout=30, what="the pod evicted through the rule")
    assert r.slice_taints("gpu1") == []

    undone = r.cli("undrain", "device", "gpu1")
    assert undone.returncode == 0, undone.stderr
    wait_until(lambda: r.rule_for("gpu1") is None, what="the rule deleted on undrain")


def test_a_restarted_controller_keeps_equal_rules_and_repairs_the_others(rules: Rules) -> None:
    r = rules
    assert r.cli("drain", "device", "gpu2", "--reason", "psu-swap").returncode == 0
    assert r.cli("drain", "device", "gpu3", "--reason", "psu-swap").returncode == 0
    kept = wait_until(lambda: r.rule_for("gpu2"), what="gpu2's rule")
    gone = wait_until(lambda: r.rule_for("gpu3"), what="gpu3's rule")

    r.controller.role.stop()
    # While it is down: its rule for gpu3 is deleted by hand, and a stale one of its own is left.
    with r.api.http() as http:
        assert http.delete(f"{RULES}/{gone['metadata']['name']}").status_code == 200
    stale = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "left-over", "labels": {f"{r.driver}/drain-rule": "default"}},
        "spec": {
            "deviceSelector": {"driver": r.driver, "pool": r.devices["gpu0"]["pool"], "device": "gpu0"},
            "taint": {"key": f"{r.driver}/drain", "value": "old", "effect": "NoSchedule"},
        },
    }
    r.http("POST", RULES, stale)
    r.controller.role.start()

    wait_until(lambda: r.rule_for("gpu3"), what="the missing rule recreated")
    wait_until(lambda: "left-over" not in r.rules(), what="the stale rule deleted")
    assert (
        r.rules()[kept["metadata"]["name"]]["metadata"]["resourceVersion"]
        == kept["metadata"]["resourceVersion"]
    )
    for device in ("gpu2", "gpu3"):
        assert r.cli("undrain", "device", device).returncode == 0
    wait_until(lambda: r.rule_for("gpu2") is None and r.rule_for("gpu3") is None, what="both rules deleted")


def test_a_controller_switched_to_slice_taints_deletes_its_rules(rules: Rules) -> None:
    r = rules
    assert r.cli("drain", "device", "gpu4", "--reason", "cable").returncode == 0
    wait_until(lambda: r.rule_for("gpu4"), what="gpu4's rule")
    r.controller.role.stop()
    token = r.token_dir / "controller"
    slices = r.stack.controller(
        r.manager, r.api, name="controller-slices", token_file=token, args=["--drain-taints", "slices"]
    )
    try:
        wait_until(lambda: r.rule_for("gpu4") is None, what="the rule deleted under --drain-taints slices")
        wait_until(
            lambda: (
                [(t["key"], t["value"]) for t in r.slice_taints("gpu4")] == [(f"{r.driver}/drain", "cable")]
            ),
            what="gpu4 tainted in its slice instead",
        )
    finally:
        slices.role.stop()
        r.controller.role.start()
    assert r.cli("undrain", "device", "gpu4").returncode == 0
    wait_until(lambda: r.rule_for("gpu4") is None and r.slice_taints("gpu4") == [], what="gpu4 offered again")
