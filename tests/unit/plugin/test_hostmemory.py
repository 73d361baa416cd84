"""A CXL share's memory on a host view the emulator laid out, with its kernel answering the memory
blocks' ``state`` writes (docs/emulator.md, "What a host sees"): onlined as movable system RAM of
its CPU-less node (kmem), offlined again before it goes, a refused offline retried and never
taken away online; and on a real kernel the same, where the refusal is the write's EBUSY, or the
EINTR of an offline writer ended after its time."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dra_driver.plugin import hostmemory
from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.hostdev import HostDevice, HostScanner
from dra_driver.plugin.hostmemory import HostMemory, MemoryFailed, MemoryInUse, MemoryRecord, node_list
from fabric_dra_testbed.standin_hosts import EmulatedHosts
from fabric_dra_testbed.standins import make_pool

NODE = "node-a"
GIB = 1 << 30
POOL = make_pool("cxlpool0", 64 * GIB, serial="0xc0ffee000001")


@pytest.fixture
def hosts(tmp_path: Path) -> EmulatedHosts:
    return EmulatedHosts(tmp_path, [NODE])


def region(hosts: EmulatedHosts, share: str, size: int) -> HostDevice:
    hosts.plug(NODE, POOL, target=f"cxlpool0/{share}", size=size)
    found = HostScanner(hosts.sysfs(NODE), real_host=False).find(identity_of(POOL, memory_bytes=size))
    assert found is not None and found.dax is not None
    return found


def states(hosts: EmulatedHosts, blocks: list[int]) -> list[str]:
    memory = hosts.sysfs(NODE) / "devices" / "system" / "memory"
    return [(memory / f"memory{b}" / "state").read_text().strip() for b in blocks]


async def test_kmem_onlines_every_block_movable_and_the_node_gets_memory(hosts: EmulatedHosts) -> None:
    host = region(hosts, "a", 4 * GIB)
    memory = HostMemory(hosts.sysfs(NODE), real_host=False)
    record = await memory.online(host, device="cxlpool0-a")
    assert record.mode is MemoryMode.KMEM and record.dax == host.dax
    assert len(record.blocks) == 4 and states(hosts, record.blocks) == ["online"] * 4
    zones = hosts.sysfs(NODE) / "devices" / "system" / "memory" / f"memory{record.blocks[0]}" / "valid_zones"
    assert zones.read_text().strip() == "Movable"
    nodes = hosts.sysfs(NODE) / "devices" / "system" / "node"
    assert record.node is not None and record.node in node_list((nodes / "has_memory").read_text())
    assert record.node not in node_list((nodes / "has_cpu").read_text())
    assert f"Node {record.node} MemTotal:" in (nodes / f"node{record.node}" / "meminfo").read_text()
    again = await memory.online(host, device="cxlpool0-a")  # a retried prepare
    assert again == record


async def test_offline_takes_every_block_down_before_the_memory_may_go(hosts: EmulatedHosts) -> None:
    host = region(hosts, "a", 2 * GIB)
    memory = HostMemory(hosts.sysfs(NODE), real_host=False)
    record = await memory.online(host, device="cxlpool0-a")
    await memory.offline(record, device="cxlpool0-a", within=10)
    assert states(hosts, record.blocks) == ["offline", "offline"]
    hosts.unplug("cxlpool0/a")
    assert hosts.yanked == []


async def test_pages_in_use_are_retried_until_the_kernel_lets_go(hosts: EmulatedHosts) -> None:
    host = region(hosts, "a", 2 * GIB)
    memory = HostMemory(hosts.sysfs(NODE), real_host=False)
    record = await memory.online(host, device="cxlpool0-a")
    hosts.pages_in_use(NODE, "cxlpool0/a", refusals=2)
    await memory.offline(record, device="cxlpool0-a", within=30)
    assert states(hosts, record.blocks) == ["offline", "offline"]


async def test_pages_that_stay_in_use_are_a_retriable_one_line_and_stay_online(hosts: EmulatedHosts) -> None:
    host = region(hosts, "a", 2 * GIB)
    memory = HostMemory(hosts.sysfs(NODE), real_host=False)
    record = await memory.online(host, device="cxlpool0-a")
    hosts.pages_in_use(NODE, "cxlpool0/a", refusals=1000)
    with pytest.raises(MemoryInUse) as busy:
        await memory.offline(record, device="cxlpool0-a", within=0.5)
    assert busy.value.retriable and busy.value.code == "MemoryInUse"
    message = str(busy.value)
    assert "\n" not in message
    assert message.startswith("the kernel would not offline 2 memory block(s) of cxlpool0-a (memory")
    assert "the memory stays online and attached to this node" in message
    assert states(hosts, record.blocks) == ["online", "online"]


async def test_a_share_smaller_than_a_block_cannot_be_system_ram(hosts: EmulatedHosts) -> None:
    host = region(hosts, "small", 512 << 20)
    with pytest.raises(MemoryFailed) as failed:
        await HostMemory(hosts.sysfs(NODE), real_host=False).online(host, device="cxlpool0-small")
    assert failed.value.permanent
    assert "holds no whole memory block of this node (1073741824 bytes)" in str(failed.value)
    assert "use devdax mode" in str(failed.value)


async def test_devdax_leaves_the_blocks_offline(hosts: EmulatedHosts) -> None:
    host = region(hosts, "a", 2 * GIB)
    memory = HostMemory(hosts.sysfs(NODE), real_host=False)
    record = await memory.devdax(host, device="cxlpool0-a")
    assert record.mode is MemoryMode.DEVDAX and record.dax == host.dax and record.blocks == []
    assert states(hosts, memory.region_blocks(host)) == ["offline", "offline"]


# -- a real kernel: the write itself fails with EBUSY --------------------------------------------


class _RealKernel(HostMemory):
    """A real kernel's answer to a ``state`` write, at once: taken (``state`` and ``online``
    change), or refused with the write's errno while ``busy`` lasts (mm/memory_hotplug.c)."""

    busy = 0

    def _write_state(self, block: int, value: str) -> OSError | None:
        if value == "offline" and self.busy:
            self.busy -= 1
            return OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        base = self.root / "devices" / "system" / "memory" / f"memory{block}"
        state = "offline" if value == "offline" else "online"
        (base / "state").write_text(state + "\n")
        (base / "online").write_text(("0" if state == "offline" else "1") + "\n")
        return None


def real_tree(root: Path) -> HostDevice:
    """A host whose dax0.0 (2 GiB at 4 GiB, node 2) is on device_dax, with kmem loaded."""
    memory = root / "devices" / "system" / "memory"
    memory.mkdir(parents=True)
    (memory / "block_size_bytes").write_text("40000000\n")
    for block in (4, 5):
        (memory / f"memory{block}").mkdir()
        (memory / f"memory{block}" / "state").write_text("offline\n")
        (memory / f"memory{block}" / "online").write_text("0\n")
    nodes = root / "devices" / "system" / "node"
    nodes.mkdir(parents=True)
    (nodes / "has_memory").write_text("0,2\n")
    dax = root / "bus" / "dax" / "devices" / "dax0.0"
    dax.mkdir(parents=True)
    (dax / "target_node").write_text("2\n")
    (dax / "resource").write_text(f"{4 * GIB:#x}\n")
    (dax / "size").write_text(f"{2 * GIB}\n")
    for driver in ("device_dax", "kmem"):
        (root / "bus" / "dax" / "drivers" / driver).mkdir(parents=True)
        for f in ("unbind", "new_id"):
            (root / "bus" / "dax" / "drivers" / driver / f).write_text("")
    os.symlink(root / "bus" / "dax" / "drivers" / "device_dax", dax / "driver")
    return HostDevice(sysfs_path=str(root / "region0"), region="region0", dax="dax0.0")


async def test_a_real_kernel_moves_the_dax_device_to_kmem_and_retries_ebusy(tmp_path: Path) -> None:
    host = real_tree(tmp_path)
    memory = _RealKernel(tmp_path, real_host=True)
    record = await memory.online(host, device="share")
    drivers = tmp_path / "bus" / "dax" / "drivers"
    assert (drivers / "device_dax" / "unbind").read_text() == "dax0.0"
    assert (drivers / "kmem" / "new_id").read_text() == "dax0.0"
    assert record == MemoryRecord(mode=MemoryMode.KMEM, dax="dax0.0", node=2, blocks=[4, 5])
    memory.busy = 3
    await memory.offline(record, device="share", within=30)
    assert memory.busy == 0
    assert (tmp_path / "devices" / "system" / "memory" / "memory4" / "state").read_text() == "offline\n"


async def test_a_real_kernel_that_keeps_refusing_is_memory_in_use(tmp_path: Path) -> None:
    host = real_tree(tmp_path)
    memory = _RealKernel(tmp_path, real_host=True)
    record = await memory.online(host, device="share")
    memory.busy = 10_000
    with pytest.raises(
        MemoryInUse, match=r"would not offline 2 memory block\(s\) of share \(memory5, memory4: "
    ):
        await memory.offline(record, device="share", within=0.3)


def _online_blocks(root: Path) -> MemoryRecord:
    for block in (4, 5):
        base = root / "devices" / "system" / "memory" / f"memory{block}"
        (base / "state").write_text("online\n")
        (base / "online").write_text("1\n")
    return MemoryRecord(mode=MemoryMode.KMEM, blocks=[4, 5])


async def test_a_real_kernel_offline_that_never_returns_is_ended_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux retries an offline whose pages it cannot migrate inside the write, until the writer
    gets a signal (seen on a QEMU guest's kernel: tests/integration/qemu/test_qemu_memory.py).
    Here the writer hangs as that write does: it is killed after ``write_seconds``, the block
    counts as refused, and after ``within`` the memory is in use and stays online."""
    real_tree(tmp_path)
    record = _online_blocks(tmp_path)
    monkeypatch.setattr(hostmemory, "_WRITE_OFFLINE", "import time\ntime.sleep(600)\n")
    memory = HostMemory(tmp_path, real_host=True, write_seconds=0.2)
    with pytest.raises(MemoryInUse, match=r"would not offline 2 memory block\(s\) .*Interrupted system call"):
        await memory.offline(record, device="share", within=0.5)
    assert states_of(tmp_path, [4, 5]) == ["online", "online"]


async def test_a_real_kernel_refusal_comes_back_as_the_writers_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_tree(tmp_path)
    record = _online_blocks(tmp_path)
    monkeypatch.setattr(hostmemory, "_WRITE_OFFLINE", f"import sys\nsys.exit({errno.EBUSY})\n")
    memory = HostMemory(tmp_path, real_host=True)
    with pytest.raises(MemoryInUse, match="Device or resource busy"):
        await memory.offline(record, device="share", within=0.3)


async def test_a_real_kernel_offline_is_written_by_the_child(tmp_path: Path) -> None:
    real_tree(tmp_path)
    record = _online_blocks(tmp_path)
    memory = HostMemory(tmp_path, real_host=True, answer_seconds=0.5)
    # the file takes the write but nothing answers it as a kernel would: the state the child wrote
    # is there, and the answer never comes
    with pytest.raises(MemoryFailed, match="did not go offline"):
        await memory.offline(record, device="share", within=0.3)
    assert states_of(tmp_path, [4, 5])[1] == "offline"


def states_of(root: Path, blocks: list[int]) -> list[str]:
    memory = root / "devices" / "system" / "memory"
    return [(memory / f"memory{b}" / "state").read_text().strip() for b in blocks]
