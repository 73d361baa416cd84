"""Orphan reconciliation through the real processes (grace 1 s, plugin reports every 0.5 s).

One timeline over one stack, each device a different story:

* ``in_use``   — prepared, claim allocated and reserved: never touched, not even with its node's
  plugin down or its checkpoint lost;
* ``reported`` — prepared, then its claim force-deleted under the running pod: detached after the
  grace although the plugin reports it prepared (a report does not keep a claim that does not
  exist: else a plugin could hold any device by reporting made-up claims);
* ``waiting``  — binding-condition flow: attached for an allocation the scheduler holds in PreBind
  (allocated, not reserved): never touched;
* ``gone_node`` — attached to kind-worker2, then the node is deleted and the claim deallocated: detached;
* ``lost``     — the plugin lost its checkpoint (re-adopted, not reported), then its claim is
  deleted: detached;
* ``down``     — the claim deleted while its node's plugin is down: detached;
* ``foreign``  — bound outside fabric-dra (straight through Redfish): reported, never touched.

Each detach comes with an ``OrphanedBinding`` and an ``OrphanDetached`` Event naming device, node
and claim, and ``fabric_dra_orphans_detached_total{reason}``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType
from tests.integration.reliability.stack import (
    CONTROLLER_TOKEN,
    NODE,
    OPERATOR_TOKEN,
    Stack,
    _target,
    kubelet_on,
    ref_of,
)
from tests.support.emulator import zone_add, zone_remove
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def _metric(stack: Stack, name: str) -> dict[str, float]:
    """``name{labels} value`` lines of the manager's /metrics, labels → value."""
    auth = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    text = httpx.get(f"{stack.manager_url}/metrics", headers=auth, timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


def _event_time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["eventTime"]).replace("Z", "+00:00"))


def _attach_as_controller(stack: Stack, device: Device, node: str, claim: dict[str, Any]) -> None:
    async def attach() -> None:
        async with ManagerClient(stack.manager_url, token=CONTROLLER_TOKEN) as client:
            answer = await client.attach(device.name, node, claim["metadata"]["uid"], wait_seconds=30)
            assert answer.state.value == "attached"

    asyncio.run(attach())


def test_orphans_are_detached_and_what_is_in_use_never_is(stack: Stack) -> None:
    stack.plugin.start()
    gpus = stack.free_devices(DeviceType.GPU)
    nvmes = stack.free_devices(DeviceType.NVME)
    in_use, reported, lost, down = gpus[0], gpus[1], gpus[2], nvmes[0]
    waiting = stack.free_devices(DeviceType.GPU, node="kind-worker3")[3]
    gone_node = stack.free_devices(DeviceType.NVME, node="kind-worker2")[1]
    foreign = stack.free_devices(DeviceType.NIC, node="kind-worker4")[0]
    mark = stack.monitor.mark()

    claims = {d.name: stack.create_claim(d) for d in (in_use, reported, lost, down)}

    async def prepare_all() -> None:
        async with kubelet_on(stack) as kubelet:
            for device in (in_use, reported, lost, down):
                answer = await kubelet.prepare_until_done(ref_of(claims[device.name]))
                stack.assert_prepared(claims[device.name], device, answer)

    asyncio.run(prepare_all())
    claims[waiting.name] = stack.create_claim(
        waiting, node="kind-worker3", binding_conditions=True, reserved=False
    )
    _attach_as_controller(stack, waiting, "kind-worker3", claims[waiting.name])
    claims[gone_node.name] = stack.create_claim(gone_node, node="kind-worker2", binding_conditions=True)
    _attach_as_controller(stack, gone_node, "kind-worker2", claims[gone_node.name])
    uri, body = zone_add("kind-worker4", _target(foreign))
    httpx.post(stack.emulator_url + uri, json=body, auth=stack.emu_auth(), timeout=10).raise_for_status()

    def bound(device: Device) -> bool:
        return stack.bound_hosts().get(_target(device)) is not None

    def freed(device: Device) -> Callable[[], bool]:
        return lambda: not bound(device) and stack.device(device.name).state is BindingState.FREE

    # The pod's claim is force-deleted while it runs; its node is deleted with the claim deallocated.
    stack.delete_claim(claims[reported.name])
    stack.set_status(claims[gone_node.name], {})
    assert stack.http is not None
    stack.http.delete("/api/v1/nodes/kind-worker2").raise_for_status()
    wait_until(freed(gone_node), what="the device of the deleted node released", timeout=60)
    wait_until(freed(reported), what="the force-deleted claim's device, although reported", timeout=60)
    # The others are explained by their claims.
    assert all(bound(d) for d in (in_use, lost, down, waiting, foreign))

    # The plugin loses its checkpoint (and the node's tmpfs): it re-adopts what the fabric binds to
    # it as PrepareStarted, which it does not report; then the claim of `lost` is deleted.
    stack.plugin.stop()
    (stack.plugin_dir / "checkpoint.json").unlink()
    shutil.rmtree(stack.cdi_root)
    stack.plugin.start()
    stack.delete_claim(claims[lost.name])
    wait_until(freed(lost), what="the device of a claim deleted after the checkpoint was lost", timeout=60)

    # The node goes down (plugin killed); the claim of `down` is deleted meanwhile.
    stack.plugin.kill()
    stack.delete_claim(claims[down.name])
    wait_until(freed(down), what="the device of a claim deleted while its node was down", timeout=60)
    assert all(bound(d) for d in (in_use, waiting, foreign)), stack.bound_hosts()
    assert stack.bound_hosts()[_target(foreign)] == "kind-worker4"

    # What the operator is told: Events naming device, node and claim; metrics; the log.
    events = [e for e in stack.events() if e["reportingController"] == "fabric-dra.io/manager"]
    detached = {e["note"].split()[2]: e for e in events if e["reason"] == "OrphanDetached"}
    found = {e["note"].split()[1]: e for e in events if e["reason"] == "OrphanedBinding"}
    assert set(detached) == {gone_node.name, reported.name, lost.name, down.name}, events
    for device in (gone_node, reported, lost, down):
        uid = claims[device.name]["metadata"]["uid"]
        for event in (detached[device.name], found[device.name]):
            assert event["type"] == "Warning"
            assert device.name in event["note"] and uid in event["note"]
        node = "kind-worker2" if device is gone_node else NODE
        assert f"node {node}" in detached[device.name]["note"]
        # released only after the grace period, counted from when it was found
        waited = _event_time(detached[device.name]) - _event_time(found[device.name])
        assert waited.total_seconds() >= stack.orphan_grace
    node_event = detached[down.name]
    assert node_event["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}
    claim_event = detached[gone_node.name]  # the claim still exists: the Event is about it
    assert claim_event["regarding"]["kind"] == "ResourceClaim"
    assert claim_event["regarding"]["uid"] == claims[gone_node.name]["metadata"]["uid"]
    assert claim_event["related"]["name"] == "kind-worker2"
    assert "no longer allocates it" in claim_event["note"]
    assert _metric(stack, "fabric_dra_orphans_detached_total") == {
        '{reason="claim-deleted"}': 3.0,
        '{reason="not-allocated"}': 1.0,
    }
    assert _metric(stack, "fabric_dra_unmanaged_bindings") == {f'{{pool="{foreign.pool}"}}': 1.0}
    assert "device bound outside fabric-dra; reported, never touched" in stack.manager.log_since_start()
    outside = stack.device(foreign.name)
    assert (outside.managed, outside.state, outside.node) == (False, BindingState.BOUND, "kind-worker4")

    # Cleanup, as the kubelet and an operator would; nothing was ever bound twice.
    async def release() -> None:
        stack.plugin.start()
        async with kubelet_on(stack) as kubelet:
            for device in (in_use, reported, lost, down):
                await kubelet.unprepare_until_done(ref_of(claims[device.name]))

    asyncio.run(release())
    _detach_as_controller(stack, waiting, "kind-worker3", claims[waiting.name])
    uri, body = zone_remove("kind-worker4", _target(foreign))
    httpx.post(stack.emulator_url + uri, json=body, auth=stack.emu_auth(), timeout=10).raise_for_status()
    wait_until(lambda: not stack.bound_hosts(), what="every binding gone")
    stack.monitor.wait_for_poll()
    assert stack.monitor.violations == []
    for device in (in_use, reported, lost, down, waiting, gone_node, foreign):
        assert len(stack.monitor.episodes_of(_target(device), mark)) == 1, device.name


def _detach_as_controller(stack: Stack, device: Device, node: str, claim: dict[str, Any]) -> None:
    async def detach() -> None:
        async with ManagerClient(stack.manager_url, token=CONTROLLER_TOKEN) as client:
            answer = await client.detach(device.name, node, claim["metadata"]["uid"], wait_seconds=30)
            assert answer.state.value == "detached"

    asyncio.run(detach())
