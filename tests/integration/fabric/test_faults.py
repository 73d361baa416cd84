"""Injected fabric faults end in the states docs/manager.md documents ("Failures and their end
states"), checked against the emulator's own binding table.

One TLS emulator and one manager (short task and operation timeouts) serve the whole module;
every test clears its faults and leaves the fabric empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from fabric_dra_testbed.stack import Role
from manager_api.client import ManagerClient
from manager_api.errors import AttachTimeout, BindFailed, DeviceUnhealthy, FabricUnavailable
from manager_api.models import AttachmentState, BindingState, Health
from tests.integration.fabric.conftest import CONTROLLER_TOKEN, FabricAdmin, assert_no_secrets, manager_for
from tests.support.uids import claim_uid

NODE = "kind-worker"


@pytest.fixture(scope="module")
def manager(fabric: FabricAdmin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Role]:
    work = tmp_path_factory.mktemp("faults")
    with manager_for(
        fabric, work, "--task-timeout", "2", "--operation-timeout", "4", "--poll-seconds", "1"
    ) as process:
        yield process
    assert_no_secrets([work / "manager.log"], fabric.emulator.password, CONTROLLER_TOKEN)


@pytest_asyncio.fixture
async def client(manager: Role, fabric: FabricAdmin) -> AsyncIterator[ManagerClient]:
    async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
        yield client
        fabric.reset_faults()
        await asyncio.sleep(0.3)
        for device in (await client.inventory()).devices:
            if device.claim_uid and device.node:
                await client.detach(device.name, device.node, device.claim_uid, wait_seconds=20)
    assert fabric.bound_hosts() == {}


async def eventually_state(
    client: ManagerClient, device: str, state: BindingState, within: float = 15
) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while (current := (await client.device(device)).state) != state:
        assert asyncio.get_running_loop().time() < deadline, f"{device} still {current}, wanted {state}"
        await asyncio.sleep(0.1)


async def test_bind_failure_leaves_nothing_half_done(client: ManagerClient, fabric: FabricAdmin) -> None:
    fabric.inject({"Kind": "FailOperations", "Target": "gpu0", "MessageId": "OperationFailed"})
    with pytest.raises(BindFailed) as failed:
        await client.attach("gpu0", NODE, claim_uid("claim-fail"), wait_seconds=20)
    assert failed.value.message_id is not None and failed.value.message_id.endswith("OperationFailed")
    assert fabric.bound_hosts() == {}
    await eventually_state(client, "gpu0", BindingState.FREE)
    # the fault was used up: the next attempt binds
    attachment = await client.attach("gpu0", NODE, claim_uid("claim-fail"), wait_seconds=20)
    assert attachment.state == AttachmentState.ATTACHED and fabric.bound_hosts() == {"gpu0": NODE}


async def test_hung_task_times_out_is_cancelled_and_rolled_back(
    client: ManagerClient, fabric: FabricAdmin
) -> None:
    fabric.inject({"Kind": "HangTasks", "Target": "gpu1"})
    with pytest.raises(AttachTimeout, match="still running"):
        await client.attach("gpu1", NODE, claim_uid("claim-hang"), wait_seconds=20)
    await eventually_state(client, "gpu1", BindingState.FREE)
    assert fabric.bound_hosts() == {}
    assert (await client.operations())[-1].state.value == "failed"


async def test_slow_fabric_answers_202_then_attached(client: ManagerClient, fabric: FabricAdmin) -> None:
    fabric.inject({"Kind": "SlowResponses", "Seconds": 0.4})
    first = await client.attach("gpu2", NODE, claim_uid("claim-slow"), wait_seconds=0.2)
    assert first.state == AttachmentState.ATTACHING and first.operation_id
    done = await client.attach("gpu2", NODE, claim_uid("claim-slow"), wait_seconds=30)
    assert done.state == AttachmentState.ATTACHED and done.operation_id == first.operation_id
    operation = await client.operation(first.operation_id)
    assert operation.state.value == "succeeded"
    assert fabric.bound_hosts() == {"gpu2": NODE}


async def test_session_expiry_is_survived(client: ManagerClient, fabric: FabricAdmin, manager: Role) -> None:
    fabric.inject({"Kind": "ExpireSessions"})
    attachment = await client.attach("gpu3", NODE, claim_uid("claim-session"), wait_seconds=20)
    assert attachment.state == AttachmentState.ATTACHED and fabric.bound_hosts() == {"gpu3": NODE}
    assert "Redfish session rejected, logging in again" in manager.log_file.read_text()


async def test_lost_connection_is_resolved_by_reading(client: ManagerClient, fabric: FabricAdmin) -> None:
    fabric.inject({"Kind": "DropConnections", "Count": 2})
    attachment = await client.attach("nvme0", NODE, claim_uid("claim-drop"), wait_seconds=20)
    assert attachment.state == AttachmentState.ATTACHED and fabric.bound_hosts() == {"nvme0": NODE}


async def test_unreachable_fabric_is_503_and_the_attach_completes_later(
    client: ManagerClient, fabric: FabricAdmin
) -> None:
    fabric.inject({"Kind": "Unavailable", "RetryAfterSeconds": 1})
    with pytest.raises(FabricUnavailable) as unavailable:
        await client.attach("fpga0", NODE, claim_uid("claim-down"), wait_seconds=20)
    assert "ServiceTemporarilyUnavailable" in (unavailable.value.message_id or "")
    assert (await client.device("fpga0")).state == BindingState.ATTACHING  # the intent is kept
    fabric.reset_faults()
    await eventually_state(client, "fpga0", BindingState.BOUND, within=20)
    assert fabric.bound_hosts() == {"fpga0": NODE}
    again = await client.attach("fpga0", NODE, claim_uid("claim-down"))
    assert again.state == AttachmentState.ATTACHED


async def test_critical_device_is_reported_and_refused(client: ManagerClient, fabric: FabricAdmin) -> None:
    fabric.inject({"Kind": "DeviceHealth", "Device": "gpu5", "Health": "Critical"})
    deadline = asyncio.get_running_loop().time() + 15
    while (await client.device("gpu5")).health != Health.CRITICAL:
        assert asyncio.get_running_loop().time() < deadline, "health change not seen"
        await asyncio.sleep(0.1)
    with pytest.raises(DeviceUnhealthy, match="Critical"):
        await client.attach("gpu5", NODE, claim_uid("claim-sick"))
    assert fabric.bound_hosts() == {}


def test_logs_have_no_secrets(tmp_path: Path, fabric: FabricAdmin) -> None:
    assert_no_secrets([fabric.emulator.log_file], fabric.emulator.password)
