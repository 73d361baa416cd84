"""Faults of the fabric, end to end: kubelet-protocol client → plugin → manager → emulator.

Each fault ends in the behaviour docs/reliability.md states, and where the pod cannot get its
device the error the plugin returns — what the kubelet shows as FailedPrepareDynamicResources —
names the device, the node, the cause and the next step. Every case ends with nothing bound and
the device bound exactly once while it was used.

A TLS certificate that does not name the Redfish host is in test_security.py (with the other TLS
checks). Timeouts are shortened (manager --task-timeout 2 --operation-timeout 3, plugin
--attach-retry-seconds 3) so a long outage, which outlives all of them several times, takes
seconds; "every Redfish call is slow" is real: 2 s per answer, the attach five times that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from kube_standin.kubelet_client import ClaimRef, DraCallError, DRAPluginClient
from manager_api.models import BindingState, Device, DeviceType, Health
from tests.integration.reliability.stack import (
    NODE,
    Kubelet,
    Stack,
    _target,
    kubelet_on,
    ref_of,
    running_stack,
)
from tests.support.waiting import eventually, wait_until

pytestmark = [pytest.mark.slow(seconds=25), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(
        manager_args=["--task-timeout", "2", "--operation-timeout", "3"],
        plugin_args=["--attach-retry-seconds", "3"],
    ) as running:
        running.plugin.start()
        yield running


@pytest.fixture(autouse=True)
def no_fault_left(stack: Stack) -> Iterator[None]:
    """A case that fails half-way must not leave its fault to the next one."""
    yield
    stack.reset_faults()


async def _error(plugin: DRAPluginClient, ref: ClaimRef, deadline: float | None = None) -> str:
    """The text the kubelet puts in the pod's FailedPrepareDynamicResources event."""
    with pytest.raises(DraCallError) as failed:
        await plugin.prepare([ref], deadline=deadline)
    return str(failed.value)


async def _prepare_and_release(
    stack: Stack, kubelet: Kubelet, claim: dict[str, object], device: Device
) -> None:
    ref = ref_of(claim)
    answer = await kubelet.prepare_until_done(ref)
    stack.assert_prepared(claim, device, answer)
    await kubelet.unprepare_until_done(ref)
    stack.assert_released(claim, device)


def _start(stack: Stack, kind: DeviceType = DeviceType.GPU) -> tuple[Device, dict[str, object], int, int]:
    device = stack.free_devices(kind)[0]
    return device, stack.create_claim(device), stack.monitor.mark(), stack.emulator_log_size()


def _names_device_node_cause_and_step(error: str, device: Device, *cause_and_step: str) -> None:
    for part in (f"device {device.name}" if "still attaching" not in error else device.name, f"node {NODE}"):
        assert part in error, error
    for part in cause_and_step:
        assert part in error, error


def test_bind_failure(stack: Stack) -> None:
    """The fabric fails the bind: the claim gets the fabric's own MessageId, nothing stays bound,
    and the kubelet's retry attaches the device."""
    device, claim, mark, offset = _start(stack)
    stack.inject({"Kind": "FailOperations", "Target": _target(device), "Operation": "bind", "Count": 1})

    async def scenario() -> None:
        async with kubelet_on(stack) as kubelet:
            error = await _error(await kubelet.plugin(), ref_of(claim))
            _names_device_node_cause_and_step(
                error,
                device,
                "could not be attached",
                "Base.1.22.OperationFailed",
                "was not left bound and the kubelet retries",
            )
            assert _target(device) not in stack.bound_hosts()
            # the manager answers the failed attach first and then rolls its entry back
            # ("detaching", confirmed against the fabric), so the device is free soon after
            await eventually(
                lambda: stack.device(device.name).state is BindingState.FREE, what=f"{device.name} free again"
            )
            assert stack.spec_files(claim["metadata"]["uid"]) == []  # type: ignore[index]
            await _prepare_and_release(stack, kubelet, claim, device)

    asyncio.run(scenario())
    stack.assert_bound_once(device, mark, offset)


def test_hung_task(stack: Stack) -> None:
    """Every bind task of the device hangs: each is cancelled after --task-timeout and rolled back;
    once the plugin's retry budget is spent the claim hears why and that nothing stayed bound; once
    the fabric works again the kubelet's retry gets the device."""
    device, claim, mark, offset = _start(stack)
    stack.inject({"Kind": "HangTasks", "Target": _target(device), "Count": 1000})

    async def scenario() -> None:
        async with kubelet_on(stack) as kubelet:
            error = await _error(await kubelet.plugin(), ref_of(claim))
            _names_device_node_cause_and_step(
                error,
                device,
                "could not be attached",
                "did not finish bind",
                "the fabric task was cancelled and rolled back; the kubelet retries",
            )
            assert "task cancelled" in stack.emulator.log_since_start()
            assert _target(device) not in stack.bound_hosts()  # each hung task was rolled back
            stack.reset_faults()
            await _prepare_and_release(stack, kubelet, claim, device)

    asyncio.run(scenario())
    stack.assert_bound_once(device, mark, offset)


def test_device_turns_critical_while_in_use(stack: Stack) -> None:
    """A prepared device turning Critical stays with its pod (never yanked) and is reported
    unhealthy to the kubelet; a new claim for it is refused with what to do; once healthy again
    it attaches."""
    device, claim, mark, offset = _start(stack)
    key = ("fabric-dra.io", device.pool, device.name)

    async def scenario() -> None:
        async with kubelet_on(stack, watch_health=True) as kubelet:
            ref = ref_of(claim)
            stack.assert_prepared(claim, device, await kubelet.prepare_until_done(ref))
            await asyncio.to_thread(
                wait_until,
                lambda: (h := kubelet.manager.health.get(key)) is not None and h.health == "Healthy",
                what="the kubelet told the device is healthy",
            )
            stack.inject({"Kind": "DeviceHealth", "Device": _target(device), "Health": "Critical"})
            await asyncio.to_thread(
                wait_until,
                lambda: kubelet.manager.health[key].health == "Unhealthy",
                what="the kubelet told the device is unhealthy",
            )
            assert stack.device(device.name).health is Health.CRITICAL
            stack.assert_prepared(claim, device)  # still bound, visible, in the CDI spec
            await kubelet.unprepare_until_done(ref)
            stack.assert_released(claim, device)

            again = stack.create_claim(device)
            error = await _error(await kubelet.plugin(), ref_of(again))
            _names_device_node_cause_and_step(
                error,
                device,
                "could not be attached",
                "Critical",
                "delete the pod so the scheduler allocates another device",
            )
            assert _target(device) not in stack.bound_hosts()
            stack.reset_faults()
            await asyncio.to_thread(
                wait_until, lambda: stack.device(device.name).health is Health.OK, what="healthy again"
            )
            await _prepare_and_release(stack, kubelet, again, device)

    asyncio.run(scenario())
    stack.assert_bound_once(device, mark, offset, expected=2)


def test_fabric_unreachable_for_long(stack: Stack) -> None:
    """The Redfish service answers 503 to everything for longer than the manager's operation
    timeout and the plugin's retry budget, several times over. The claim gets an error saying the
    manager keeps the attach; the manager keeps its intent (the device shows 'attaching' for the
    claim, nobody else can take it) and /readyz stays ready; when the fabric is back the attach
    completes and the kubelet's retry gets the device — bound once."""
    device, claim, mark, offset = _start(stack)
    stack.inject({"Kind": "Unavailable", "RetryAfterSeconds": 1})

    async def scenario() -> None:
        async with kubelet_on(stack) as kubelet:
            plugin = await kubelet.plugin()
            for _ in range(2):  # two kubelet attempts, each outliving every timeout
                error = await _error(plugin, ref_of(claim))
                _names_device_node_cause_and_step(
                    error,
                    device,
                    "could not be attached",
                    "ServiceTemporarilyUnavailable",
                    "the fabric manager keeps the attach and finishes it when the fabric answers again",
                )
                held = stack.device(device.name)
                assert (held.state, held.claim_uid) == (BindingState.ATTACHING, claim["metadata"]["uid"])  # type: ignore[index]
            assert (await asyncio.to_thread(httpx.get, f"{stack.manager_url}/readyz")).status_code == 200
            assert "operation paused, will resume" in stack.manager.log_since_start()
            stack.reset_faults()
            await _prepare_and_release(stack, kubelet, claim, device)

    asyncio.run(scenario())
    stack.assert_bound_once(device, mark, offset)


#: seconds of every Redfish answer in the slow-fabric case. The attach makes five calls, so it takes
#: ~10 s, twice the 5 s after which the plugin answers a kubelet call with an 8 s deadline (its
#: --deadline-margin is 3 s); a loaded machine only makes the attach longer.
SLOW_CALL_SECONDS = 2


def test_every_redfish_call_is_slow(stack: Stack) -> None:
    """Each Redfish answer takes seconds: a kubelet call shorter than the attach hears that the
    fabric is still attaching and for how long; the attach goes on and the next call gets the
    device."""
    device, claim, mark, offset = _start(stack, DeviceType.NVME)
    stack.inject({"Kind": "SlowResponses", "Seconds": SLOW_CALL_SECONDS})

    async def scenario() -> None:
        async with kubelet_on(stack) as kubelet:
            try:
                error = await _error(await kubelet.plugin(), ref_of(claim), deadline=8.0)
                _names_device_node_cause_and_step(
                    error,
                    device,
                    f"the fabric is still attaching {device.name} to node {NODE}",
                    "the fabric manager has been attaching it for",
                )
                answer = await kubelet.prepare_until_done(ref_of(claim))
            finally:
                stack.reset_faults()
            stack.assert_prepared(claim, device, answer)
            await kubelet.unprepare_until_done(ref_of(claim))
            stack.assert_released(claim, device)

    asyncio.run(scenario())
    stack.assert_bound_once(device, mark, offset)


def test_session_expiry(stack: Stack) -> None:
    """Every Redfish session ends: the manager logs in again and the attach goes through."""
    device, claim, mark, offset = _start(stack)
    # Counted before the sessions expire: a background read of the manager may log in again at once.
    before = stack.manager.log_since_start().count("Redfish session created")
    stack.inject({"Kind": "ExpireSessions"})

    async def scenario() -> None:
        async with kubelet_on(stack) as kubelet:
            await _prepare_and_release(stack, kubelet, claim, device)

    asyncio.run(scenario())
    assert stack.manager.log_since_start().count("Redfish session created") > before
    stack.assert_bound_once(device, mark, offset)
