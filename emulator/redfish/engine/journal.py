"""One durable commit of the fabric: the state on disk, then the host views' changes, then the events."""

from __future__ import annotations

from dataclasses import dataclass

from emulator.redfish.engine.events import EventBus, FabricEvent
from emulator.redfish.model.state import SideEffect, StateStore

__all__ = ["Change", "Journal"]

#: what a change of the fabric leaves to do once it is durable: host-view updates and events to send
Change = tuple[list[SideEffect], list[FabricEvent]]


@dataclass(eq=False)
class Journal:
    store: StateStore
    events: EventBus

    async def commit(self, effects: list[SideEffect], events: list[FabricEvent]) -> None:
        """Write the state (with the event counter), run ``effects``, then publish ``events``."""
        self.store.state.event_seq = self.events.seq
        await self.store.commit(effects)
        self.events.publish(events)
