"""Security checks with the real processes.

* Node scoping: the manager asks the API test server (TokenReview) who a token is; a plugin's
  token, bound to a pod on node A, cannot attach, detach or report for node B — also not through the
  real plugin process, whose error then says what to check.
* Credentials: after a full flow (binding-condition claim, plain claims, a refused bind) and a run
  with a failing Redfish login, no log line of any process, no /metrics output and no error a client
  received contains the Redfish password, a live Redfish session token, a Basic authorization or a
  bearer token.
* TLS is verified by default: the manager refuses a Redfish service whose CA it was not given
  unless --redfish-insecure; the plugin and the controller refuse a manager whose CA they were not
  given.
* The emulator and the manager refuse to run without authentication unless told
  --insecure-no-auth (both command lines, as processes).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from kube_standin.kubelet_client import DraCallError
from manager_api.client import ManagerClient
from manager_api.errors import PermissionDenied, Unauthenticated
from manager_api.models import BindingState, DeviceType
from plumbing import procs
from tests.integration.reliability.stack import (
    CONTROLLER_TOKEN,
    NAMESPACE,
    NODE,
    OPERATOR_TOKEN,
    PLUGIN_TOKEN,
    ROOT,
    Stack,
    _target,
    kubelet_on,
    ref_of,
    running_stack,
)
from tests.support.emulator import run_emulator
from tests.support.fabric_manager import running_manager
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow(seconds=23), pytest.mark.timeout(150)]


def _operator() -> dict[str, str]:
    """The manager's /metrics is for operators (and the metrics scraper)."""
    return {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(plugin_args=["--attach-retry-seconds", "2"]) as running:
        running.plugin.start()
        running.controller.start()
        yield running


def _sa_token(stack: Stack, account: str, node: str | None) -> str:
    assert stack.apiserver is not None
    pod = f"{account}-{node}" if node else None
    return stack.apiserver.service_account_token(NAMESPACE, account, node=node, pod=pod)


def test_a_plugin_token_acts_only_for_its_own_node(stack: Stack) -> None:
    node_a = _sa_token(stack, "fabric-dra-plugin", NODE)
    node_b = _sa_token(stack, "fabric-dra-plugin", "kind-worker2")
    unbound = _sa_token(stack, "fabric-dra-plugin", None)
    controller = _sa_token(stack, "fabric-dra-controller", None)
    device, other = stack.free_devices(DeviceType.GPU)[:2]
    claim, other_claim = stack.create_claim(device), stack.create_claim(other, node="kind-worker2")
    uid, other_uid = claim["metadata"]["uid"], other_claim["metadata"]["uid"]

    async def scenario() -> None:
        async with (
            ManagerClient(stack.manager_url, token=node_a) as a,
            ManagerClient(stack.manager_url, token=node_b) as b,
        ):
            assert (await a.attach(device.name, NODE, uid, wait_seconds=30)).state.value == "attached"
            for call in (
                a.attach(other.name, "kind-worker2", other_uid, wait_seconds=5),
                a.detach(other.name, "kind-worker2", other_uid),
                a.report_claims("kind-worker2", {other_uid: [other.name]}),
                b.detach(device.name, NODE, uid),  # B cannot take A's device away
                b.attach(device.name, NODE, uid),
            ):
                with pytest.raises(PermissionDenied) as refused:
                    await call
                assert "may attach or detach only for it" in refused.value.message
            await a.report_claims(NODE, {uid: [device.name]})
        assert stack.bound_hosts() == {_target(device): NODE}  # nothing B asked for happened
        async with ManagerClient(stack.manager_url, token=unbound) as c:
            with pytest.raises((PermissionDenied, Unauthenticated)):
                await c.attach(other.name, "kind-worker2", other_uid)  # not bound to a pod on a node
        async with ManagerClient(stack.manager_url, token="not-a-token-anyone-issued-0000") as c:
            with pytest.raises(Unauthenticated):
                await c.devices()
        async with ManagerClient(stack.manager_url, token=OPERATOR_TOKEN) as c:
            with pytest.raises(PermissionDenied):
                await c.detach(device.name, NODE, uid)  # read-only
        async with ManagerClient(stack.manager_url, token=controller) as c:  # any node
            assert (
                await c.attach(other.name, "kind-worker2", other_uid, wait_seconds=30)
            ).node == "kind-worker2"
            await c.detach(other.name, "kind-worker2", other_uid, wait_seconds=30)
        async with ManagerClient(stack.manager_url, token=node_a) as a:
            await a.detach(device.name, NODE, uid, wait_seconds=30)

    asyncio.run(scenario())
    assert stack.bound_hosts() == {}

    # The real plugin of kind-worker holding kind-worker2's token: refused, and told what to check.
    (stack.root / "plugin.token").write_text(node_b + "\n")
    stack.plugin.start()

    async def through_the_plugin() -> None:
        async with kubelet_on(stack) as kubelet:
            with pytest.raises(DraCallError) as failed:
                await (await kubelet.plugin()).prepare([ref_of(claim)])
            error = str(failed.value)
            for part in (f"device {device.name}", f"node {NODE}", "may attach or detach only for it"):
                assert part in error, error
            assert "check the plugin's token (--manager-token-file" in error

    try:
        asyncio.run(through_the_plugin())
    finally:
        (stack.root / "plugin.token").write_text(PLUGIN_TOKEN + "\n")
        stack.plugin.start()
    assert stack.bound_hosts() == {}


def _secrets(stack: Stack, extra: list[str]) -> dict[str, str]:
    creds = json.loads((stack.emu_state / "credentials.json").read_text())
    basic = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
    found = {
        "Redfish password": creds["password"],
        "Redfish Basic authorization": basic,
        "plugin token": PLUGIN_TOKEN,
        "controller token": CONTROLLER_TOKEN,
        "operator token": OPERATOR_TOKEN,
    }
    found.update({f"secret {i}": value for i, value in enumerate(extra)})
    assert all(len(v) >= 16 for v in found.values())
    return found


def _live_session_tokens(stack: Stack, texts: list[str]) -> list[str]:
    """Strings in ``texts`` shaped like an emulator session token that the emulator accepts now."""
    candidates = {
        m for text in texts for m in re.findall(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])", text)
    }
    live = []
    for token in candidates:
        answer = httpx.get(f"{stack.emulator_url}{ROOT}/Systems", headers={"X-Auth-Token": token}, timeout=10)
        if answer.status_code == 200:
            live.append(token)
    return live


def test_credentials_never_in_logs_metrics_or_errors(stack: Stack, tmp_path: Path) -> None:
    seen: list[str] = []  # every error and status text a client got
    gpu, nvme, conditioned = stack.free_devices(DeviceType.GPU)[:3]
    plain, refused, bc = stack.create_claim(gpu), stack.create_claim(nvme), None

    async def full_flow() -> None:
        async with kubelet_on(stack, watch_health=True) as kubelet:
            plugin = await kubelet.plugin()
            await kubelet.prepare_until_done(ref_of(plain))
            stack.inject({"Kind": "FailOperations", "Target": _target(nvme), "Operation": "bind", "Count": 1})
            with pytest.raises(DraCallError) as failed:
                await plugin.prepare([ref_of(refused)])
            seen.append(str(failed.value))
            await kubelet.prepare_until_done(ref_of(refused))
            for claim in (plain, refused):
                await kubelet.unprepare_until_done(ref_of(claim))

    asyncio.run(full_flow())
    bc = stack.create_claim(conditioned, binding_conditions=True)
    wait_until(
        lambda: (c := stack.condition(bc, conditioned, "Attached")) is not None and c["status"] == "True",
        what="Attached=True",
    )
    stack.deallocate(bc)
    wait_until(lambda: _target(conditioned) not in stack.bound_hosts(), what="the controller's release")
    status = procs.run(
        ["status", "--manager-url", stack.manager_url, "--output", "json"],
        env={"FABRIC_DRA_TOKEN": OPERATOR_TOKEN, "PATH": "/usr/bin:/bin"},
    )
    assert status.returncode == 0, status.stderr
    seen.append(status.stdout + status.stderr)
    metrics = {
        "manager": httpx.get(f"{stack.manager_url}/metrics", headers=_operator(), timeout=10).text,
        "controller": httpx.get(f"http://127.0.0.1:{stack.controller_port}/metrics", timeout=10).text,
        "plugin": httpx.get(f"http://127.0.0.1:{stack.plugin_metrics_port}/metrics", timeout=10).text,
    }
    live_before = _live_session_tokens(stack, [*metrics.values(), *seen, *_logs(stack)])

    # A failing login: the right user name, a wrong password.
    creds = json.loads((stack.emu_state / "credentials.json").read_text())
    wrong = "wrong-password-Qm7rT2vX9kLp"
    bad = tmp_path / "bad-credentials.json"
    bad.write_text(json.dumps({"username": creds["username"], "password": wrong}))
    stack.redfish_args = ["--redfish-credentials-file", str(bad)]
    try:
        stack.manager.start()
        reason = wait_until(
            lambda: (
                (r := httpx.get(f"{stack.manager_url}/readyz", timeout=10)).status_code == 503
                and "refused" in r.text
                and r.json()["reason"]
            ),
            what="/readyz saying the login was refused",
        )
        assert "check the credentials file" in reason
        seen.append(reason)
        claim = stack.create_claim(gpu)

        async def refused_login() -> None:
            async with kubelet_on(stack) as kubelet:
                with pytest.raises(DraCallError) as failed:
                    await (await kubelet.plugin()).prepare([ref_of(claim)])
                seen.append(str(failed.value))
                assert "refused" in seen[-1] and "credentials" in seen[-1]

        asyncio.run(refused_login())
        metrics["manager, failing login"] = httpx.get(
            f"{stack.manager_url}/metrics", headers=_operator(), timeout=10
        ).text
    finally:
        stack.redfish_args = []
        stack.start_manager()
    stack.delete_claim(claim)

    secrets = _secrets(stack, [wrong])
    logs = _logs(stack)
    names = _log_names(stack)
    assert {"emulator.log", "manager.log", "plugin.log", "controller.log"} <= set(names), names
    assert all(text.strip() for text in logs), names
    for needle in ("attach started", "Redfish session created", "was refused", "claim prepared", "bound"):
        assert any(needle in text for text in logs), f"no log line says {needle!r}: the flow did not run"
    leaks = [
        f"{what} in {where}"
        for where, text in [
            *zip(_log_names(stack), logs, strict=True),
            *metrics.items(),
            *(("error", t) for t in seen),
        ]
        for what, secret in secrets.items()
        if secret in text
    ]
    assert leaks == []
    assert live_before == [] and _live_session_tokens(stack, [*metrics.values(), *seen, *logs]) == []
    for text in logs:
        for line in text.splitlines():
            assert not re.search(r"(?i)(x-auth-token|authorization)\W+[A-Za-z0-9_+/=-]{12}", line), line


def _log_files(stack: Stack) -> list[Path]:
    return sorted(p for p in stack.root.rglob("*.log") if p.is_file())


def _log_names(stack: Stack) -> list[str]:
    return [str(p.relative_to(stack.root)) for p in _log_files(stack)]


def _logs(stack: Stack) -> list[str]:
    return [p.read_text(errors="replace") for p in _log_files(stack)]


def test_tls_is_verified_and_a_certificate_for_another_host_is_refused(stack: Stack, tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    for name, host in (("right", "127.0.0.1"), ("wrong", "fabric.example.invalid")):
        cert = ca.issue_cert(host)
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.pem"))
        cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
    device = stack.free_devices(DeviceType.GPU)[0]
    claim = stack.create_claim(device)

    def refused_by_manager(needle: str) -> str:
        return wait_until(
            lambda: (
                needle in (r := httpx.get(f"{stack.manager_url}/readyz", timeout=10)).text
                and str(r.json()["reason"])
            ),
            what=f"the manager's /readyz saying {needle!r}",
        )

    try:
        # The Redfish service's certificate names another host. Its CA unknown to the manager:
        # refused. The right CA: still refused, the name does not match.
        stack.emulator_tls = (tmp_path / "wrong.pem", tmp_path / "wrong.key")
        stack.manager.stop()
        stack.emulator.start()
        stack.manager.start()
        reason = refused_by_manager("certificate verify failed")
        assert "TLS" in reason
        assert "give the CA that signed the service's certificate with --redfish-ca-file" in reason
        stack.redfish_args = ["--redfish-ca-file", str(tmp_path / "ca.pem")]
        stack.manager.start()
        reason = refused_by_manager("mismatch")
        assert "TLS" in reason and stack.emulator_url in reason and "not valid for '127.0.0.1'" in reason
        assert "certificate does not name the host of --redfish-url" in reason

        async def mismatch() -> None:  # what the pod's event says
            async with kubelet_on(stack) as kubelet:
                with pytest.raises(DraCallError) as failed:
                    await (await kubelet.plugin()).prepare([ref_of(claim)])
                error = str(failed.value)
                for part in (
                    f"device {device.name} could not be attached to node {NODE}",
                    "certificate is not valid for '127.0.0.1'",
                    "does not name the host of --redfish-url",
                    "the fabric manager keeps the attach",
                ):
                    assert part in error, error

        asyncio.run(mismatch())
        assert _target(device) not in stack.bound_hosts()

        # Only the explicit flag turns verification off, and the manager says so. It serves TLS
        # itself now; the plugin and the controller are not given its CA: they refuse it.
        stack.redfish_args = ["--redfish-insecure"]
        stack.manager_tls = (tmp_path / "right.pem", tmp_path / "right.key")
        stack.manager_ca = tmp_path / "ca.pem"
        stack.start_manager()
        assert "TLS verification" in stack.manager.log_since_start()
        stack.manager_ca = None
        stack.plugin.start()
        stack.controller.start()

        async def refused() -> None:
            async with kubelet_on(stack) as kubelet:
                with pytest.raises(DraCallError) as failed:
                    await (await kubelet.plugin()).prepare([ref_of(claim)])
                error = str(failed.value)
                assert "its TLS certificate was not accepted" in error, error
                assert "check --manager-ca-file" in error, error

        asyncio.run(refused())
        wait_until(
            lambda: "its TLS certificate was not accepted" in stack.controller.log_since_start(),
            what="the controller refusing the manager's certificate",
        )
        assert _target(device) not in stack.bound_hosts()

        # Given the CA, all of them work.
        stack.manager_ca = tmp_path / "ca.pem"
        stack.plugin.start()
        stack.controller.start()

        async def works() -> None:
            async with kubelet_on(stack) as kubelet:
                await kubelet.prepare_until_done(ref_of(claim))
                stack.assert_prepared(claim, device)
                await kubelet.unprepare_until_done(ref_of(claim))

        asyncio.run(works())
    finally:
        stack.emulator_tls = stack.manager_tls = stack.manager_ca = None
        stack.redfish_args = []
        stack.manager.stop()
        stack.emulator.start()
        stack.start_manager()
        stack.plugin.start()
        stack.controller.start()
    assert stack.device(device.name).state is BindingState.FREE


def test_emulator_and_manager_refuse_to_run_without_authentication(stack: Stack, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return procs.run(args)

    # The manager: no token source → one line, exit 1.
    refused = run(
        "manager",
        "serve",
        "--redfish-url",
        "http://127.0.0.1:9",
        "--redfish-auth",
        "none",
        "--state-dir",
        str(tmp_path / "m"),
    )
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert "refusing to start without authentication" in line and "--insecure-no-auth" in line
    # The emulator: an empty password is no authentication → one line, exit 1.
    empty = run("emulator", "serve", "--state-dir", str(tmp_path / "e0"), "--password", "")
    assert empty.returncode == 1
    (line,) = empty.stderr.strip().splitlines()
    assert "--password is empty" in line

    # By default the emulator wants credentials (the stack's runs with its defaults); only
    # --insecure-no-auth serves without them, and says so.
    assert httpx.get(f"{stack.emulator_url}{ROOT}/Systems", timeout=10).status_code == 401
    assert "authentication is disabled" not in stack.emulator.log_file.read_text()
    with run_emulator(tmp_path, extra_args=["--insecure-no-auth"], name="emulator-open") as emulator:
        answer = httpx.get(f"{emulator.url}{ROOT}/Systems", timeout=10)
        assert answer.status_code == 200, answer.text
        assert emulator.process is not None
        assert "authentication is disabled" in emulator.process.tail(50)

    # The manager with --insecure-no-auth runs, says so, and serves callers without a token.
    with running_manager(
        tmp_path,
        "http://127.0.0.1:9",
        args=["--redfish-auth", "none", "--state-dir", str(tmp_path / "m"), "--insecure-no-auth"],
        name="manager-open",
        ready=False,
    ) as manager:
        # Started without waiting for /readyz: until it has taken up its (only) replica's lead it
        # answers 503 NotLeader, which says nothing of authentication.
        deadline = time.monotonic() + 60
        answer = httpx.get(f"{manager.address}/api/v1/operations", timeout=10)
        while answer.status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            answer = httpx.get(f"{manager.address}/api/v1/operations", timeout=10)
        assert answer.status_code == 200, answer.text
        assert "authentication is OFF (--insecure-no-auth)" in manager.tail(50)
