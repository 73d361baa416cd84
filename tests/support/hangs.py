"""A test about to hit its timeout says what its event loop is waiting on.

pytest-timeout prints every thread's stack when a test runs out of time; for a test on asyncio
that is the event loop idle in ``select``, which says nothing of the await that never ended. A
timer a little before the timeout writes each task of every running event loop, with its stack, to
the test's captured stderr (shown with the failure)."""

from __future__ import annotations

import asyncio
import gc
import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

__all__ = ["tasks_written_before_timeout"]

#: seconds before the test's timeout that the tasks are written
EARLY = 20.0


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except (ValueError, TypeError):
        return 0.0


def _write_tasks(nodeid: str) -> None:
    out = io.StringIO()
    out.write(f"\n--- {nodeid}: the tasks of each running event loop, {EARLY:.0f} s before the timeout\n")
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]
    for loop in loops:
        for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
            out.write(f"* task {task.get_name()}\n")
            for frame in _awaiting(task.get_coro()):
                code = frame.f_code
                out.write(f"    {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
    sys.stderr.write(out.getvalue())
    sys.stderr.flush()


def _awaiting(coro: object) -> Iterator[FrameType]:
    """The frames of a coroutine and of what it awaits, down to the innermost."""
    for _ in range(64):
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "ag_frame", None)
            or getattr(coro, "gi_frame", None)
        )
        if frame is not None:
            yield frame
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "ag_await", None)
            or getattr(coro, "gi_yieldfrom", None)
        )
        if coro is None:
            return


@contextmanager
def tasks_written_before_timeout(item: pytest.Item) -> Iterator[None]:
    """Around a test's call: the tasks are written if it still runs ``EARLY`` s before its timeout."""
    timeout = _timeout_of(item)
    timer = None
    if timeout > 2 * EARLY:
        timer = threading.Timer(timeout - EARLY, _write_tasks, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
