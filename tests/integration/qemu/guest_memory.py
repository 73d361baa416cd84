"""The plugin's memory code (:class:`~dra_driver.plugin.hostmemory.HostMemory`) on a QEMU guest's
real kernel, for test_qemu_memory.py.

``python guest_memory.py OUT online DIMM ADDR SIZE NODE`` onlines the hot-added DIMM's memory
blocks as the plugin onlines a CXL share's in kmem mode; ``python guest_memory.py OUT offline
DIMM BLOCKS WITHIN`` offlines them as its unprepare does, refusals retried for WITHIN seconds.
One JSON line goes to OUT: the record, or the one-line error and its class.

What is the guest's own and what is described: the memory blocks (``state``, ``online``,
``valid_zones``) and the NUMA nodes (``has_memory``) are the guest kernel's, under
``/sys/devices/system``. A DIMM has no CXL region and so no dax device, which is how the plugin
finds a share's blocks and node; the dax device the kernel would show for a region of that range
is written into a small tree beside them (``resource``, ``size``, ``target_node``, from QEMU's
``query-memory-devices``), and ``HostMemory`` runs with ``real_host=False``, so that it does not
move that made-up dax device between the ``kmem`` and ``device_dax`` drivers.

The offline write is bounded here: a 6.1 kernel offlining a movable block whose pages it cannot
migrate (pinned) does not answer ``EBUSY``, it retries the migration until the writer gets a
signal, and then answers ``EINTR`` (Documentation/admin-guide/mm/memory-hotplug.rst: "the
offlining context can be terminated by sending a signal"). Each ``offline`` write is given
:data:`WRITE_SECONDS` by a one-shot ``SIGALRM``; ``HostMemory`` counts ``EINTR`` as a refusal and
retries.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.hostmemory import HostMemory, MemoryRecord
from dra_driver.plugin.hostview import HostDevice

SYSTEM = Path("/sys/devices/system")
#: how long one offline write may run before its signal ends it (the kernel then answers EINTR)
WRITE_SECONDS = 2.0


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    # the write fails with the kernel's EINTR instead of being retried (PEP 475)
    raise InterruptedError(4, "Interrupted system call")


class BoundedHostMemory(HostMemory):
    """``HostMemory`` whose offline writes a signal ends after :data:`WRITE_SECONDS`."""

    def _write_state(self, block: int, value: str) -> OSError | None:
        if value != "offline":
            return super()._write_state(block, value)
        previous = signal.signal(signal.SIGALRM, _interrupted)
        signal.setitimer(signal.ITIMER_REAL, WRITE_SECONDS)
        try:
            return super()._write_state(block, value)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def described_root(dimm: str, addr: int, size: int, node: int) -> Path:
    """A sysfs root whose ``devices/system`` is the kernel's and whose one dax device describes
    the DIMM's range (module docstring)."""
    root = Path("/run/fdq-memory") / dimm
    (root / "devices").mkdir(parents=True, exist_ok=True)
    for name in ("memory", "node"):
        link = root / "devices" / "system" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(SYSTEM / name)
    dax = root / "bus" / "dax" / "devices" / "dax0.0"
    dax.mkdir(parents=True, exist_ok=True)
    (dax / "resource").write_text(f"{addr:#x}\n")
    (dax / "size").write_text(f"{size}\n")
    (dax / "target_node").write_text(f"{node}\n")
    return root


async def online(dimm: str, addr: int, size: int, node: int) -> dict[str, object]:
    root = described_root(dimm, addr, size, node)
    memory = HostMemory(root, real_host=False)
    host = HostDevice(sysfs_path=str(root / "bus" / "dax" / "devices" / "dax0.0"), region=dimm, dax="dax0.0")
    record = await memory.online(host, device=dimm)
    return {"record": record.model_dump(mode="json")}


async def offline(dimm: str, blocks: list[int], within: float) -> dict[str, object]:
    memory = BoundedHostMemory(Path("/sys"), real_host=False)
    await memory.offline(MemoryRecord(mode=MemoryMode.KMEM, blocks=blocks), device=dimm, within=within)
    return {"offline": blocks}


def main() -> None:
    out, what, dimm, *args = sys.argv[1:]
    started = time.monotonic()
    try:
        if what == "online":
            answer = asyncio.run(online(dimm, int(args[0]), int(args[1]), int(args[2])))
        else:
            answer = asyncio.run(offline(dimm, [int(b) for b in args[0].split(",")], float(args[1])))
    except Exception as err:  # the test reads the one line and the class
        answer = {"error": str(err), "class": type(err).__name__}
    answer["seconds"] = round(time.monotonic() - started, 3)
    Path(out).write_text(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
