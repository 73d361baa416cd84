"""Memory hot-add on a QEMU guest: a ``pc-dimm`` plugged into the guest's memory-only NUMA node and
taken away again (QEMU docs/memory-hotplug.txt), the closest a kernel here comes to a CXL memory
region appearing on a CPU-less node.

Plug: ``object-add`` of a ``memory-backend-ram``, then ``device_add pc-dimm`` on the node; the
guest's ACPI memory hot-plug driver adds its memory blocks under ``/sys/devices/system/memory``,
offline (the guest kernel's default, ``memhp_default_state``: whoever uses the memory onlines it,
in the zone it needs). Unplug: ``device_del`` asks the guest to eject the DIMM; QEMU sends
``DEVICE_DELETED`` once the guest let it go, then the backend is deleted. The guest's blocks must
be offline first: a kernel asked to eject memory that is online tries to offline it itself, and
one that cannot (pages in use) refuses the eject — the DIMM then stays, and :func:`unplug_dimm`
says so after its limit instead of waiting on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from emulator.errors import GuestError
from emulator.qemu.guest import MEMORY_NODE
from emulator.qemu.qmp import QmpClient, QmpError
from plumbing.logs import get_logger

__all__ = ["Dimm", "DimmNotReleased", "plug_dimm", "unplug_dimm"]

log = get_logger(__name__)


class DimmNotReleased(GuestError):
    """The guest did not let a DIMM go within the limit (memory still online, or in use)."""


@dataclass(frozen=True)
class Dimm:
    """A hot-added DIMM as QEMU placed it (``query-memory-devices``)."""

    id: str
    #: guest physical address and size, in bytes: which memory blocks of the guest are its
    addr: int
    size: int
    node: int

    @property
    def backend(self) -> str:
        return f"{self.id}-mem"

    def blocks(self, block_size: int) -> list[int]:
        """The guest's memory block numbers (``memory<N>``) this DIMM's range holds."""
        return list(range(self.addr // block_size, (self.addr + self.size) // block_size))


async def plug_dimm(qmp: QmpClient, dimm_id: str, size_bytes: int, *, node: int = MEMORY_NODE) -> Dimm:
    """Hot-add a ``pc-dimm`` of ``size_bytes`` on guest NUMA node ``node``; where QEMU put it."""
    backend = f"{dimm_id}-mem"
    await qmp.execute("object-add", **{"qom-type": "memory-backend-ram", "id": backend, "size": size_bytes})
    try:
        await qmp.execute("device_add", driver="pc-dimm", id=dimm_id, memdev=backend, node=node)
    except QmpError:
        with contextlib.suppress(QmpError):
            await qmp.execute("object-del", id=backend)
        raise
    for device in await qmp.execute("query-memory-devices"):
        data: dict[str, Any] = device.get("data", {})
        if device.get("type") == "dimm" and data.get("id") == dimm_id:
            dimm = Dimm(id=dimm_id, addr=int(data["addr"]), size=int(data["size"]), node=int(data["node"]))
            log.info("DIMM plugged", dimm=dimm_id, addr=hex(dimm.addr), size=dimm.size, node=dimm.node)
            return dimm
    raise GuestError(f"QEMU lists no DIMM {dimm_id} after plugging it")


async def unplug_dimm(qmp: QmpClient, dimm: Dimm, *, within: float) -> float:
    """``device_del`` the DIMM, wait for ``DEVICE_DELETED`` and delete its backend; the seconds
    the guest took. :class:`DimmNotReleased` past ``within`` (the DIMM stays plugged)."""
    deleted = asyncio.Event()

    def on_event(event: str, data: dict[str, Any], _when: float) -> None:
        if event == "DEVICE_DELETED" and data.get("device") == dimm.id:
            deleted.set()

    stop = qmp.listen(on_event)
    started = time.monotonic()
    try:
        await qmp.execute("device_del", id=dimm.id)
        try:
            await asyncio.wait_for(deleted.wait(), within)
        except TimeoutError:
            raise DimmNotReleased(
                f"the guest did not release DIMM {dimm.id} within {within:.0f}s (its memory online or "
                "in use); it stays plugged"
            ) from None
    finally:
        stop()
    seconds = time.monotonic() - started
    await qmp.execute("object-del", id=dimm.backend)
    log.info("DIMM released", dimm=dimm.id, seconds=round(seconds, 3))
    return seconds
