"""Injected faults on a running emulator, through the OEM admin API and ``fabric-dra emulator fault``."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from plumbing import procs
from tests.support.emulator import RunningEmulator, block_action, run_emulator, zone_add, zone_remove


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with run_emulator(tmp_path_factory.mktemp("faults")) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(emu: RunningEmulator) -> Iterator[None]:
    yield
    emu.reset_faults()
    client = emu.client()
    for target, host in emu.bound_hosts().items():
        uri, body = block_action(host, target, "RemoveResourceBlock")
        client.post(uri, json=body)


def _cli(emu: RunningEmulator, *args: str) -> subprocess.CompletedProcess[str]:
    return procs.run(["emulator", "fault", *args, "--url", emu.url, "--state-dir", str(emu.state_dir)])


def test_fail_binds_with_a_chosen_message_id(emu: RunningEmulator) -> None:
    result = _cli(emu, "fail-binds", "--device", "gpu0", "--count", "2", "--message-id", "ResourceInUse")
    assert result.returncode == 0, result.stderr
    assert "FailOperations active" in result.stdout
    client = emu.client()
    uri, body = zone_add("kind-worker", "gpu0")
    for _ in range(2):
        refused = client.post(uri, json=body)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "Base.1.22.ResourceInUse"
        assert "injected fault" in refused.json()["error"]["message"]
    assert emu.bound_hosts() == {}
    other_uri, other_body = zone_add("kind-worker", "gpu1")
    assert client.post(other_uri, json=other_body).status_code == 204, "other devices are not affected"
    assert client.post(uri, json=body).status_code == 204, "the third bind goes through"
    assert "no active faults" in _cli(emu, "list").stdout
    table = procs.run(["emulator", "bindings", "--url", emu.url, "--state-dir", str(emu.state_dir)])
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[1:]}
    assert rows == {"gpu0": "kind-worker", "gpu1": "kind-worker"}


def test_fail_unbind_with_a_status(emu: RunningEmulator) -> None:
    client = emu.client()
    uri, body = block_action("kind-worker2", "nvme0")
    assert client.post(uri, json=body).status_code == 204
    emu.inject(
        {"Kind": "FailOperations", "Target": "nvme0", "Operation": "unbind", "MessageId": "InternalError"}
    )
    uri, body = block_action("kind-worker2", "nvme0", "RemoveResourceBlock")
    failed = client.post(uri, json=body)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "Base.1.22.InternalError"
    assert emu.bound_hosts() == {"nvme0": "kind-worker2"}, "a failed unbind leaves the binding as it was"


def test_hung_task_resumes_on_reset(emu: RunningEmulator) -> None:
    assert _cli(emu, "hang-task", "--device", "gpu4").returncode == 0
    client = emu.client()
    uri, body = block_action("kind-worker3", "gpu4")
    accepted = client.post(uri, json=body)
    assert accepted.status_code == 202, "a hang makes even the instant profile answer with a task"
    monitor = accepted.headers["Location"]
    assert client.get(monitor).status_code == 202
    assert emu.bindings()["InFlight"][0]["Target"] == "gpu4"
    reset = _cli(emu, "reset")
    assert reset.returncode == 0 and "resumed 1 hung task" in reset.stdout
    final = client.get(monitor)
    while final.status_code == 202:
        final = client.get(monitor)
    assert final.status_code == 204
    assert emu.bound_hosts() == {"gpu4": "kind-worker3"}


def test_device_health(emu: RunningEmulator) -> None:
    emu.inject({"Kind": "DeviceHealth", "Device": "gpu2", "Health": "Critical"})
    client = emu.client()
    for uri in (
        "/redfish/v1/Fabrics/PCIe/Endpoints/gpu2",
        "/redfish/v1/Chassis/switch0/Processors/gpu2",
        "/redfish/v1/Chassis/switch0/PCIeDevices/gpu2",
        "/redfish/v1/CompositionService/ResourceBlocks/gpu2",
    ):
        assert client.get(uri).json()["Status"]["Health"] == "Critical", uri
    assert client.get("/redfish/v1/Chassis/switch0/Processors/gpu1").json()["Status"]["Health"] == "OK"


def test_pcie_errors_add_up_on_the_port_metrics_of_the_device(emu: RunningEmulator) -> None:
    client = emu.client()
    endpoint = client.get("/redfish/v1/Fabrics/PCIe/Endpoints/gpu2").json()
    port = client.get(endpoint["Links"]["ConnectedPorts"][0]["@odata.id"]).json()
    metrics_uri = port["Metrics"]["@odata.id"]
    counts = client.get(metrics_uri).json()["PCIeErrors"]
    assert set(counts.values()) == {0} and len(counts) == 8
    done = _cli(emu, "pcie-errors", "--device", "gpu2", "--correctable", "5", "--fatal", "1")
    assert done.returncode == 0, done.stderr
    emu.inject({"Kind": "PCIeErrors", "Device": "gpu2", "CorrectableErrorCount": 3, "ReplayCount": 2})
    counts = client.get(metrics_uri).json()["PCIeErrors"]
    assert (counts["CorrectableErrorCount"], counts["FatalErrorCount"], counts["ReplayCount"]) == (8, 1, 2)
    assert counts["NonFatalErrorCount"] == 0
    other = client.get("/redfish/v1/Fabrics/PCIe/Endpoints/gpu1").json()["Links"]["ConnectedPorts"][0]
    other_metrics = client.get(other["@odata.id"]).json()["Metrics"]["@odata.id"]
    assert client.get(other_metrics).json()["PCIeErrors"]["CorrectableErrorCount"] == 0
    emu.reset_faults()
    assert client.get(metrics_uri).json()["PCIeErrors"]["CorrectableErrorCount"] == 0
    unknown = _cli(emu, "pcie-errors", "--device", "gpu42", "--fatal", "1")
    assert unknown.returncode == 1 and "gpu42" in unknown.stderr and "Traceback" not in unknown.stderr


def test_port_down_blocks_binds_and_hides_bound_devices(emu: RunningEmulator) -> None:
    client = emu.client()
    uri, body = zone_add("kind-worker4", "gpu5")
    assert client.post(uri, json=body).status_code == 204
    pci = emu.sysfs("kind-worker4") / "bus" / "pci" / "devices"
    assert len(list(pci.iterdir())) == 1
    fault = emu.inject({"Kind": "PortDown", "Host": "kind-worker4", "Switch": "switch1"})
    port = client.get("/redfish/v1/Fabrics/PCIe/Switches/switch1/Ports/UP3").json()
    assert port["LinkStatus"] == "LinkDown" and port["Status"]["Health"] == "Critical"
    assert list(pci.iterdir()) == [], "the host no longer sees devices behind the dead port"
    assert emu.bound_hosts() == {"gpu5": "kind-worker4"}, "the fabric binding itself stays"
    blocked = client.post(*zone_add("kind-worker4", "fpga0")[:1], json=zone_add("kind-worker4", "fpga0")[1])
    assert blocked.status_code == 409
    assert blocked.json()["error"]["code"] == "Base.1.22.ConditionInRelatedResource"
    other_switch = zone_add("kind-worker4", "gpu0")
    assert client.post(other_switch[0], json=other_switch[1]).status_code == 204, "switch0's port is still up"
    httpx.delete(f"{emu.url}/redfish/v1/Oem/FabricDRA/Faults/{fault}", auth=emu.auth).raise_for_status()
    assert {p.name for p in pci.iterdir()} and len(list(pci.iterdir())) == 2
    uri, body = zone_remove("kind-worker4", "gpu0")
    assert client.post(uri, json=body).status_code == 204


def test_slow_responses(emu: RunningEmulator) -> None:
    emu.inject({"Kind": "SlowResponses", "Seconds": 5})
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{emu.url}/redfish/v1/Systems", auth=emu.auth, timeout=1.0)
    assert emu.get("/redfish/v1/Oem/FabricDRA/Faults")["Faults"][0]["Kind"] == "SlowResponses"


def test_dropped_connections(emu: RunningEmulator) -> None:
    emu.inject({"Kind": "DropConnections", "Count": 2})
    for _ in range(2):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{emu.url}/redfish/v1/Systems", auth=emu.auth, timeout=10.0)
    assert httpx.get(f"{emu.url}/redfish/v1/Systems", auth=emu.auth, timeout=10.0).status_code == 200


def test_unavailable_service(emu: RunningEmulator) -> None:
    emu.inject({"Kind": "Unavailable", "RetryAfterSeconds": 7})
    response = httpx.get(f"{emu.url}/redfish/v1/", timeout=10.0)
    assert response.status_code == 503 and response.headers["Retry-After"] == "7"
    assert response.json()["error"]["code"] == "Base.1.22.ServiceTemporarilyUnavailable"


def test_expire_sessions(emu: RunningEmulator) -> None:
    login = httpx.post(
        f"{emu.url}/redfish/v1/SessionService/Sessions",
        json={"UserName": emu.username, "Password": emu.password},
    )
    token = {"X-Auth-Token": login.headers["X-Auth-Token"]}
    assert httpx.get(f"{emu.url}/redfish/v1/Systems", headers=token).status_code == 200
    emu.inject({"Kind": "ExpireSessions"})
    assert httpx.get(f"{emu.url}/redfish/v1/Systems", headers=token).status_code == 401


def test_bad_fault_requests(emu: RunningEmulator) -> None:
    unknown = _cli(emu, "health", "--device", "gpu42")
    assert unknown.returncode == 1
    assert "gpu42" in unknown.stderr and "Traceback" not in unknown.stderr
    response = httpx.post(
        f"{emu.url}/redfish/v1/Oem/FabricDRA/Faults", json={"Kind": "Meteor"}, auth=emu.auth, timeout=10
    )
    assert response.status_code == 400
    message_id = response.json()["error"]["@Message.ExtendedInfo"][0]["MessageId"]
    assert message_id == "Base.1.22.PropertyValueFormatError"
    nowhere = procs.run(["emulator", "fault", "list", "--url", "http://127.0.0.1:9"])
    assert nowhere.returncode == 1 and nowhere.stderr.count("\n") == 1 and "cannot reach" in nowhere.stderr


def test_faults_survive_a_restart(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        emu.inject({"Kind": "DeviceHealth", "Device": "nic0", "Health": "Warning"})
        emu.kill()
        emu.restart()
        assert emu.get("/redfish/v1/Fabrics/PCIe/Endpoints/nic0")["Status"]["Health"] == "Warning"
        emu.reset_faults()
        assert emu.get("/redfish/v1/Fabrics/PCIe/Endpoints/nic0")["Status"]["Health"] == "OK"


# -- the device Reset actions (#Processor.Reset, #Drive.Reset) and their fault ---------------------
# What the manager cleans a warm device with between tenants. A reset is counted on the device's
# binding (Resets, LastReset in the OEM binding table); a FailOperations fault with Operation
# "reset" fails it; "any" (any bind or unbind) does not.

GPU = "/redfish/v1/Chassis/switch0/Processors/gpu0"
DRIVE = "/redfish/v1/Chassis/switch0/Drives/nvme0"


def binding(emu: RunningEmulator, target: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [b for b in emu.bindings()["Bindings"] if b["Target"] == target]
    assert len(found) == 1, f"{target} is not bound once"
    return found[0]


def test_the_device_resources_offer_their_reset_action(emu: RunningEmulator) -> None:
    client = emu.client()
    for uri, schema in ((GPU, "Processor"), (DRIVE, "Drive")):
        actions = client.get(uri).json()["Actions"]
        assert actions == {
            f"#{schema}.Reset": {
                "target": f"{uri}/Actions/{schema}.Reset",
                "ResetType@Redfish.AllowableValues": ["ForceRestart", "GracefulRestart"],
            }
        }
    # The PCIe function has none (PCIeFunction defines no action).
    assert "Actions" not in client.get("/redfish/v1/Chassis/switch0/PCIeDevices/gpu0").json()


def test_a_reset_is_counted_on_the_binding(emu: RunningEmulator) -> None:
    client = emu.client()
    uri, body = zone_add("kind-worker", "gpu0")
    assert client.post(uri, json=body).status_code < 300
    assert binding(emu, "gpu0")["Resets"] == 0 and binding(emu, "gpu0")["LastReset"] is None
    done = client.post(f"{GPU}/Actions/Processor.Reset", json={"ResetType": "ForceRestart"})
    assert done.status_code == 204, done.text
    assert client.post(f"{GPU}/Actions/Processor.Reset", json={}).status_code == 204  # default reset
    bound = binding(emu, "gpu0")
    assert bound["Resets"] == 2 and bound["LastReset"] is not None
    assert bound["Host"] == "kind-worker"  # still bound where it was
    refused = client.post(f"{GPU}/Actions/Processor.Reset", json={"ResetType": "Sideways"})
    assert refused.status_code == 400
    # A Resource.ResetType the action does not list (DSP0266 "Allowable values") is refused too.
    unlisted = client.post(f"{GPU}/Actions/Processor.Reset", json={"ResetType": "On"})
    assert unlisted.status_code == 400, unlisted.text
    assert "ActionParameterValueNotInList" in unlisted.text
    assert binding(emu, "gpu0")["Resets"] == 2
    # A drive resets the same way; an unbound device too, with nothing to count it on.
    assert client.post(f"{DRIVE}/Actions/Drive.Reset", json={}).status_code == 204


def test_a_reset_fault_fails_resets_only(emu: RunningEmulator) -> None:
    client = emu.client()
    uri, body = zone_add("kind-worker", "gpu0")
    assert client.post(uri, json=body).status_code < 300
    emu.inject({"Kind": "FailOperations", "Operation": "any", "Target": "gpu0"})
    # "any" is any bind or unbind: the reset goes through, and the fault is still there.
    assert client.post(f"{GPU}/Actions/Processor.Reset", json={}).status_code == 204
    emu.reset_faults()
    result = _cli(
        emu, "fail-binds", "--device", "gpu0", "--operation", "reset", "--message-id", "GeneralError"
    )
    assert result.returncode == 0, result.stderr
    failed = client.post(f"{GPU}/Actions/Processor.Reset", json={})
    assert failed.status_code == 500
    assert "GeneralError" in failed.text and "refused to reset gpu0" in failed.text
    assert binding(emu, "gpu0")["Resets"] == 1  # the failed one is not counted
    # Used up (Count 1): the next one resets.
    assert client.post(f"{GPU}/Actions/Processor.Reset", json={}).status_code == 204
    assert binding(emu, "gpu0")["Resets"] == 2
