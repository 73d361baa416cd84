"""CXL memory a share brought to this host, handed to a container one of two ways (``--memory-mode``
or a claim's configuration; docs/plugin.md, "CXL memory shares"):

``devdax``
    the region's dax device (``/dev/dax<R>.<M>``) as a device node: the container maps it; the
    kernel's allocator never sees the memory, so nothing else on the node can use it.
``kmem``
    the region's memory blocks onlined as movable system RAM (``online_movable`` written to each
    block's ``state``, Documentation/admin-guide/mm/memory-hotplug.rst), which becomes the memory of
    a CPU-less NUMA node (the dax device's ``target_node``); the container is bound to that node by
    a CDI hook that sets its cgroup's ``cpuset.mems`` (:mod:`dra_driver.plugin.cdihook`).

On unprepare the blocks are offlined before the fabric takes the memory away. The kernel refuses
to offline a block whose pages it cannot migrate (``EBUSY``, or ``EINVAL`` for a block that spans
zones): :class:`MemoryInUse`, retriable — the memory is never detached while a block is online.

On a real host a ``state`` write is answered at once (the write fails with the kernel's errno),
except an offline of movable memory whose pages the kernel cannot migrate (pinned): Linux retries
that inside the write until the writer gets a signal, then answers ``EINTR``
(Documentation/admin-guide/mm/memory-hotplug.rst: "the offlining context can be terminated by
sending a signal"; seen on a 6.1 kernel, tests/integration/qemu/test_qemu_memory.py). So a real
host's offline is written by a child process ended after :data:`OFFLINE_WRITE_SECONDS`, and its
``EINTR`` counts as a refusal.
The emulated host's kernel answers within a tick (docs/emulator.md, "What a host sees"): the
write is taken, and ``online`` (``1``/``0``) and ``state`` change when it acts; a refusal there
is ``state`` reading ``online`` again after ``offline`` was written. Both are read the same way:
after the write, wait until ``online`` says the block changed or ``state`` says it was refused.
A real host also needs the dax device on the right driver (``kmem`` for system RAM,
``device_dax`` for the device node); an emulated one has no drivers.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.hostview import HostDevice, link_name, read_attr
from manager_api.errors import FabricError
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = [
    "HostMemory",
    "MemoryFailed",
    "MemoryInUse",
    "MemoryMode",
    "MemoryRecord",
    "node_list",
]

log = get_logger(__name__)

#: how long the emulated kernel (or a slow real one) may take to answer a ``state`` write
STATE_ANSWER_SECONDS = 10.0
#: how long an offline written at the deadline still waits for its answer
_LAST_ANSWER_SECONDS = 1.0
#: on a real host, how long one offline write may run before its writer is killed (module doc)
OFFLINE_WRITE_SECONDS = 2.0
#: the child that writes one offline: the kernel's errno as its exit status
_WRITE_OFFLINE = (
    "import os, sys\n"
    "try:\n"
    "    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)\n"
    "    os.write(fd, b'offline\\n')\n"
    "except OSError as err:\n"
    "    sys.exit(err.errno or 1)\n"
)


class MemoryFailed(KubeletPluginError):
    """The share's memory could not be made usable on this node (one line). ``permanent``: it
    cannot be on this node in the mode asked (a share smaller than a memory block in kmem mode)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class MemoryInUse(KubeletPluginError, FabricError):
    """Memory blocks the kernel would not offline (pages in use): the share stays online and
    attached, recorded for its claim; the kubelet's retry tries again."""

    code = "MemoryInUse"
    retriable = True


class MemoryRecord(BaseModel):
    """How a share's memory is given to its container (stored in the checkpoint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: MemoryMode
    dax: str | None = Field(default=None, description="the dax device, dax<R>.<M>")
    node: int | None = Field(default=None, description="kmem: the CPU-less NUMA node the memory became")
    blocks: list[int] = Field(default_factory=list, description="kmem: the memory blocks onlined")


@dataclass(frozen=True, slots=True)
class _Dax:
    name: str
    path: Path
    target_node: int | None
    resource: int | None
    size: int | None


def node_list(text: str | None) -> set[int]:
    """A kernel node list (``0-1,3``) as a set; empty or unreadable → empty."""
    nodes: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            nodes.update(range(int(low), int(high or low) + 1))
        except ValueError:
            return set()
    return nodes


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


class HostMemory:
    """Onlines and offlines the memory of CXL regions in one sysfs tree."""

    def __init__(
        self,
        sysfs_root: Path,
        *,
        real_host: bool,
        clock: Callable[[], float] = time.monotonic,
        answer_seconds: float = STATE_ANSWER_SECONDS,
        write_seconds: float = OFFLINE_WRITE_SECONDS,
    ) -> None:
        self.root = sysfs_root
        self.real_host = real_host
        self._clock = clock
        self.answer_seconds = answer_seconds
        self.write_seconds = write_seconds

    @property
    def _memory(self) -> Path:
        return self.root / "devices" / "system" / "memory"

    @property
    def _nodes(self) -> Path:
        return self.root / "devices" / "system" / "node"

    def _dax(self, host: HostDevice) -> _Dax:
        if not host.dax:
            raise MemoryFailed(f"region {host.region} has no dax device on this node")
        return self._dax_named(host.dax)

    def _dax_named(self, name: str) -> _Dax:
        path = self.root / "bus" / "dax" / "devices" / name
        return _Dax(
            name=name,
            path=path,
            target_node=_int(read_attr(path / "target_node")),
            resource=_int(read_attr(path / "resource"), 0),
            size=_int(read_attr(path / "size")),
        )

    def block_size(self) -> int | None:
        # hex without 0x, as the kernel prints it (drivers/base/memory.c, block_size_bytes_show)
        return _int(read_attr(self._memory / "block_size_bytes"), 16)

    def _blocks(self, dax: _Dax) -> list[int]:
        """The memory blocks of the dax device's range that exist (kmem onlines whole blocks only)."""
        block = self.block_size()
        if not block or dax.resource is None or not dax.size:
            return []
        first = -(-dax.resource // block)
        end = (dax.resource + dax.size) // block
        return [b for b in range(first, end) if (self._memory / f"memory{b}").is_dir()]

    def region_blocks(self, host: HostDevice) -> list[int]:
        """The memory blocks of ``host``'s dax device (none when it has none here)."""
        return self._blocks(self._dax_named(host.dax)) if host.dax else []

    # -- one block ---------------------------------------------------------------------------

    def _write_state(self, block: int, value: str) -> OSError | None:
        """Write ``value`` to the block's ``state``; the kernel's refusal, if it gave one at once."""
        path = self._memory / f"memory{block}" / "state"
        if value == "offline" and self.real_host:
            return self._write_offline_bounded(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        except OSError as err:
            return err
        try:
            os.write(fd, f"{value}\n".encode())
        except OSError as err:
            return err
        finally:
            os.close(fd)
        return None

    def _write_offline_bounded(self, path: Path) -> OSError | None:
        """``offline`` written by a child process killed after ``write_seconds`` (module doc):
        a write in this process could not be ended, and would hold it while the pages stay
        pinned. Killed, the kernel gives up the offline (``EINTR``)."""
        try:
            done = subprocess.run(  # noqa: S603 - this interpreter, our own script
                [sys.executable, "-S", "-c", _WRITE_OFFLINE, str(path)],
                timeout=self.write_seconds,
                capture_output=True,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return OSError(errno.EINTR, os.strerror(errno.EINTR))
        except OSError as err:
            return err
        if done.returncode == 0:
            return None
        code = done.returncode if 0 < done.returncode < 256 else errno.EIO
        return OSError(code, os.strerror(code))

    def _read(self, block: int) -> tuple[str | None, str | None]:
        base = self._memory / f"memory{block}"
        return read_attr(base / "state"), read_attr(base / "online")

    async def _await_answer(self, block: int, *, online: bool, until: float | None = None) -> bool:
        """Whether the kernel took the change: ``online`` reads ``1``/``0`` → True; ``state``
        reads what it was before the write → False (refused); no answer by ``until`` → False
        (not yet: asked again)."""
        deadline = self._clock() + self.answer_seconds
        backoff = Backoff(initial=0.005, maximum=0.1, jitter=0)
        while True:
            state, flag = self._read(block)
            if flag == ("1" if online else "0") and state == ("online" if online else "offline"):
                return True
            # the kernel put it back as it was: it refused the change (our own write reads
            # ``offline`` or ``online_movable``, never the state it replaced)
            if state == ("offline" if online else "online"):
                return False
            if until is not None and self._clock() >= until:
                return False
            if self._clock() >= deadline:
                raise MemoryFailed(
                    f"memory block {block} did not go {'online' if online else 'offline'} within "
                    f"{self.answer_seconds:.0f}s (its state reads {state!r})"
                )
            await backoff.sleep()

    # -- a share's memory ----------------------------------------------------------------------

    async def online(self, host: HostDevice, *, device: str) -> MemoryRecord:
        """Make the share's memory system RAM of its CPU-less node (kmem); idempotent."""
        dax = self._dax(host)
        if self.real_host:
            await asyncio.to_thread(self._bind, dax, "kmem")
        blocks = self._blocks(dax)
        if not blocks:
            block = self.block_size()
            raise MemoryFailed(
                f"the memory of {device} ({dax.size or 0} bytes at {dax.name}) holds no whole memory block "
                f"of this node ({block or '?'} bytes), so it cannot be onlined as system RAM: ask for a "
                "multiple of the block size, or use devdax mode",
                permanent=True,
            )
        if dax.target_node is None:
            raise MemoryFailed(f"{dax.name} of {device} names no target NUMA node")
        # every write first, then every answer: an emulated kernel answers them all in one tick
        written: list[int] = []
        for block in blocks:
            state, _flag = self._read(block)
            if state == "online":
                continue
            refused = self._write_state(block, "online_movable")
            if refused is not None:
                raise MemoryFailed(
                    f"memory block {block} of {device} could not be onlined as movable memory "
                    f"({refused.strerror}); check the kernel log"
                )
            written.append(block)
        for block in written:
            if not await self._await_answer(block, online=True):
                raise MemoryFailed(
                    f"memory block {block} of {device} could not be onlined as movable memory (the "
                    "kernel did not take it); check the kernel log"
                )
        await self._await_node_memory(dax.target_node, device)
        log.info("memory onlined", device=device, dax=dax.name, node=dax.target_node, blocks=len(blocks))
        return MemoryRecord(mode=MemoryMode.KMEM, dax=dax.name, node=dax.target_node, blocks=blocks)

    async def _await_node_memory(self, node: int, device: str) -> None:
        deadline = self._clock() + self.answer_seconds
        backoff = Backoff(initial=0.005, maximum=0.1, jitter=0)
        while node not in node_list(read_attr(self._nodes / "has_memory")):
            if self._clock() >= deadline:
                raise MemoryFailed(
                    f"NUMA node {node} of {device} has no memory after its blocks were onlined "
                    f"({self._nodes / 'has_memory'} does not list it)"
                )
            await backoff.sleep()

    async def devdax(self, host: HostDevice, *, device: str) -> MemoryRecord:
        """Keep the share's memory a dax device (its node for the container); idempotent."""
        dax = self._dax(host)
        if self.real_host and link_name(dax.path / "driver") == "kmem":
            # a kernel that hands new CXL RAM to kmem by itself (6.3+): take it back first
            await self.offline(MemoryRecord(mode=MemoryMode.KMEM, dax=dax.name, blocks=self._blocks(dax)),
                               device=device, within=self.answer_seconds)  # fmt: skip
            await asyncio.to_thread(self._bind, dax, "device_dax")
        return MemoryRecord(mode=MemoryMode.DEVDAX, dax=dax.name, node=dax.target_node)

    async def offline(self, record: MemoryRecord, *, device: str, within: float) -> None:
        """Offline every block of a kmem share, retrying refusals for ``within`` seconds; then
        :class:`MemoryInUse` naming the blocks still online. Never takes memory away online."""
        if record.mode is not MemoryMode.KMEM:
            return
        deadline = self._clock() + within
        backoff = Backoff(initial=0.1, maximum=2.0, jitter=0)
        while True:
            busy: list[tuple[int, str]] = []
            written: list[int] = []
            for block in sorted(record.blocks, reverse=True):
                state, _flag = self._read(block)
                if state is None or state == "offline":
                    continue  # gone with its region, or offline already
                # in a thread: a real host's write may take up to write_seconds
                refused = await asyncio.to_thread(self._write_state, block, "offline")
                if refused is None:
                    written.append(block)
                elif refused.errno in (errno.EBUSY, errno.EINVAL, errno.EAGAIN, errno.EINTR):
                    busy.append((block, refused.strerror or "refused"))
                else:
                    raise MemoryFailed(f"memory block {block} of {device}: {refused.strerror}")
            # a write is given a moment for its answer even at the deadline: none left pending
            until = max(deadline, self._clock() + _LAST_ANSWER_SECONDS)
            for block in written:
                if not await self._await_answer(block, online=False, until=until):
                    busy.append((block, os.strerror(errno.EBUSY)))
            if not busy:
                break
            if self._clock() >= deadline:
                blocks = ", ".join(f"memory{b}" for b, _ in busy[:8]) + (" …" if len(busy) > 8 else "")
                raise MemoryInUse(
                    f"the kernel would not offline {len(busy)} memory block(s) of {device} ({blocks}: "
                    f"{busy[0][1]}; pages in use that it could not migrate away); the memory stays online "
                    "and attached to this node",
                    device=device,
                )
            log.warning("memory blocks busy, offline retried", device=device, blocks=len(busy))
            await backoff.sleep(at_most=max(0.0, deadline - self._clock()))
        if self.real_host and record.dax:
            dax = self._dax_named(record.dax)
            if link_name(dax.path / "driver") == "kmem":
                await asyncio.to_thread(self._unbind, dax)
        log.info("memory offlined", device=device, dax=record.dax, blocks=len(record.blocks))

    # -- real hosts: the dax device's driver ----------------------------------------------------

    def _bind(self, dax: _Dax, driver: str) -> None:
        """Move the dax device to ``driver`` (``kmem`` or ``device_dax``): unbind from the one it
        has, then ``new_id`` on the wanted one, as the kmem hot-add series documents it."""
        current = link_name(dax.path / "driver")
        if current == driver:
            return
        drivers = self.root / "bus" / "dax" / "drivers"
        try:
            if current is not None:
                (drivers / current / "unbind").write_text(dax.name)
            target = drivers / driver
            if (target / "new_id").exists():
                (target / "new_id").write_text(dax.name)
            else:
                (target / "bind").write_text(dax.name)
        except OSError as err:
            raise MemoryFailed(
                f"{dax.name} could not be moved from driver {current or 'none'} to {driver} "
                f"({err.strerror or err}); is the {driver} module loaded ('modprobe {driver}')?"
            ) from err
        log.info("dax device driver changed", dax=dax.name, driver=driver, was=current)

    def _unbind(self, dax: _Dax) -> None:
        current = link_name(dax.path / "driver")
        if current is None:
            return
        try:
            (self.root / "bus" / "dax" / "drivers" / current / "unbind").write_text(dax.name)
        except OSError as err:
            log.warning("dax device could not be unbound", dax=dax.name, driver=current, error=str(err))
