"""The fabric's one state machine: binds, unbinds, tasks and faults, independent of HTTP.

The three Redfish binding styles (zones, composition, CXL connections) all become an
:class:`~emulator.redfish.engine.operation.Operation` on the same bindings table, so every view
agrees. Rules:

* A target (a PCIe device or a CXL memory chunk) is bound to at most one host. A bind of a
  target that is bound — to any host — or that has an operation in flight fails with
  :class:`~emulator.errors.TargetBusy` (Base ``ResourceInUse``, 409). The check and the
  reservation happen without an ``await`` in between on the single event loop, so concurrent
  requests cannot both win.
* With a task-based latency profile (or ``Prefer: respond-async``, or a ``HangTasks`` fault)
  the request reserves its targets, answers 202, and the binding changes only when the task
  completes — in one durable commit together with the task's final state. A crash before that
  leaves the target as it was and the task ``Interrupted`` (see :meth:`Engine.recover`).
* Every change is on disk before the response that reports it (:class:`StateStore`), and
  the emulated host views follow the durable state.

:class:`Engine` assembles the parts, each with one job: the bindings table and its revision
(:mod:`.bindings`), the faults in force (:mod:`.conditions`) and their injection
(:mod:`.injection`), what hosts see (:mod:`.visibility`), one change of the bindings
(:mod:`.binder`), tasks (:mod:`.tasks`), durable commits (:mod:`.journal`) and start-up repair
(:mod:`.recovery`); it runs an operation now or as a task, and resets devices.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from emulator.qemu.host import QemuHosts
from emulator.redfish.engine.binder import Binder
from emulator.redfish.engine.bindings import BindingTable, Revision
from emulator.redfish.engine.carving import Carver
from emulator.redfish.engine.conditions import Conditions
from emulator.redfish.engine.events import EventBus
from emulator.redfish.engine.injection import FaultInjector
from emulator.redfish.engine.journal import Journal
from emulator.redfish.engine.operation import Operation, Outcome
from emulator.redfish.engine.recovery import drop_what_the_topology_lacks, interrupt_unfinished_tasks
from emulator.redfish.engine.tasks import TaskRunner
from emulator.redfish.engine.visibility import Visibility
from emulator.redfish.model import uris
from emulator.redfish.model.latency import LatencyProfile
from emulator.redfish.model.state import BindingRecord, FabricState, OperationKind, StateStore, utcnow
from emulator.redfish.sysfs.hostview import HostView
from emulator.topology import Chunk, Device, FabricIndex
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["Engine"]

log = get_logger(__name__)


class Engine:
    def __init__(
        self,
        index: FabricIndex,
        store: StateStore,
        hostview: HostView,
        events: EventBus,
        latency: LatencyProfile,
        revision: Revision,
        *,
        qemu: QemuHosts | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.index = index
        self.store = store
        self.hostview = hostview
        self.events = events
        self.latency = latency
        self.revision = revision
        #: hosts of ``kind: qemu``: their binds and unbinds change a guest
        self.qemu = qemu
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.bindings = BindingTable(store, revision)
        self.conditions = Conditions(index, store, revision)
        self.visibility = Visibility(index, self.conditions, hostview)
        self.journal = Journal(store, events)
        self.binder = Binder(index, self.bindings, self.conditions, self.visibility, events)
        self.carver = Carver(index, self.bindings, events)
        #: renders a resource URI, for the body of a 201 and of a task's final response (set by the service)
        self.render: Callable[[str], dict[str, Any] | None] = lambda _uri: None
        #: ends every open session, for an ExpireSessions fault (set by the service)
        self.expire_sessions: Callable[[], int] = lambda: 0
        self.tasks = TaskRunner(
            index,
            self.bindings,
            self.conditions,
            self.binder,
            events,
            self.journal,
            latency,
            self.rng,
            qemu,
            render=lambda uri: self.render(uri),
            carver=self.carver,
        )
        self.injector = FaultInjector(
            index,
            self.conditions,
            self.visibility,
            events,
            self.journal,
            revision,
            expire_sessions=lambda: self.expire_sessions(),
        )

    @property
    def state(self) -> FabricState:
        return self.store.state

    def serve_with(
        self, *, render: Callable[[str], dict[str, Any] | None], expire_sessions: Callable[[], int]
    ) -> None:
        """Hooks into the service above: how a task renders the resource its final response
        returns, and how an ExpireSessions fault ends the open sessions."""
        self.render = render
        self.expire_sessions = expire_sessions

    # --- start and stop ----------------------------------------------------------------------

    def recover(self) -> None:
        """Make the loaded state consistent before serving; rebuild every host view from it."""
        state = self.state
        interrupt_unfinished_tasks(state)
        self.carver.restore()  # carved chunks are targets again before bindings are checked against them
        drop_what_the_topology_lacks(state, self.index)
        self.conditions.load()
        state.prune_tasks(now=True)
        state.version += 1
        self.store.write_now()
        self.visibility.rebuild(list(state.bindings.values()))
        self.revision.bump()

    def close(self) -> None:
        """Stop running tasks without touching their state: the next start marks them Interrupted."""
        self.tasks.close()

    # --- operations ------------------------------------------------------------------------

    async def execute(self, op: Operation, *, force_task: bool = False) -> Outcome:
        """Run ``op``: complete it now, or start a task for it. Raises
        :class:`~emulator.errors.FabricError` when the fabric refuses it."""
        releases = op.kind == OperationKind.RELEASE
        if releases:
            self.carver.check_release(op)
        else:
            self.binder.check(op)
        failure = self.conditions.take_failure(op.kind.value, op.targets)
        hang = self.conditions.take_hang(op.targets)
        # A QEMU host's change waits on its guest (device_del until DEVICE_DELETED): always a task,
        # so the request is not held open and the targets stay reserved meanwhile.
        force_task = force_task or (self.qemu is not None and op.host in self.qemu)
        if self.latency.tasks or force_task or hang:
            task = await self.tasks.start(op, failure, hang=hang)
            return Outcome(202, uris.task_monitor(task.id), task)
        if failure is not None:
            await self.journal.commit([], [])  # the fault's count went down
            raise failure
        if releases:
            effects, events = self.carver.release(op)
            await self.journal.commit(effects, events)
            return Outcome(op.success_status, op.location)
        crash_point("emulator.bind.before-commit" if op.binds else "emulator.unbind.before-commit")
        effects, events = self.binder.apply(op)
        await self.journal.commit(effects, events)
        crash_point("emulator.bind.after-commit" if op.binds else "emulator.unbind.after-commit")
        return Outcome(op.success_status, op.location)

    async def create_chunk(
        self, device: Device, size_mib: int, *, name: str | None = None, description: str | None = None
    ) -> Chunk:
        """Carve a memory chunk of ``size_mib`` from ``device``'s pool, durably (always at once: a
        pool hands out free memory; only its release takes time). Raises
        :class:`~emulator.errors.FabricError` when the domain cannot."""
        chunk, (effects, events) = self.carver.create(device, size_mib, name=name, description=description)
        await self.journal.commit(effects, events)
        return chunk

    async def reset_device(self, device_id: str, reset_type: str | None) -> list[BindingRecord]:
        """Reset the device ``device_id`` (``#Processor.Reset``, ``#Drive.Reset``): done at once,
        as a function-level reset is (PCIe Base 6.0 §6.6.2: within 100 ms), and counted on its
        bindings (``Resets``, ``LastReset`` in the Bindings table: the host's side of the reset).
        A device with an operation in flight is busy; a ``FailOperations`` fault with
        ``Operation: reset`` fails it. Returns the bindings it was counted on."""
        targets = sorted(t for t, target in self.index.targets.items() if target.device.id == device_id)
        self.binder.check_not_in_flight(targets)
        failure = self.conditions.take_failure("reset", targets)
        if failure is not None:
            await self.journal.commit([], [])  # the fault's count went down
            raise failure
        now = utcnow()
        counted = [b for t in targets if (b := self.state.bindings.get(t)) is not None]
        for binding in counted:
            binding.resets += 1
            binding.last_reset = now
        self.revision.bump()
        log.info(
            "device reset",
            device=device_id,
            node=",".join(b.host for b in counted) or None,
            reset_type=reset_type or "default",
        )
        await self.journal.commit([], [])
        return counted
