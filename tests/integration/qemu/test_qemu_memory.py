"""Memory hot-add on a real kernel: a ``pc-dimm`` on a QEMU guest's memory-only NUMA node, the
closest this machine comes to a CXL share's region on a CPU-less node (docs/emulator.md, "QEMU
hosts: memory hot-add"; docs/plugin.md, "CXL memory shares").

The guest boots with node 0 (its CPU and boot memory) and node 1 (no CPU, no memory:
:meth:`GuestConfig.memory_args`). The test hot-adds a DIMM on node 1 over QMP, sees its blocks
appear offline, onlines them movable with the plugin's own code (:class:`HostMemory`, run in the
guest by guest_memory.py, forked from the agent's fork server), runs a process in a cgroup v2
whose ``cpuset.mems`` is node 1 and reads from ``numa_maps`` and node 1's ``meminfo`` that its
memory is node 1's. Then the release: with pages of that process pinned the kernel cannot offline
their block, the plugin's code reports the memory in use and it stays online and plugged;
once the process is gone the same offline succeeds and the DIMM is removed (``device_del``,
``DEVICE_DELETED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulator.qemu.guest import MEMORY_NODE, GuestConfig, QemuGuest, temporary_run_dir
from emulator.qemu.memory import Dimm, plug_dimm, unplug_dimm
from emulator.qemu.qmp import QmpClient
from tests.support.waiting import wait_until

from .guests import GUEST_ENV, compile_for_guest, skip_without_tools, tail

pytestmark = [pytest.mark.qemu, pytest.mark.slow(seconds=60), pytest.mark.timeout(900)]

skip_without_tools()

NODE = "node-m"
DIMM_MIB = 256
#: what the container process writes, well within the DIMM (the kernel keeps some for itself)
USER_MIB = 64
#: pages the process pins while the first release is tried
PINNED_PAGES = 8
#: how long the plugin's offline retries a refusal before it answers "in use"
OFFLINE_WITHIN = 6.0
#: how long the release after that may take (a writer of an offline starts an interpreter, slow
#: under TCG)
RELEASE_WITHIN = 60.0
#: the cgroup of the "container"
CGROUP = "/sys/fs/cgroup/fdq-share"
#: what guest_memory.py imports, once per boot
PRELOAD = ["dra_driver.plugin.hostmemory", "dra_driver.plugin.hostview", "dra_driver.plugin.config"]
PAGE_KIB = 4


@dataclass
class Guest:
    guest: QemuGuest

    def sh(self, script: str, *, timeout: float = 60.0) -> str:
        return self.guest.agent.sh(script, timeout=timeout)

    def qmp(self, action: Any) -> Any:
        async def run() -> Any:
            client = QmpClient(self.guest.qmp_owner)
            await client.connect()
            try:
                return await action(client)
            finally:
                await client.close()

        return asyncio.run(run())

    def memory(self, *args: str) -> dict[str, Any]:
        """guest_memory.py with ``args``, forked from the fork server; its JSON answer."""
        out = self.guest.share / "memory.out"
        out.unlink(missing_ok=True)
        log = self.guest.share / "memory.log"
        script = str(Path(__file__).with_name("guest_memory.py"))
        pid = self.guest.agent.spawn([sys.executable, script, str(out), *args], log=str(log), env=GUEST_ENV)
        assert self.guest.agent.wait(pid, 180) == 0, tail(log)
        answer: dict[str, Any] = json.loads(out.read_text())
        return answer

    def block_state(self, block: int) -> str:
        return self.sh(f"cat /sys/devices/system/memory/memory{block}/state 2>/dev/null || echo gone").strip()

    def node_kib(self, node: int, field: str) -> int:
        text = self.sh(f"cat /sys/devices/system/node/node{node}/meminfo")
        match = re.search(rf"Node {node} {field}:\s+(\d+) kB", text)
        assert match, text
        return int(match.group(1))


@pytest.fixture(scope="module")
def guest() -> Iterator[Guest]:
    compile_for_guest()
    run_dir = temporary_run_dir(NODE)
    config = GuestConfig(NODE, [], run_dir, cpus=1, dimm_slots=2, hotplug_mib=2 * DIMM_MIB)
    qemu = QemuGuest(config)
    try:
        qemu.start(timeout=300)
        qemu.agent.preload(sys.executable, PRELOAD, env=GUEST_ENV)
        preload_seconds = qemu.agent.preloaded()
        print(f"\nmemory guest ({qemu.accel}): boot {qemu.boot_seconds:.1f}s, preload {preload_seconds:.1f}s")
        yield Guest(qemu)
    finally:
        qemu.stop()
        if not (run_dir / "keep").exists():
            shutil.rmtree(run_dir, ignore_errors=True)


def _user(guest: Guest, name: str, pin_pages: int = 0) -> int:
    """A process in the share's cgroup writing USER_MIB MiB (guest_memory_user.py); its pid once
    its memory is written."""
    ready = guest.guest.share / f"{name}.ready"
    ready.unlink(missing_ok=True)
    script = Path(__file__).with_name("guest_memory_user.py")
    # it joins the cgroup before the interpreter starts, so every page it touches is placed there
    pid = guest.guest.agent.spawn(
        ["/bin/sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$0" -S "$@"',
         sys.executable, str(script), str(ready), str(USER_MIB), str(pin_pages)],
        log=str(guest.guest.share / f"{name}.log"),
    )  # fmt: skip
    wait_until(ready.exists, timeout=120, interval=0.1, what=f"{name} wrote its memory")
    return pid


def _pages_on(guest: Guest, pid: int) -> dict[int, int]:
    """Pages of the process on each node, from ``/proc/PID/numa_maps`` (``N<node>=<pages>``)."""
    pages: dict[int, int] = {}
    for node, count in re.findall(r"\bN(\d+)=(\d+)", guest.sh(f"cat /proc/{pid}/numa_maps")):
        pages[int(node)] = pages.get(int(node), 0) + int(count)
    return pages


def _stop(guest: Guest, pid: int) -> None:
    guest.guest.agent.signal(pid, 9)
    guest.guest.agent.wait(pid, 60)


def test_hot_added_memory_serves_a_bound_process_and_leaves_only_when_offline(guest: Guest) -> None:
    block_size = int(guest.sh("cat /sys/devices/system/memory/block_size_bytes"), 16)
    # node 1 is there for hot-add, with nothing on it yet
    assert str(MEMORY_NODE) not in guest.sh("cat /sys/devices/system/node/has_memory").strip().split(",")

    started = time.monotonic()
    dimm: Dimm = guest.qmp(lambda q: plug_dimm(q, "dimm1", DIMM_MIB << 20))
    blocks = dimm.blocks(block_size)
    assert dimm.node == MEMORY_NODE and len(blocks) == (DIMM_MIB << 20) // block_size
    wait_until(
        lambda: all(guest.block_state(b) != "gone" for b in blocks), timeout=60, interval=0.1,
        what="the DIMM's memory blocks in the guest",
    )  # fmt: skip
    appeared = time.monotonic() - started
    # the kernel leaves hot-added blocks offline (memhp_default_state): the plugin picks the zone
    assert {guest.block_state(b) for b in blocks} == {"offline"}

    onlined = guest.memory("online", dimm.id, str(dimm.addr), str(dimm.size), str(dimm.node))
    assert "error" not in onlined, onlined
    assert onlined["record"] == {"mode": "kmem", "dax": "dax0.0", "node": MEMORY_NODE, "blocks": blocks}
    assert onlined["kmem_new_id"] == "dax0.0"  # the plugin moved the (described) dax device to kmem
    assert {guest.block_state(b) for b in blocks} == {"online"}
    # movable: the kernel puts nothing there it could not migrate, so the DIMM can leave again
    zones = {guest.sh(f"cat /sys/devices/system/memory/memory{b}/valid_zones").strip() for b in blocks}
    assert zones == {"Movable"}, zones
    assert guest.node_kib(MEMORY_NODE, "MemTotal") == DIMM_MIB << 10

    guest.sh(
        "grep -q cgroup2 /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup;"
        " echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control;"
        f" mkdir -p {CGROUP} && echo 0 > {CGROUP}/cpuset.cpus && echo {MEMORY_NODE} > {CGROUP}/cpuset.mems"
    )
    assert guest.sh(f"cat {CGROUP}/cpuset.mems.effective").strip() == str(MEMORY_NODE)
    free_before = guest.node_kib(MEMORY_NODE, "MemFree")
    pid = _user(guest, "user-pinning", pin_pages=PINNED_PAGES)
    try:
        pages = _pages_on(guest, pid)
        used = free_before - guest.node_kib(MEMORY_NODE, "MemFree")
        print(f"\nthe bound process: pages by node {pages}, node {MEMORY_NODE} MemFree down {used} KiB")
        # everything it wrote is node 1's: the cgroup's cpuset.mems placed it
        assert pages.get(MEMORY_NODE, 0) * PAGE_KIB >= USER_MIB << 10, pages
        assert used >= USER_MIB << 10, used

        # release while its pages are pinned: refused, retried, reported in use; never forced
        refused = guest.memory("offline", dimm.id, ",".join(map(str, blocks)), str(OFFLINE_WITHIN))
        assert refused.get("class") == "MemoryInUse", refused
        assert "pages in use" in refused["error"] and "stays online" in refused["error"], refused
        assert "online" in {guest.block_state(b) for b in blocks}
        # The refusal is the kernel's: it kept retrying the pinned pages' migration until the
        # writer's signal (its "migration failure" warning is rate-limited and may not come within
        # the 2 s the write is given on a slow TCG guest, so it is shown, not required).
        print("kernel:", "migration failure" in guest.sh("dmesg"))
        assert any(d["data"]["id"] == dimm.id for d in guest.qmp(lambda q: q.execute("query-memory-devices")))
    finally:
        _stop(guest, pid)

    # the process is gone: the same release now goes through, then the DIMM leaves
    answer = guest.memory("offline", dimm.id, ",".join(map(str, blocks)), str(RELEASE_WITHIN))
    assert "error" not in answer, answer
    assert {guest.block_state(b) for b in blocks} == {"offline"}
    released = guest.qmp(lambda q: unplug_dimm(q, dimm, within=60))
    wait_until(
        lambda: {guest.block_state(b) for b in blocks} == {"gone"}, timeout=60, interval=0.1,
        what="the DIMM's memory blocks gone from the guest",
    )  # fmt: skip
    assert guest.qmp(lambda q: q.execute("query-memory-devices")) == []
    with contextlib.suppress(Exception):
        guest.sh(f"rmdir {CGROUP}")
    print(
        f"memory hot-add: blocks in the guest {appeared:.2f}s after device_add, online "
        f"{onlined['seconds']:.2f}s, offline {answer['seconds']:.2f}s; in-use offline answered after "
        f"{refused['seconds']:.1f}s; DEVICE_DELETED {released:.3f}s after device_del"
    )
