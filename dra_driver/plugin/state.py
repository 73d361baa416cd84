"""What is being prepared right now: per-claim locks and fabric work that outlives a kubelet call.

Each claim is worked on under its own lock, so claims of one call, and concurrent calls, proceed
in parallel while two calls for the *same* claim never interleave. The lock is two-level: an
:class:`asyncio.Lock` inside this process, and a POSIX record lock on one byte of a shared lock
file across processes — two plugin pods overlap during a rolling update (``POD_UID``), and the
kubelet may send a claim's unprepare to the other one (the kubeletplugin helper serialises with a
file lock for the same reason; here it is per claim, not global).

An attach the fabric has not finished before the kubelet's deadline keeps running as a
:class:`asyncio.Task` in :class:`InflightWork`; the kubelet's next call for the claim awaits the
same task instead of starting over.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from plumbing.backoff import Backoff

__all__ = ["ClaimLocks", "InflightWork"]

_SLOTS = 1 << 20


class ClaimLocks:
    def __init__(self, lock_file: Path) -> None:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}
        # POSIX record locks belong to the process: two claims hashing to the same byte share it.
        self._slot_holders: dict[int, int] = {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    @staticmethod
    def _slot(uid: str) -> int:
        return zlib.crc32(uid.encode()) % _SLOTS

    def _try_lock_slot(self, slot: int) -> bool:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot, os.SEEK_SET)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    async def _acquire_slot(self, slot: int) -> None:
        if self._slot_holders.get(slot, 0) == 0:
            # A local poll of a file lock: no jitter, nobody else to desynchronise from.
            backoff = Backoff(initial=0.002, maximum=0.1, jitter=0)
            while not self._try_lock_slot(slot):
                await backoff.sleep()
        self._slot_holders[slot] = self._slot_holders.get(slot, 0) + 1

    def _release_slot(self, slot: int) -> None:
        left = self._slot_holders[slot] - 1
        if left:
            self._slot_holders[slot] = left
            return
        del self._slot_holders[slot]
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot, os.SEEK_SET)

    @contextlib.asynccontextmanager
    async def hold(self, uid: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(uid, asyncio.Lock())
        self._users[uid] = self._users.get(uid, 0) + 1
        try:
            async with lock:
                slot = self._slot(uid)
                await self._acquire_slot(slot)
                try:
                    yield
                finally:
                    self._release_slot(slot)
        finally:
            self._users[uid] -= 1
            if self._users[uid] == 0:
                del self._users[uid]
                del self._locks[uid]


def _consume_result(task: asyncio.Task[Any]) -> None:
    """A background attach may end after the kubelet stopped asking; its outcome is picked up by the
    next call or dropped with the claim, never reported as an unretrieved task exception."""
    if not task.cancelled():
        task.exception()


class InflightWork:
    """Background tasks keyed by (claim UID, device): started once, awaited by any later call."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, str], asyncio.Task[Any]] = {}

    def get_or_start(self, key: tuple[str, str], start: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.ensure_future(start())
            task.add_done_callback(_consume_result)
            self._tasks[key] = task
        return task

    def finished(self, key: tuple[str, str]) -> None:
        """Forget a task whose result was consumed (or failed: the next call starts afresh)."""
        task = self._tasks.pop(key, None)
        if task is not None and not task.done():
            task.cancel()

    def keys_of_claim(self, uid: str) -> list[tuple[str, str]]:
        return [k for k in self._tasks if k[0] == uid]

    async def cancel_claim(self, uid: str) -> None:
        tasks = [self._tasks.pop(k) for k in self.keys_of_claim(uid)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def cancel_all(self) -> None:
        for uid in {k[0] for k in self._tasks}:
            await self.cancel_claim(uid)

    def __len__(self) -> int:
        return len(self._tasks)
