"""The injected faults in force and the conditions they make: device health, host ports down,
slow or unavailable service, dropped connections, failing and hanging operations.

Faults persist with the fabric state (their records) until removed; a counted one (``Count``)
removes itself when used up. Injecting and removing them, with what that changes on the hosts
and the events it raises, is :mod:`emulator.redfish.engine.injection`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from emulator.errors import InjectedFailure, UnknownName
from emulator.redfish.engine.bindings import Revision
from emulator.redfish.engine.operation import fmt_targets
from emulator.redfish.model.faults import (
    PCIE_ERROR_COUNTERS,
    DeviceHealth,
    DropConnections,
    FailOperations,
    FaultSpec,
    HangTasks,
    LinkDegraded,
    LinkRemoved,
    PCIeErrors,
    PortDown,
    SlowResponses,
    Unavailable,
    fault_adapter,
)
from emulator.redfish.model.state import FabricState, FaultRecord, StateStore, utcnow
from emulator.topology import FabricIndex
from plumbing.logs import get_logger

__all__ = ["Conditions"]

log = get_logger(__name__)


@dataclass(eq=False)
class Conditions:
    index: FabricIndex
    store: StateStore
    revision: Revision
    #: fault Id → the fault in force
    faults: dict[str, FaultSpec] = field(default_factory=dict, init=False)
    #: Ids of tasks held by a HangTasks fault
    hung: set[str] = field(default_factory=set, init=False)
    _unhang: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    @property
    def state(self) -> FabricState:
        return self.store.state

    # --- what the faults in force make of the fabric ---------------------------------------

    def health(self, device: str) -> str:
        worst = "OK"
        for fault in self.faults.values():
            if (
                isinstance(fault, DeviceHealth)
                and fault.Device == device
                and (fault.Health == "Critical" or (fault.Health == "Warning" and worst == "OK"))
            ):
                worst = fault.Health
        return worst

    def link(self, device: str) -> LinkDegraded | None:
        """The link fault in force on ``device`` (the latest injected), if any."""
        found = [f for f in self.faults.values() if isinstance(f, LinkDegraded) and f.Device == device]
        return found[-1] if found else None

    def pcie_errors(self, device: str) -> dict[str, int]:
        """The error counters of the port to ``device``: the sums of its ``PCIeErrors`` faults."""
        found = [f for f in self.faults.values() if isinstance(f, PCIeErrors) and f.Device == device]
        return {c: sum(getattr(f, c) for f in found) for c in PCIE_ERROR_COUNTERS}

    def port_up(self, switch: str, host: str) -> bool:
        return not any(
            isinstance(f, PortDown) and f.Host == host and f.Switch in (None, switch)
            for f in self.faults.values()
        )

    def cut_links(self) -> frozenset[tuple[str, str]]:
        """(switch, port) of both ends of every inter-switch link whose cable is pulled."""
        ends: set[tuple[str, str]] = set()
        for fault in self.faults.values():
            if isinstance(fault, LinkRemoved):
                peer = self.index.peer_of(fault.Switch, fault.Port)
                if peer is not None:
                    ends.update({(fault.Switch, fault.Port), peer})
        return frozenset(ends)

    def ports_down(self) -> set[tuple[str, str]]:
        """(switch, host) of every upstream port that is down."""
        return {
            (sw.id, host)
            for sw in self.index.switches.values()
            for host in sw.upstream_ports
            if not self.port_up(sw.id, host)
        }

    def fault_of(self, kind: type[Any]) -> Any | None:
        return next((f for f in self.faults.values() if isinstance(f, kind)), None)

    def slow_seconds(self) -> float:
        slow = self.fault_of(SlowResponses)
        return float(slow.Seconds) if slow else 0.0

    def unavailable(self) -> Unavailable | None:
        fault = self.fault_of(Unavailable)
        return fault if isinstance(fault, Unavailable) else None

    # --- faults used up by what they act on ------------------------------------------------

    def take_drop(self) -> bool:
        """Whether this request's connection is to be dropped (consumes a counted fault)."""
        for fault_id, fault in list(self.faults.items()):
            if isinstance(fault, DropConnections):
                if fault.Count is None:
                    return True
                remaining = fault.Count - 1
                if remaining:
                    self._replace(fault_id, fault.model_copy(update={"Count": remaining}))
                else:
                    self._drop(fault_id)
                # counted drops are best-effort durable: persisted with the next commit
                return True
        return False

    def take_failure(self, kind: str, targets: list[str]) -> InjectedFailure | None:
        """The first FailOperations fault for ``kind`` (bind, unbind, reset, release) of ``targets``, used."""
        for fault_id, fault in list(self.faults.items()):
            if not isinstance(fault, FailOperations):
                continue
            # "any" is any binding change; a reset or a chunk's release fails only when a fault names it
            wanted = (kind,) if kind in ("reset", "release") else ("any", kind)
            if fault.Operation not in wanted or not self._names(fault.Target, targets):
                continue
            self._consume(fault_id, fault)
            return InjectedFailure(
                f"The fabric refused to {kind} {fmt_targets(targets)} (injected fault {fault_id}).",
                fault.MessageId,
                fault.HttpStatus,
            )
        return None

    def take_hang(self, targets: list[str]) -> bool:
        """Whether a HangTasks fault holds an operation on ``targets`` (consumes it)."""
        for fault_id, fault in list(self.faults.items()):
            if isinstance(fault, HangTasks) and self._names(fault.Target, targets):
                self._consume(fault_id, fault)
                return True
        return False

    def hang(self, task_id: str) -> asyncio.Event:
        """Hold task ``task_id`` until the faults are reset: the gate of this moment, so a reset
        that comes before the task's runner first runs still releases it."""
        self.hung.add(task_id)
        return self._unhang

    def _names(self, fault_target: str | None, targets: list[str]) -> bool:
        if fault_target is None:
            return True
        return any(fault_target in (t, self.index.targets[t].device.id) for t in targets)

    def _consume(self, fault_id: str, fault: FailOperations | HangTasks) -> None:
        if fault.Count > 1:
            self._replace(fault_id, fault.model_copy(update={"Count": fault.Count - 1}))
        else:
            self._drop(fault_id)

    def _replace(self, fault_id: str, fault: FaultSpec) -> None:
        self.faults[fault_id] = fault
        self.state.faults[fault_id].spec = fault.model_dump()
        self.revision.bump()

    def _drop(self, fault_id: str) -> None:
        self.faults.pop(fault_id, None)
        self.state.faults.pop(fault_id, None)
        self.revision.bump()

    # --- faults in and out -----------------------------------------------------------------

    def load(self) -> None:
        """The faults the durable state holds (at start); a record this version cannot read is dropped."""
        for fault_id, record in list(self.state.faults.items()):
            try:
                self.faults[fault_id] = fault_adapter.validate_python(record.spec)
            except ValueError:
                log.warning("dropping a stored fault this version does not understand", fault=fault_id)
                del self.state.faults[fault_id]

    def check(self, fault: FaultSpec) -> None:
        """Raise :class:`UnknownName` when ``fault`` names what the topology does not have."""
        if (
            isinstance(fault, FailOperations | HangTasks)
            and fault.Target is not None
            and fault.Target not in self.index.targets
            and fault.Target not in self.index.devices
        ):
            raise UnknownName("device or memory chunk", fault.Target, "Target")
        device = fault.Device if isinstance(fault, DeviceHealth | LinkDegraded | PCIeErrors) else None
        if device is not None and device not in self.index.devices:
            raise UnknownName("device", device, "Device")
        if isinstance(fault, PortDown):
            if fault.Host not in self.index.hosts:
                raise UnknownName("host", fault.Host, "Host")
            if fault.Switch is not None and fault.Switch not in self.index.switches:
                raise UnknownName("switch", fault.Switch, "Switch")
        if isinstance(fault, LinkRemoved):
            if fault.Switch not in self.index.switches:
                raise UnknownName("switch", fault.Switch, "Switch")
            if self.index.peer_of(fault.Switch, fault.Port) is None:
                raise UnknownName(f"inter-switch port of {fault.Switch}", fault.Port, "Port")

    def add(self, fault: FaultSpec) -> str:
        """Put ``fault`` in force, durably (with the next commit); its Id."""
        fault_id = self.state.allocate_id()
        self.faults[fault_id] = fault
        self.state.faults[fault_id] = FaultRecord(id=fault_id, spec=fault.model_dump(), created=utcnow())
        return fault_id

    def remove(self, ids: list[str], *, release_all: bool) -> int:
        """Take the faults ``ids`` out of force; hung tasks resume when ``release_all`` or when no
        HangTasks fault is left. Returns how many tasks resume."""
        for ident in ids:
            self.faults.pop(ident, None)
            self.state.faults.pop(ident, None)
        if release_all or not any(isinstance(f, HangTasks) for f in self.faults.values()):
            resumed = len(self.hung)
            self._unhang.set()
            self._unhang = asyncio.Event()
            return resumed
        return 0
