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
``query-memory-devices``), with the dax drivers' ``new_id`` and ``unbind`` files beside it.

``HostMemory`` runs as on a real host (``real_host=True``): its offline writes are made by a child
process it kills after its time, because a 6.1 kernel offlining a movable block whose pages it
cannot migrate (pinned) does not answer ``EBUSY``: it retries the migration until the writer gets
a signal, then answers ``EINTR``. Its dax driver moves (``kmem/new_id``) land in the described
tree.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.hostmemory import HostMemory, MemoryRecord
from dra_driver.plugin.hostview import HostDevice

SYSTEM = Path("/sys/devices/system")
DESCRIBED = Path("/run/fdq-memory")


def described_root(dimm: str, addr: int, size: int, node: int) -> Path:
    """A sysfs root whose ``devices/system`` is the kernel's and whose one dax device describes
    the DIMM's range (module docstring)."""
    root = DESCRIBED / dimm
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
    for driver in ("device_dax", "kmem"):
        (root / "bus" / "dax" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        for name in ("unbind", "new_id"):
            (root / "bus" / "dax" / "drivers" / driver / name).touch()
    return root


async def online(dimm: str, addr: int, size: int, node: int) -> dict[str, object]:
    root = described_root(dimm, addr, size, node)
    memory = HostMemory(root, real_host=True)
    host = HostDevice(sysfs_path=str(root / "bus" / "dax" / "devices" / "dax0.0"), region=dimm, dax="dax0.0")
    record = await memory.online(host, device=dimm)
    moved = (root / "bus" / "dax" / "drivers" / "kmem" / "new_id").read_text()
    return {"record": record.model_dump(mode="json"), "kmem_new_id": moved}


async def offline(dimm: str, blocks: list[int], within: float) -> dict[str, object]:
    memory = HostMemory(DESCRIBED / dimm, real_host=True)
    record = MemoryRecord(mode=MemoryMode.KMEM, dax="dax0.0", blocks=blocks)
    await memory.offline(record, device=dimm, within=within)
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
