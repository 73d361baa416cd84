"""A process of a container bound to the share's NUMA node, for test_qemu_memory.py.

``python guest_memory_user.py READY MIB [PIN_PAGES]`` writes to MIB MiB of anonymous memory
(every page, so the kernel allocates it where the process's cgroup lets it), optionally pins the
first PIN_PAGES pages into a pipe it keeps open (``vmsplice``: the pipe holds references to them,
so the kernel cannot migrate them away, as with memory a device is doing I/O to), writes
``ready`` to READY and sleeps until it is killed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from pathlib import Path

PAGE = mmap.PAGESIZE


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def pin(memory: mmap.mmap, pages: int) -> int:
    """Splice ``pages`` pages of ``memory`` into a new pipe and keep it: the bytes pinned."""
    libc = ctypes.CDLL(None, use_errno=True)
    _read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    iov = _IoVec(ctypes.addressof(ctypes.c_char.from_buffer(memory)), pages * PAGE)
    pinned = int(libc.vmsplice(write_end, ctypes.byref(iov), 1, 0))
    if pinned < 0:
        raise OSError(ctypes.get_errno(), "vmsplice")
    return pinned


def main() -> None:
    ready, mib = Path(sys.argv[1]), int(sys.argv[2])
    pin_pages = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    memory = mmap.mmap(-1, mib << 20)
    for offset in range(0, mib << 20, PAGE):
        memory[offset] = 1
    pinned = pin(memory, pin_pages) if pin_pages else 0
    ready.write_text(f"ready {pinned}\n")
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
