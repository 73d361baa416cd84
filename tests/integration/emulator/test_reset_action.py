"""The device ``Reset`` actions of a running emulator (``#Processor.Reset``, ``#Drive.Reset``): what
the manager cleans a warm device with between tenants. A reset is counted on the device's binding
(``Resets``, ``LastReset`` in the OEM binding table); a ``FailOperations`` fault with
``Operation: reset`` fails it; ``any`` (any bind or unbind) does not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.emulator import RunningEmulator, block_action, run_emulator, zone_add

GPU = "/redfish/v1/Chassis/switch0/Processors/gpu0"
DRIVE = "/redfish/v1/Chassis/switch0/Drives/nvme0"


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with run_emulator(tmp_path_factory.mktemp("resets")) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(emu: RunningEmulator) -> Iterator[None]:
    yield
    emu.reset_faults()
    client = emu.client()
    for target, host in emu.bound_hosts().items():
        uri, body = block_action(host, target, "RemoveResourceBlock")
        client.post(uri, json=body)


def binding(emu: RunningEmulator, target: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [b for b in emu.bindings()["Bindings"] if b["Target"] == target]
    assert len(found) == 1, f"{target} is not bound once"
    return found[0]


def test_the_device_resources_offer_their_reset_action(emu: RunningEmulator) -> None:
    client = emu.client()
    for uri, schema in ((GPU, "Processor"), (DRIVE, "Drive")):
        actions = client.get(uri).json()["Actions"]
        assert actions == {f"#{schema}.Reset": {"target": f"{uri}/Actions/{schema}.Reset"}}
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
    result = subprocess.run(
        [
            *(sys.executable, "-m", "fabric_dra", "emulator", "fault", "fail-binds"),
            *("--device", "gpu0", "--operation", "reset", "--message-id", "GeneralError"),
            *("--url", emu.url, "--state-dir", str(emu.state_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    failed = client.post(f"{GPU}/Actions/Processor.Reset", json={})
    assert failed.status_code == 500
    assert "GeneralError" in failed.text and "refused to reset gpu0" in failed.text
    assert binding(emu, "gpu0")["Resets"] == 1  # the failed one is not counted
    # Used up (Count 1): the next one resets.
    assert client.post(f"{GPU}/Actions/Processor.Reset", json={}).status_code == 204
    assert binding(emu, "gpu0")["Resets"] == 2
