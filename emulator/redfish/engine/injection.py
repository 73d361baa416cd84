"""Faults in and out: a fault injected or removed durably, with what it changes — targets that
appear or vanish on their hosts (a port down), health and link events — in one commit."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from emulator.redfish.engine.bindings import Revision
from emulator.redfish.engine.conditions import Conditions
from emulator.redfish.engine.events import EventBus, FabricEvent
from emulator.redfish.engine.journal import Change, Journal
from emulator.redfish.engine.visibility import Visibility
from emulator.redfish.model import uris
from emulator.redfish.model.faults import ExpireSessions, FaultSpec, LinkDegraded
from emulator.redfish.model.state import SideEffect
from emulator.topology import FabricIndex
from plumbing.logs import get_logger

__all__ = ["FaultInjector"]

log = get_logger(__name__)

_HEALTH_EVENT = {"OK": "ResourceStatusChangedOK", "Warning": "ResourceStatusChangedWarning"}


@dataclass(frozen=True)
class _Before:
    """What faults change, as it was before a change: host-view visibility, device health, ports down."""

    visible: dict[str, bool]
    health: dict[str, str]
    ports_down: set[tuple[str, str]]
    #: device → its link fault (None: trained as negotiated)
    links: dict[str, LinkDegraded | None]
    #: device → the error counters of its port
    errors: dict[str, dict[str, int]]
    #: (switch, port) of the inter-switch link ends whose cable is pulled
    cut: frozenset[tuple[str, str]]


@dataclass(eq=False)
class FaultInjector:
    index: FabricIndex
    conditions: Conditions
    visibility: Visibility
    events: EventBus
    journal: Journal
    revision: Revision
    #: ends every open session, for an ExpireSessions fault
    expire_sessions: Callable[[], int]

    async def inject(self, fault: FaultSpec) -> tuple[str | None, str]:
        """Inject ``fault``; returns its Id (None when it acted once) and what it did."""
        if isinstance(fault, ExpireSessions):
            count = self.expire_sessions()
            log.warning("all sessions expired (injected fault)", sessions=count)
            return None, f"expired {count} session(s)"
        self.conditions.check(fault)
        before = self._before()
        fault_id = self.conditions.add(fault)
        effects, events = self._effects(before)
        self.revision.bump()
        log.warning("fault injected", fault=fault_id, kind=fault.Kind, spec=json.dumps(fault.model_dump()))
        await self.journal.commit(effects, events)
        return fault_id, "active"

    async def remove(self, fault_id: str | None = None) -> tuple[int, int]:
        """Remove one fault, or all (``None``); hung tasks resume. Returns (faults removed, tasks resumed)."""
        ids = [fault_id] if fault_id is not None else list(self.conditions.faults)
        before = self._before()
        resumed = self.conditions.remove(ids, release_all=fault_id is None)
        effects, events = self._effects(before)
        self.revision.bump()
        log.warning("faults removed", count=len(ids), resumed_tasks=resumed)
        await self.journal.commit(effects, events)
        return len(ids), resumed

    def _before(self) -> _Before:
        bindings = self.conditions.state.bindings
        return _Before(
            visible={t: self.visibility.visible(b) for t, b in bindings.items()},
            health={d: self.conditions.health(d) for d in self.index.devices},
            ports_down=self.conditions.ports_down(),
            links={d: self.conditions.link(d) for d in self.index.devices},
            errors={d: self.conditions.pcie_errors(d) for d in self.index.devices},
            cut=self.conditions.cut_links(),
        )

    def _effects(self, before: _Before) -> Change:
        effects: list[SideEffect] = []
        for t, binding in self.conditions.state.bindings.items():
            now_visible = self.visibility.visible(binding)
            if now_visible != before.visible.get(t, now_visible):
                effects.append(
                    self.visibility.show(binding) if now_visible else self.visibility.hide(binding)
                )
        return effects, [
            *self._port_events(before.ports_down),
            *self._health_events(before.health),
            *self._link_events(before.links),
            *self._error_events(before.errors),
            *self._interswitch_events(before.cut),
        ]

    def _interswitch_events(self, cut_before: frozenset[tuple[str, str]]) -> list[FabricEvent]:
        """``ResourceChanged`` of each inter-switch port whose cable was pulled or put back."""
        return [
            self.events.make(
                "ResourceChanged",
                prefix="ResourceEvent",
                origin=uris.port(self.index.switches[switch].fabric, switch, port),
            )
            for switch, port in sorted(cut_before ^ self.conditions.cut_links())
        ]

    def _port_events(self, down_before: set[tuple[str, str]]) -> list[FabricEvent]:
        events = []
        for sw in self.index.switches.values():
            for host, port in sw.upstream_ports.items():
                is_down = not self.conditions.port_up(sw.id, host)
                if is_down != ((sw.id, host) in down_before):
                    key = "UpstreamLinkDropped" if is_down else "UpstreamLinkEstablished"
                    origin = uris.port(sw.fabric, sw.id, port)
                    events.append(self.events.make(key, sw.id, port, prefix="Fabric", origin=origin))
        return events

    def _health_events(self, health_before: dict[str, str]) -> list[FabricEvent]:
        events = []
        for device_id, was in health_before.items():
            now = self.conditions.health(device_id)
            if now != was:
                key = _HEALTH_EVENT.get(now, "ResourceStatusChangedCritical")
                origin = uris.pcie_device(self.index.devices[device_id])
                events.append(self.events.make(key, device_id, now, prefix="ResourceEvent", origin=origin))
        return events

    def _link_events(self, links_before: dict[str, LinkDegraded | None]) -> list[FabricEvent]:
        """``ResourceChanged`` of each device whose PCIeInterface changed (a link fault in or out)."""
        events = []
        for device_id, was in links_before.items():
            if self.conditions.link(device_id) != was:
                origin = uris.pcie_device(self.index.devices[device_id])
                events.append(self.events.make("ResourceChanged", prefix="ResourceEvent", origin=origin))
        return events

    def _error_events(self, errors_before: dict[str, dict[str, int]]) -> list[FabricEvent]:
        """``ResourceChanged`` of the port metrics of each device whose error counters changed."""
        events = []
        for device_id, was in errors_before.items():
            if self.conditions.pcie_errors(device_id) != was:
                device = self.index.devices[device_id]
                origin = uris.port_metrics(device.fabric, device.switch, device.port)
                events.append(self.events.make("ResourceChanged", prefix="ResourceEvent", origin=origin))
        return events
