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

A point that only a GPU partition's or a memory share's claim reaches runs with such a claim,
through the real manager and the emulator (its default topology has partitionable GPUs and the
memory pool ``cxlpool0-pool``): the manager's ``manager.partition.*`` and ``manager.share.*``, and
the plugin's partition points (``plumbing.crashpoints.SHARING_POINTS``), each prepare point of the
plugin's also with the pod deleted before the kubelet's retry. The claim is prepared once (the GPU
bound once and its partition made once on the node; the share's chunk made once, connected to the
node, its dax device there), and after unprepare nothing of it is left. The plugin's memory points
still run against the manager stand-in (``tests/support/sharing.py``): only its host view notices a
share's memory taken away while a block of it is online, which they check never happens.
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
        if self.role == "manager" and self.phase in ("partition", "share"):
            return self.phase
        if self.point in SHARING_POINTS:
            return "partition" if "partition" in self.point else "share"
        return "device"

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


# -- the points of a GPU partition and of a memory share through the real manager -----------------

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


async def _shared_scenario(stack: Stack, case: Case, *, retried: bool = True) -> None:
    """A claim of a GPU partition or of a memory share, through the real manager: the role dies at
    the point, restarts unarmed, the kubelet retries (``retried``; else the pod was deleted
    meanwhile and the kubelet unprepares); the claim is prepared once (the GPU bound once, its
    partition made once; the share's chunk made once, connected to the node, its region there),
    then unprepared to nothing."""
    if case.role == "manager":
        await asyncio.to_thread(stack.start_manager, [case.point], kill_previous=True)
    else:
        await asyncio.to_thread(stack.plugin.start, [case.point], kill_previous=True)
    releasing = case.point in _ON_RELEASE or ".unprepare." in case.point
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
        if releasing:
            assert_prepared(await kubelet.prepare_until_done(ref))
            call = asyncio.create_task(plugin.unprepare([ref]))
        else:
            call = asyncio.create_task(plugin.prepare([ref]))
        await asyncio.to_thread(getattr(stack, case.role).wait_crashed, case.point)
        attempts = kubelet.attempts()
        await asyncio.to_thread(_restart, stack, case)
        answer = None
        if case.role == "plugin":
            with pytest.raises(DraCallError):
                await call
            await kubelet.plugin(newer_than=attempts)
        else:
            answer = await _settle(call)
        if not releasing and retried:
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


#: the plugin's partition points, each prepare point also with the pod deleted before the retry
PARTITION_CASES = [
    *((Case(p), True) for p in sorted(SHARING_POINTS) if "partition" in p),
    *((Case(p), False) for p in sorted(SHARING_POINTS) if "partition" in p and ".prepare." in p),
]


@pytest.mark.parametrize(
    ("case", "retried"),
    PARTITION_CASES,
    ids=[str(c) if r else f"{c}-then-deleted" for c, r in PARTITION_CASES],
)
def test_plugin_partition_crash_point(running: Stack, case: Case, retried: bool) -> None:
    asyncio.run(_shared_scenario(running, case, retried=retried))


# -- a memory share's own points of the plugin (the manager stand-in) ------------------------------


@pytest.fixture(scope="module")
def sharing() -> Iterator[Sharing]:
    with sharing_stack(gpus=0) as running:
        yield running


#: each memory point of the plugin; a prepare's also with the pod deleted before the kubelet's retry
#: could finish it
MEMORY_POINTS = sorted(p for p in SHARING_POINTS if "memory" in p)
MEMORY_CASES = [*((p, True) for p in MEMORY_POINTS), *((p, False) for p in MEMORY_POINTS if ".prepare." in p)]


@pytest.mark.parametrize(
    ("point", "retried"), MEMORY_CASES, ids=[p if r else f"{p}-then-deleted" for p, r in MEMORY_CASES]
)
def test_memory_crash_point(sharing: Sharing, point: str, retried: bool) -> None:
    asyncio.run(_memory_scenario(sharing, point, retried=retried))


async def _memory_scenario(sharing: Sharing, point: str, *, retried: bool) -> None:
    stack = sharing.stack
    yanked = len(sharing.hosts.yanked)
    await asyncio.to_thread(stack.start_plugin, [point], kill_previous=True)
    share = str(uuid.uuid4())
    ref = await sharing.claim_share(f"crash-{uuid.uuid4().hex[:8]}", share, "2Gi", mode="kmem")
    claim = kubelet_claim(ref)
    async with running_kubelet(stack.registry_dir, watch_health=False) as manager:
        kubelet = Kubelet(manager)
        plugin = await kubelet.plugin()
        call: asyncio.Task[Any]
        if ".prepare." in point:
            call = asyncio.create_task(plugin.prepare([claim]))
        else:
            await kubelet.prepare_until_done(claim)
            _assert_prepared_once(sharing, ref, share)
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
            _assert_prepared_once(sharing, ref, share)
        # (not retried: the pod was deleted meanwhile; the unprepare undoes the half-made prepare)
        await kubelet.unprepare_until_done(claim)
    _assert_released(sharing, ref, share)
    assert sharing.hosts.yanked[yanked:] == [], "a share's memory was taken away while online"


def _assert_prepared_once(sharing: Sharing, ref: ClaimRef, share: str) -> None:
    entry = sharing.entry(ref)
    assert entry is not None and entry["state"] == "PrepareCompleted"
    (device,) = entry["devices"]
    spec = sharing.spec(ref)
    assert [s.share_id for s in sharing.manager.shares_made].count(share) == 1, "the share was made twice"
    node = int(env_of(spec)[f"{cdi.env_prefix(f'cxlpool0-{share}')}NUMA_NODE"])
    assert device["memory"]["node"] == node
    assert set(blocks_of_node(sharing, node).values()) == {"online"}


def _assert_released(sharing: Sharing, ref: ClaimRef, share: str) -> None:
    assert sharing.entry(ref) is None
    assert cdi.spec_files_of_claim(sharing.stack.cdi_root, DRIVER, ref.uid) == []
    assert share not in sharing.shares() and f"cxlpool0/{share}" not in sharing.hosts.bound()
