"""The crash-point matrix: every role killed with SIGKILL at every step of prepare and unprepare.

For each point (``plumbing.crashpoints.POINTS``, plus "during the fabric task" for the roles that
wait on one) the role is started with ``FABRIC_DRA_CRASH_AT=<point>``, the kubelet-protocol client
prepares (or unprepares) a claim, the role dies at that point, it is restarted, and the kubelet
retries as it would. Then the system must have converged:

* the claim is prepared, once: bound to the node in the emulator's own table, the manager's
  inventory, the node's sysfs tree, the CDI spec and the checkpoint (PrepareCompleted);
* after unprepare nothing is left anywhere: no binding, no sysfs entry, no CDI file, no entry;
* the emulator bound the device exactly once, and the binding monitor (polling the emulator's table
  the whole time) never saw it bound twice or to another host.

The stack lives for the whole module (only the killed role restarts). A fabric task exists only
where the point needs one: a ``HangTasks`` fault holds it until the test lets it finish.

The plugin's points between a GPU bound and its partition made, and between a memory share
connected and its memory onlined (``plumbing.crashpoints.SHARING_POINTS``), are reached only by a
partition or a share claim; they run against the manager stand-in, which binds partitions and
shares into the node's emulated host view (``tests/support/sharing.py``), until the real manager
binds them: the partition or share is prepared exactly once, then nothing of it is left, and the
share's memory was never taken away while a block of it was online.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from dra_driver.plugin import cdi
from kube_standin.kubelet_client import DraCallError
from manager_api.models import BindingState, Device, DeviceType
from manager_api.partitions import partition_devices
from plumbing.crashpoints import POINTS, SHARING_POINTS
from tests.integration.reliability.stack import NODE, Kubelet, Stack, _target, kubelet_on, ref_of
from tests.support.kubelet import running_kubelet
from tests.support.plugin import DRIVER, ClaimRef
from tests.support.sharing import Sharing, blocks_of_node, env_of, kubelet_claim, sharing_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow(seconds=52), pytest.mark.timeout(120)]


@dataclass(frozen=True)
class Case:
    point: str
    #: the fabric task is held open by a HangTasks fault until the test releases it
    task: bool = False
    #: killed by the test (SIGKILL) while the fabric task runs, instead of at a named point
    external: bool = False

    @property
    def role(self) -> str:
        return self.point.split(".", 1)[0]

    @property
    def phase(self) -> str:
        return self.point.split(".")[1]

    @property
    def claim(self) -> str:
        """What the case's claim allocates: a whole ``device``, a GPU ``partition`` (whose GPU the
        manager binds for it) or a ``share`` of a memory pool (a chunk the manager carves)."""
        return self.phase if self.role == "manager" and self.phase in ("partition", "share") else "device"

    def __str__(self) -> str:
        return self.point


DURING_TASK = (
    "plugin.prepare.during-fabric-task",
    "plugin.unprepare.during-fabric-task",
    "controller.attach.during-fabric-task",
)
_TASK_POINTS = {
    "manager.attach.task-accepted",
    "manager.attach.task-recorded",
    "manager.detach.task-recorded",
    "emulator.task.before-complete",
    "emulator.task.after-complete",
}
CASES = [
    *(Case(p, task=p in _TASK_POINTS) for p in POINTS if p.startswith("plugin.") and p not in SHARING_POINTS),
    Case(DURING_TASK[0], task=True, external=True),
    Case(DURING_TASK[1], task=True, external=True),
    # The warm pool's points need a warm pool: tests/integration/fabric/test_warm.py covers them.
    *(Case(p, task=p in _TASK_POINTS) for p in POINTS if p.startswith("manager.") and ".warm." not in p),
    *(Case(p) for p in POINTS if p.startswith("controller.")),
    Case(DURING_TASK[2], task=True, external=True),
    *(Case(p, task=p in _TASK_POINTS) for p in POINTS if p.startswith("emulator.")),
]


async def until(check: Callable[[], Any], *, within: float = 30.0, what: str = "condition") -> Any:
    return await asyncio.to_thread(wait_until, check, timeout=within, what=what)


def _pick(stack: Stack, case: Case) -> Device:
    """A free device for this case; NVMe drives and GPUs in turn, so one leak does not spread."""
    kinds = [DeviceType.GPU, DeviceType.NVME]
    kind = kinds[sum(map(ord, case.point)) % 2]
    free = stack.free_devices(kind) or stack.free_devices(kinds[1 - kinds.index(kind)])
    assert free, f"no free device left: {stack.bound_hosts()}"
    return free[0]


async def _kill(stack: Stack, case: Case, target: str) -> None:
    """Wait for the role to die at the case's point, or kill it while the fabric task runs."""
    role = getattr(stack, case.role)
    if case.external:
        await until(lambda: stack.in_flight(target), what=f"the fabric task of {target}")
        role.kill()
        return
    await asyncio.to_thread(role.wait_crashed, case.point)


def _restart(stack: Stack, case: Case) -> None:
    if case.role == "manager":
        stack.start_manager()
    else:
        getattr(stack, case.role).start()


async def _settle(call: asyncio.Task[Any]) -> Any:
    """The kubelet's first call: it may succeed (the role came back in time) or fail."""
    with contextlib.suppress(DraCallError):
        return await call
    return None


@pytest.fixture(scope="module")
def running(stack: Stack) -> Stack:
    stack.plugin.start()
    stack.controller.start()
    return stack


@pytest.mark.parametrize("case", CASES, ids=str)
def test_crash_point(running: Stack, case: Case) -> None:
    stack = running
    asyncio.run(_scenario(stack, case))


async def _scenario(stack: Stack, case: Case) -> None:
    if case.claim != "device":
        await _shared_scenario(stack, case)
        return
    armed = [] if case.external else [case.point]
    # The role is idle between cases: SIGKILL it rather than wait for a graceful stop.
    if case.role == "manager":
        await asyncio.to_thread(stack.start_manager, armed, kill_previous=True)
    else:
        await asyncio.to_thread(getattr(stack, case.role).start, armed, kill_previous=True)
    async with kubelet_on(stack) as kubelet:
        await kubelet.plugin()
        device = _pick(stack, case)
        target = _target(device)
        mark, offset = stack.monitor.mark(), stack.emulator_log_size()
        if case.task and case.phase in ("prepare", "attach", "task"):
            stack.inject({"Kind": "HangTasks", "Target": _target(device), "Count": 1})
        claim = stack.create_claim(device, binding_conditions=case.role == "controller")
        ref = ref_of(claim)
        if case.role == "controller":
            await _controller_case(stack, kubelet, case, device, claim)
        else:
            if case.phase in ("prepare", "attach", "bind", "task"):
                await _crash_in_prepare(stack, kubelet, case, device, claim)
            else:
                await _crash_in_unprepare(stack, kubelet, case, device, claim)
            await kubelet.unprepare_until_done(ref)
            stack.deallocate(claim)
        stack.assert_released(claim, device)
        stack.assert_bound_once(device, mark, offset)
        assert not stack.in_flight(target)


async def _crash_in_prepare(
    stack: Stack, kubelet: Kubelet, case: Case, device: Device, claim: dict[str, Any]
) -> None:
    target, ref = _target(device), ref_of(claim)
    plugin = await kubelet.plugin()
    call = asyncio.create_task(plugin.prepare([ref]))
    if case.role == "emulator" and case.task:
        await until(lambda: stack.in_flight(target), what=f"the fabric task of {target}")
        with contextlib.suppress(httpx.HTTPError):  # the emulator may die before it answers
            stack.reset_faults()  # the task finishes now, and the emulator dies around its result
    await _kill(stack, case, target)
    attempts = kubelet.attempts()
    await asyncio.to_thread(_restart, stack, case)
    if case.task and case.role != "emulator":
        stack.reset_faults()
    if case.role == "plugin":
        with pytest.raises(DraCallError):
            await call
        await kubelet.plugin(newer_than=attempts)
        answer = await kubelet.prepare_until_done(ref)
    else:
        answer = await _settle(call)
        if answer is None:
            answer = await kubelet.prepare_until_done(ref)
        else:
            answer = answer[ref.uid]
    stack.assert_prepared(claim, device, answer)


async def _crash_in_unprepare(
    stack: Stack, kubelet: Kubelet, case: Case, device: Device, claim: dict[str, Any]
) -> None:
    target, ref = _target(device), ref_of(claim)
    answer = await kubelet.prepare_until_done(ref)
    stack.assert_prepared(claim, device, answer)
    if case.task:
        stack.inject({"Kind": "HangTasks", "Target": target, "Count": 1})
    plugin = await kubelet.plugin()
    call = asyncio.create_task(plugin.unprepare([ref]))
    await _kill(stack, case, target)
    attempts = kubelet.attempts()
    await asyncio.to_thread(_restart, stack, case)
    if case.task:
        stack.reset_faults()
    if case.role == "plugin":
        with pytest.raises(DraCallError):
            await call
        await kubelet.plugin(newer_than=attempts)
    else:
        with contextlib.suppress(DraCallError):
            await call


async def _controller_case(
    stack: Stack, kubelet: Kubelet, case: Case, device: Device, claim: dict[str, Any]
) -> None:
    """The binding-condition flow: the controller attaches for the allocation before the pod is
    bound; the plugin's prepare then finds the device attached."""
    target, ref, uid = _target(device), ref_of(claim), claim["metadata"]["uid"]

    def attached() -> bool:
        c = stack.condition(claim, device, "Attached")
        return c is not None and c["status"] == "True"

    if case.phase == "attach":
        await _kill(stack, case, target)
        await asyncio.to_thread(stack.controller.start)
        if case.task:
            stack.reset_faults()
        await until(attached, what="Attached=True after the controller restarted")
        held = stack.device(device.name)
        assert (held.state, held.node, held.claim_uid) == (BindingState.BOUND, "kind-worker", uid)
        answer = await kubelet.prepare_until_done(ref)
        stack.assert_prepared(claim, device, answer)
        await kubelet.unprepare_until_done(ref)
        stack.deallocate(claim)
        return
    # release: the scheduler gives the allocation up before any pod used the device
    await until(attached, what="Attached=True")
    stack.deallocate(claim)
    await _kill(stack, case, target)
    await asyncio.to_thread(stack.controller.start)
    # The restarted controller no longer knows it attached the device; the manager's orphan
    # reconciler releases it (no claim allocates it any more) after its grace period.
    await until(lambda: target not in stack.bound_hosts(), what=f"{target} released", within=30)
    await until(lambda: stack.device(device.name).state is BindingState.FREE, what="the manager's view")


# -- the manager's points of a GPU partition and of a memory share (the real manager) ---------------

#: the manager's sharing points on the way out: reached by the unprepare of a prepared claim
_ON_RELEASE = frozenset({"manager.share.after-connection-deleted"})
#: a share's memory: 2 GiB, two of the pool's 1 GiB increments
SHARE_MEMORY, SHARE_MIB = "2Gi", 2048


def _shared_device(stack: Stack, case: Case) -> Device:
    """A free partitionable GPU of the node's pools, or the memory pool."""
    if case.claim == "share":
        return next(d for d in stack.inventory().devices if d.memory_pool is not None)
    gpus = [d for d in stack.free_devices(DeviceType.GPU) if d.partition_table is not None]
    assert gpus, f"no free partitionable GPU left: {stack.bound_hosts()}"
    return gpus[0]


async def _shared_scenario(stack: Stack, case: Case) -> None:
    """A claim of a GPU partition or of a memory share, through the real manager: the manager dies
    at the point, restarts unarmed, the kubelet retries; the claim is prepared once (the GPU bound
    once, its partition made once; the share's chunk made once, connected to the node, its region
    there), then unprepared to nothing."""
    await asyncio.to_thread(stack.start_manager, [case.point], kill_previous=True)
    async with kubelet_on(stack) as kubelet:
        await kubelet.plugin()
        device = _shared_device(stack, case)
        mark, offset = stack.monitor.mark(), stack.emulator_log_size()
        partition = share = None
        if case.claim == "partition":
            assert device.partition_table is not None
            partition = partition_devices(device.name, device.partition_table)[0].name
            claim = stack.create_claim(device, partition=partition)
        else:
            share = str(uuid.uuid4())
            claim = stack.create_claim(device, share=(share, SHARE_MEMORY))
        ref = ref_of(claim)

        def assert_prepared(answer: Any) -> None:
            if partition is not None:
                stack.assert_partition_prepared(claim, device, partition, answer)
            else:
                assert share is not None
                stack.assert_share_prepared(claim, device, share, SHARE_MIB, answer)

        plugin = await kubelet.plugin()
        call: asyncio.Task[Any]
        if case.point in _ON_RELEASE:
            assert_prepared(await kubelet.prepare_until_done(ref))
            call = asyncio.create_task(plugin.unprepare([ref]))
        else:
            call = asyncio.create_task(plugin.prepare([ref]))
        await asyncio.to_thread(stack.manager.wait_crashed, case.point)
        await asyncio.to_thread(stack.start_manager)
        answer = await _settle(call)
        if case.point not in _ON_RELEASE:
            answer = answer[ref.uid] if answer is not None else await kubelet.prepare_until_done(ref)
            assert_prepared(answer)
        await kubelet.unprepare_until_done(ref)
        stack.deallocate(claim)
    stack.assert_shared_released(claim, device)
    if partition is not None:
        stack.assert_bound_once(device, mark, offset)
    else:
        assert stack.chunks_created(offset) == 1, stack.emulator.log_since_start()[-3000:]
        stack.monitor.wait_for_poll()
        assert stack.monitor.violations == [], stack.monitor.violations
        assert {e.host for e in stack.monitor.episodes[mark:]} <= {NODE}


# -- a GPU partition's and a memory share's own points (the manager stand-in) -----------------------

PARTITION = "gpu0-3g40gb-4"


@pytest.fixture(scope="module")
def sharing() -> Iterator[Sharing]:
    with sharing_stack(gpus=1) as running:
        yield running


#: each point; a prepare's also with the pod deleted before the kubelet's retry could finish it
SHARING_CASES = [
    *((p, True) for p in sorted(SHARING_POINTS)),
    *((p, False) for p in sorted(SHARING_POINTS) if ".prepare." in p),
]


@pytest.mark.parametrize(
    ("point", "retried"), SHARING_CASES, ids=[p if r else f"{p}-then-deleted" for p, r in SHARING_CASES]
)
def test_partition_and_memory_crash_point(sharing: Sharing, point: str, retried: bool) -> None:
    asyncio.run(_sharing_scenario(sharing, point, retried=retried))


async def _sharing_scenario(sharing: Sharing, point: str, *, retried: bool) -> None:
    stack = sharing.stack
    yanked = len(sharing.hosts.yanked)
    await asyncio.to_thread(stack.start_plugin, [point], kill_previous=True)
    name = f"crash-{uuid.uuid4().hex[:8]}"
    share = str(uuid.uuid4())
    if "partition" in point:
        ref = await sharing.claim_partition(name, PARTITION)
    else:
        ref = await sharing.claim_share(name, share, "2Gi", mode="kmem")
    claim = kubelet_claim(ref)
    async with running_kubelet(stack.registry_dir, watch_health=False) as manager:
        kubelet = Kubelet(manager)
        plugin = await kubelet.plugin()
        call: asyncio.Task[Any]
        if ".prepare." in point:
            call = asyncio.create_task(plugin.prepare([claim]))
        else:
            await kubelet.prepare_until_done(claim)
            _assert_prepared_once(sharing, ref, share, point)
            call = asyncio.create_task(plugin.unprepare([claim]))
        role = stack.plugin
        assert role is not None
        await asyncio.to_thread(role.wait_crashed, point)
        attempts = kubelet.attempts()
        await asyncio.to_thread(stack.start_plugin)
        with pytest.raises(DraCallError):
            await call
        await kubelet.plugin(newer_than=attempts)
        if ".prepare." in point and retried:
            await kubelet.prepare_until_done(claim)
            _assert_prepared_once(sharing, ref, share, point)
        # (not retried: the pod was deleted meanwhile; the unprepare undoes the half-made prepare)
        await kubelet.unprepare_until_done(claim)
    _assert_released(sharing, ref, share)
    assert sharing.hosts.yanked[yanked:] == [], "a share's memory was taken away while online"


def _assert_prepared_once(sharing: Sharing, ref: ClaimRef, share: str, point: str) -> None:
    entry = sharing.entry(ref)
    assert entry is not None and entry["state"] == "PrepareCompleted"
    (device,) = entry["devices"]
    spec = sharing.spec(ref)
    if "partition" in point:
        made = sharing.partitions("gpu0")
        assert list(made) == ["3g40gb-4"], f"not exactly the claim's partition: {made}"
        assert (
            env_of(spec)["NVIDIA_VISIBLE_DEVICES"] == made["3g40gb-4"]["uuid"] == device["partition"]["uuid"]
        )
        assert [(h.partition, h.claim_uid) for h in sharing.device("gpu0").partitions] == [
            (PARTITION, ref.uid)
        ]
        return
    assert [s.share_id for s in sharing.manager.shares_made].count(share) == 1, "the share was made twice"
    node = int(env_of(spec)[f"{cdi.env_prefix(f'cxlpool0-{share}')}NUMA_NODE"])
    assert device["memory"]["node"] == node
    assert set(blocks_of_node(sharing, node).values()) == {"online"}


def _assert_released(sharing: Sharing, ref: ClaimRef, share: str) -> None:
    assert sharing.entry(ref) is None
    assert cdi.spec_files_of_claim(sharing.stack.cdi_root, DRIVER, ref.uid) == []
    assert "gpu0" not in sharing.hosts.bound(), "the GPU stayed bound"
    assert sharing.device("gpu0").partitions == []
    assert share not in sharing.shares() and f"cxlpool0/{share}" not in sharing.hosts.bound()
