"""One change of the bindings: checked against what is bound and in flight, then applied at once —
the bindings, the zone or connection it creates, changes or deletes, the host-view updates and
the events — without an ``await`` between check and change (see :mod:`emulator.redfish.engine.engine`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from emulator.errors import PortIsDown, TargetBusy
from emulator.redfish.engine.bindings import BindingTable
from emulator.redfish.engine.conditions import Conditions
from emulator.redfish.engine.events import EventBus, FabricEvent
from emulator.redfish.engine.journal import Change
from emulator.redfish.engine.operation import Operation, fmt_targets
from emulator.redfish.engine.visibility import Visibility
from emulator.redfish.model import uris
from emulator.redfish.model.state import (
    BindingRecord,
    ConnectionRecord,
    FabricState,
    SideEffect,
    ZoneRecord,
    utcnow,
)
from emulator.redfish.sysfs.hostview import allocate_address, cpu_nodes
from emulator.topology import FabricIndex, Target
from plumbing.logs import get_logger

__all__ = ["Binder"]

log = get_logger(__name__)


@dataclass(eq=False)
class Binder:
    index: FabricIndex
    table: BindingTable
    conditions: Conditions
    visibility: Visibility
    events: EventBus

    @property
    def state(self) -> FabricState:
        return self.table.state

    # --- checks ----------------------------------------------------------------------------

    def check(self, op: Operation) -> None:
        """Raise unless ``op`` may start now: a bind needs free targets whose host port is up; an
        unbind, targets (and a deleted zone) with no operation in flight."""
        if op.binds:
            for t in op.targets:
                bound = self.state.bindings.get(t)
                if bound is not None:
                    raise TargetBusy(f"{t} is bound to {bound.host}; unbind it there first.")
                self.check_not_in_flight([t])
            self.check_ports(op)
            return
        if op.delete_zone and op.zone is not None:
            busy = sorted(
                t for t, task_id in self.table.inflight.items() if self.state.tasks[task_id].zone == op.zone
            )
            if busy:
                raise TargetBusy(
                    f"Zone {op.zone} has operations in progress ({fmt_targets(busy)}); retry when they end."
                )
        self.check_not_in_flight(op.targets)

    def check_not_in_flight(self, targets: list[str]) -> None:
        for t in targets:
            task_id = self.table.inflight.get(t)
            if task_id is not None:
                raise TargetBusy(f"{t} has an operation in progress (task {task_id}).")

    def check_ports(self, op: Operation) -> None:
        for t in op.targets:
            switch = self.index.targets[t].device.switch
            if not self.conditions.port_up(switch, op.host):
                port = self.index.switches[switch].upstream_ports.get(op.host, "?")
                raise PortIsDown(
                    f"The host port {port} of {switch} to {op.host} is down; {t} cannot be bound to it."
                )

    # --- the change ------------------------------------------------------------------------

    def apply(self, op: Operation) -> Change:
        """Change the bindings (synchronously); returns host-view effects and events to send."""
        now = utcnow()
        with self.table.changing(op.targets):
            effects, events = self._bind(op, now) if op.binds else self._unbind(op)
            events += self._zone_and_connection(op, now)
            events.append(
                self.events.make("ResourceChanged", prefix="ResourceEvent", origin=uris.system(op.host))
            )
            self.table.revision.bump()
        log.info(
            "bound" if op.binds else "unbound",
            device=fmt_targets(op.targets),
            node=op.host,
            style=op.style.value,
        )
        return effects, events

    def _bind(self, op: Operation, now: datetime) -> Change:
        effects: list[SideEffect] = []
        events: list[FabricEvent] = []
        for t in op.targets:
            target = self.index.targets[t]
            others = [(b, self.index.targets[b.target].device.id) for b in self.table.host_bindings(op.host)]
            address = allocate_address(
                others,
                target.device.type,
                target.device.id,
                size_bytes=target.chunk.size_bytes if target.chunk else 0,
                first_memory_node=cpu_nodes(self.index.hosts[op.host].numa_node),
            )
            binding = BindingRecord(
                target=t,
                host=op.host,
                style=op.style,
                zone=op.zone,
                connection=op.connection,
                since=now,
                address=address,
            )
            self.state.bindings[t] = binding
            if self.visibility.visible(binding):
                effects.append(self.visibility.show(binding))
            events.extend(self._target_events(target))
        return effects, events

    def _unbind(self, op: Operation) -> Change:
        effects: list[SideEffect] = []
        events: list[FabricEvent] = []
        for t in op.targets:
            removed = self.state.bindings.pop(t, None)
            if removed is None:
                continue
            if self.visibility.visible(removed):
                effects.append(self.visibility.hide(removed))
            events.extend(self._target_events(self.index.targets[t]))
        return effects, events

    def _zone_and_connection(self, op: Operation, now: datetime) -> list[FabricEvent]:
        """The zone the targets join or leave and the connection they come with: created with a
        bind that asks for it, deleted with an unbind that asks for it, else only changed."""
        events: list[FabricEvent] = []
        if op.zone:
            made = op.create_zone if op.binds else op.delete_zone
            if made and op.binds:
                self.state.zones[op.zone] = ZoneRecord(
                    id=op.zone,
                    fabric=op.fabric,
                    host=op.host,
                    name=op.name,
                    description=op.description,
                    created=now,
                )
            elif made:
                self.state.zones.pop(op.zone, None)
            key = ("ZoneCreated" if op.binds else "ZoneRemoved") if made else "ZoneModified"
            events.append(
                self.events.make(
                    key, op.zone, op.fabric, prefix="Fabric", origin=uris.zone(op.fabric, op.zone)
                )
            )
        if op.connection and (op.create_connection if op.binds else op.delete_connection):
            if op.binds:
                self.state.connections[op.connection] = ConnectionRecord(
                    id=op.connection,
                    fabric=op.fabric,
                    host=op.host,
                    chunks=list(op.targets),
                    access=op.access,
                    name=op.name,
                    description=op.description,
                    created=now,
                )
            else:
                self.state.connections.pop(op.connection, None)
            key = "ConnectionCreated" if op.binds else "ConnectionRemoved"
            origin = uris.connection(op.fabric, op.connection)
            events.append(self.events.make(key, op.connection, op.fabric, prefix="Fabric", origin=origin))
            # and in the words of any resource's life (ResourceEvent 1.4), for clients that
            # follow resources rather than fabric events
            life = "ResourceCreated" if op.binds else "ResourceRemoved"
            events.append(self.events.make(life, prefix="ResourceEvent", origin=origin))
        return events

    def _target_events(self, target: Target) -> list[FabricEvent]:
        dev = target.device
        if target.chunk is not None:
            origin = uris.chunk(dev.id, target.chunk.index)
            return [self.events.make("ResourceChanged", prefix="ResourceEvent", origin=origin)]
        return [
            self.events.make(
                "ResourceChanged", prefix="ResourceEvent", origin=uris.endpoint(dev.fabric, dev.id)
            ),
            self.events.make(
                "ResourceBlockCompositionStateChanged",
                dev.id,
                prefix="Composition",
                origin=uris.resource_block(dev.id),
            ),
        ]
