"""``fabric-dra drain`` and ``undrain`` as an operator runs them: the CLI against a real manager on
the emulator, the controller publishing the drain taint to the API test server, and the claims and
pods the drain affects read from that server."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabric_dra_testbed.stack import ApiServer, Emulator, Manager, Stack
from plumbing import procs
from tests.support.waiting import wait_until

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"
NAMESPACE = "team"


@dataclass
class Drains:
    emulator: Emulator
    manager: Manager
    api: ApiServer
    driver: str
    operator_token: Path
    devices: dict[str, dict[str, Any]]

    def cli(self, *args: str, kube: bool = True) -> subprocess.CompletedProcess[str]:
        """``fabric-dra ARGS`` as the operator, with the API test server's kubeconfig unless not ``kube``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_DRA_", "KUBECONFIG"))}
        connection = ["--manager-url", self.manager.url, "--token-file", str(self.operator_token)]
        if kube and args[0] == "drain":
            connection += ["--kubeconfig", str(self.api.kubeconfig)]
        return procs.run([*args, *connection], env=env)

    def taints(self) -> dict[str, list[tuple[str, str, str]]]:
        """device → its (key, value, effect) taints as the API test server stores them."""
        with self.api.http() as http:
            response = http.get(
                "/apis/resource.k8s.io/v1/resourceslices",
                params={"fieldSelector": f"spec.driver={self.driver}"},
            )
        response.raise_for_status()
        return {
            d["name"]: [(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []]
            for s in response.json()["items"]
            for d in s["spec"].get("devices") or []
        }

    def wait_taint(self, device: str, expected: list[tuple[str, str, str]], what: str) -> None:
        wait_until(lambda: self.taints().get(device) == expected, timeout=60, what=what)


def _api(api: ApiServer, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with api.http() as http:
        response = http.request(method, path, json=body)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def drains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drains]:
    with Stack.temporary("fdra-drain-") as stack:
        emulator = stack.emulator(auth=False)
        # DeviceTaintRules off (DRADeviceTaintRules is on by default from 1.37): drains are slice
        # taints here; tests/integration/operator/test_drain_rules.py runs them as rules.
        api = stack.apiserver(extra_args=["--feature-gates", "DRADeviceTaintRules=false"])
        manager = stack.manager(
            emulator,
            static_tokens={CONTROLLER_TOKEN: ("controller", None), OPERATOR_TOKEN: ("operator", None)},
        )
        tokens = tmp_path_factory.mktemp("tokens")
        (tokens / "controller").write_text(CONTROLLER_TOKEN + "\n")
        (tokens / "operator").write_text(OPERATOR_TOKEN + "\n")
        stack.controller(manager, api, token_file=tokens / "controller")
        with httpx.Client(base_url=manager.url, timeout=30) as http:
            listed = http.get("/api/v1/devices", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        listed.raise_for_status()
        found = Drains(
            emulator,
            manager,
            api,
            stack.driver_name,
            tokens / "operator",
            {d["name"]: d for d in listed.json()},
        )
        wait_until(lambda: "gpu0" in found.taints(), timeout=60, what="the pool published")
        yield found


def _claim_with_pod(d: Drains, device: str, pod: str) -> str:
    """A claim allocated ``device`` with a pod that uses it, and the device attached for the claim
    (as the plugin would at prepare); the claim's UID."""
    _api(
        d.api,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    claim = _api(
        d.api,
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
    pool = d.devices[device]["pool"]
    result = {"request": "gpu", "driver": d.driver, "pool": pool, "device": device}
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    _api(
        d.api,
        "PUT",
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{pod}-gpu/status",
        claim,
    )
    _api(
        d.api,
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{pod}-gpu"}],
            },
        },
    )
    uid = str(claim["metadata"]["uid"])
    with httpx.Client(base_url=d.manager.url, timeout=60) as http:
        http.post(
            "/api/v1/attachments",
            params={"waitSeconds": 30},
            json={"device": device, "node": "kind-worker", "claimUid": uid},
            headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
        ).raise_for_status()
    return uid


def test_drain_and_undrain_a_device_list_the_claim_and_pod_and_taint_it(drains: Drains) -> None:
    d = drains
    key = f"{d.driver}/drain"
    uid = _claim_with_pod(d, "gpu1", "trainer")

    done = d.cli("drain", "device", "gpu1", "--reason", "firmware-2.1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "drained device gpu1 (reason firmware-2.1, NoSchedule): 1 device(s): gpu1", done.stdout
    assert lines[1].startswith("1 claim(s) affected; they keep the devices until they end")
    assert lines[2].split() == ["DEVICE", "STATE", "NODE", "CLAIM", "PODS"]
    assert lines[3].split() == [
        "gpu1",
        "bound",
        "kind-worker",
        f"{NAMESPACE}/trainer-gpu",
        f"{NAMESPACE}/trainer",
    ]
    assert lines[4] == "tainted in the driver's ResourceSlices (the cluster serves no DeviceTaintRule)"
    d.wait_taint("gpu1", [(key, "firmware-2.1", "NoSchedule")], "gpu1 tainted NoSchedule")
    assert d.taints()["gpu2"] == []

    # The same drain again changes nothing; without a cluster the claim is shown by UID, and said so.
    again = d.cli("drain", "device", "gpu1", "--reason", "firmware-2.1", kube=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already drained device gpu1 (reason firmware-2.1, NoSchedule)")
    assert uid in again.stdout
    assert again.stdout.rstrip().endswith(
        "pods not listed: no cluster given (--kubeconfig or KUBECONFIG); claims are shown by UID"
    )

    # --evict makes it NoExecute: the controller republishes the taint with that effect.
    evict = d.cli("drain", "device", "gpu1", "--reason", "firmware-2.1", "--evict")
    assert evict.returncode == 0, evict.stderr
    assert evict.stdout.startswith("drained device gpu1 (reason firmware-2.1, NoExecute)")
    assert "pods that do not tolerate the drain taint are evicted" in evict.stdout
    d.wait_taint("gpu1", [(key, "firmware-2.1", "NoExecute")], "gpu1 tainted NoExecute")

    listed = d.cli("drain", "list")
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1].split()
    assert row[:4] == ["device", "gpu1", "firmware-2.1", "NoExecute"] and row[-1] == "1", listed.stdout

    # A node's drain covers the devices it holds through its fabric ports: gpu1, bound to kind-worker.
    node = d.cli("drain", "node", "kind-worker", "--reason", "port-maintenance")
    assert node.returncode == 0, node.stderr
    assert node.stdout.splitlines()[0] == (
        "drained node kind-worker (reason port-maintenance, NoSchedule): 1 device(s): gpu1"
    ), node.stdout
    assert f"{NAMESPACE}/trainer" in node.stdout
    assert d.cli("undrain", "node", "kind-worker").returncode == 0

    undone = d.cli("undrain", "device", "gpu1")
    assert undone.returncode == 0, undone.stderr
    assert undone.stdout.startswith("undrained device gpu1: 1 device(s) offered again"), undone.stdout
    d.wait_taint("gpu1", [], "gpu1's taint removed")
    twice = d.cli("undrain", "device", "gpu1")
    assert twice.returncode == 0 and twice.stdout.strip() == "device gpu1 was not drained: nothing changed"


def test_drain_a_switch_covers_its_devices_and_survives_a_manager_restart(drains: Drains) -> None:
    d = drains
    key = f"{d.driver}/drain"
    behind = sorted(n for n, dev in d.devices.items() if dev.get("switch") == "switch1")
    assert behind and "gpu4" in behind
    done = d.cli("drain", "switch", "switch1", "--reason", "psu-swap")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        f"drained switch switch1 (reason psu-swap, NoSchedule): {len(behind)} device(s): {', '.join(behind)}"
    )
    assert "no claim holds them: nothing is affected" in done.stdout
    for name in behind:
        d.wait_taint(name, [(key, "psu-swap", "NoSchedule")], f"{name} tainted with its switch")
    assert d.taints()["gpu0"] == []  # behind switch0

    d.manager.stop()
    d.manager.start()
    listed = d.cli("drain", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:4] == ["switch", "switch1", "psu-swap", "NoSchedule"]

    undone = d.cli("undrain", "switch", "switch1")
    assert undone.returncode == 0, undone.stderr
    for name in behind:
        d.wait_taint(name, [], f"{name} offered again")


def test_a_name_the_fabric_does_not_have_is_one_line_and_exit_2(drains: Drains) -> None:
    d = drains
    for args, says in (
        (("drain", "device", "gpu99"), "device gpu99 is not in the fabric inventory"),
        (("drain", "switch", "switch9"), "switch switch9 has no device in the fabric inventory; switches: "),
        (("drain", "node", "no-such-node"), "node no-such-node is not a node any fabric reaches"),
        (("undrain", "device", "gpu99"), "device gpu99 is not in the fabric inventory"),
        (("drain", "device", "gpu0", "--reason", "two words"), "--reason 'two words': "),
    ):
        done = d.cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("fabric-dra: error: ") and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    # Only operators drain: a controller's token (every node holds a plugin's) is refused.
    with httpx.Client(base_url=d.manager.url, timeout=30) as http:
        refused = http.post(
            "/api/v1/drains",
            json={"target": "device", "name": "gpu0"},
            headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
        )
    assert refused.status_code == 403 and refused.json()["code"] == "PermissionDenied", refused.text
    assert d.taints()["gpu0"] == []
    assert d.cli("drain", "list").stdout.strip() == "no drains"
