"""Polling for a condition in tests: one loop, one failure message naming what was awaited."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import httpx

__all__ = ["eventually", "wait_until"]

T = TypeVar("T")

# What a poll may hit while the thing it waits for is still starting or changing.
TRANSIENT: tuple[type[BaseException], ...] = (AssertionError, httpx.HTTPError, OSError)


def wait_until(
    check: Callable[[], T | Literal[False] | None],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.03,
) -> T:
    """Poll ``check`` until it returns something truthy and return that; a transient error counts
    as "not yet". Fail after ``timeout`` seconds naming ``what`` and the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            answer = check()
        except TRANSIENT as err:
            last = err
        else:
            if answer:
                return answer
            last = answer
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


async def eventually(
    check: Callable[[], Any],
    *,
    within: float = 15.0,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """From a running event loop, poll ``check`` (plain or async) until it answers something
    truthy and return that. Fail after ``within`` seconds naming ``what`` and the last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while loop.time() < deadline:
        last = check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {within:.0f}s waiting for {what}; last: {last!r}")
