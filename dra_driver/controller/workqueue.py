"""One worker per key, as client-go's workqueue keeps one: a key changed while its worker runs is
worked again when that pass ends, never by two workers at once; a failed pass is retried after a
backoff of its own key; a pass can ask for a later one (a grace period that ends).

The claim binder (:mod:`.binding_conditions`) runs its passes over claims on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from manager_api.errors import FabricError
from plumbing.backoff import Backoff
from plumbing.kube import ApiError
from plumbing.logs import get_logger

__all__ = ["KeyedWork"]

log = get_logger(__name__)


class KeyedWork:
    """Runs ``work(key)`` for each scheduled key, one worker per key."""

    def __init__(self, work: Callable[[str], Awaitable[None]], *, what: str) -> None:
        self._work_on = work
        self._what = what
        self._dirty: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._retry: dict[str, asyncio.TimerHandle] = {}
        self._backoff: dict[str, Backoff] = {}

    def cancel(self, key: str) -> None:
        """Stop the pass running for ``key`` (what it was doing no longer holds)."""
        task = self._workers.pop(key, None)
        if task is not None and not task.done():
            task.cancel()

    def schedule(self, key: str) -> None:
        """Work on ``key`` now, or again once its running pass ends."""
        self._dirty.add(key)
        handle = self._retry.pop(key, None)
        if handle is not None:
            handle.cancel()
        task = self._workers.get(key)
        if task is None or task.done():
            self._workers[key] = asyncio.get_running_loop().create_task(self._run(key))

    def schedule_later(self, key: str, delay: float) -> None:
        """Work on ``key`` in ``delay`` seconds, unless a pass is due sooner."""
        loop = asyncio.get_running_loop()
        pending = self._retry.get(key)
        if pending is not None:
            if pending.when() <= loop.time() + delay:
                return  # an earlier pass is already due
            pending.cancel()

        def fire() -> None:
            self._retry.pop(key, None)
            self.schedule(key)

        self._retry[key] = loop.call_later(delay, fire)

    async def _run(self, key: str) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                try:
                    await self._work_on(key)
                except Exception as err:
                    delay = self._backoff.setdefault(key, Backoff(initial=0.5, maximum=30.0)).next()
                    if isinstance(err, ApiError | FabricError):
                        log.warning(
                            f"{self._what} failed; retrying",
                            claim=key,
                            error=str(err).splitlines()[0],
                            retry_in=round(delay, 2),
                        )
                    else:  # a bug or an answer nobody expected: keep the key in work, loudly
                        log.exception(f"{self._what} failed unexpectedly; retrying", claim=key)
                    self.schedule_later(key, delay)
                    return
                self._backoff.pop(key, None)
        finally:
            if self._workers.get(key) is asyncio.current_task():
                del self._workers[key]

    def stop(self) -> None:
        """Cancel every pass, running or due."""
        for task in self._workers.values():
            task.cancel()
        for handle in self._retry.values():
            handle.cancel()

    async def drain(self) -> None:
        """Wait until no pass is queued or running (for tests and shutdown)."""
        while self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*list(self._workers.values()), return_exceptions=True)
