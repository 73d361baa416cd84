"""The one loop that keeps something in Kubernetes equal to the manager's inventory: a pass on
every trigger, a burst of triggers made one pass, a failed pass tried again after a backoff.

The ResourceSlice publisher (:mod:`.publisher`) and the node labeller (:mod:`.nodelabels`) each run
one, as controller-runtime's workqueue runs a reconciler: level-triggered — a pass compares what is
stored with what is wanted and writes the difference, so it does not matter how many triggers came
or which one — with the newest inventory at the time of the pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from manager_api.feed import InventorySource
from manager_api.models import Inventory
from plumbing.backoff import Backoff

__all__ = ["Reconciler"]


class Reconciler:
    """Runs ``reconcile(inventory)`` after each :meth:`trigger`.

    An exception of the ``retried`` kinds is handed to ``on_failure(err, retry_in)`` (to log it,
    and to note what the next pass must do first) and the pass runs again ``retry_in`` seconds
    later, each such delay longer than the last until a pass succeeds; anything else ends the loop.
    """

    def __init__(
        self,
        reconcile: Callable[[Inventory], Awaitable[object]],
        *,
        retried: tuple[type[Exception], ...],
        on_failure: Callable[[Exception, float], None],
        debounce: float,
        backoff: Backoff,
    ) -> None:
        self._reconcile = reconcile
        self._retried = retried
        self._on_failure = on_failure
        self._debounce = debounce
        self._backoff = backoff
        self._trigger = asyncio.Event()

    def trigger(self) -> None:
        self._trigger.set()

    async def follow(self, feed: InventorySource) -> None:
        """Trigger a pass on every new inventory version."""
        version: int | None = None
        while True:
            inventory = await feed.wait_newer(version)
            version = inventory.version
            self.trigger()

    async def run(self, feed: InventorySource) -> None:
        """Pass after pass, until cancelled."""
        while True:
            await self._trigger.wait()
            self._trigger.clear()
            await asyncio.sleep(self._debounce)  # let a burst of triggers become one pass
            self._trigger.clear()
            inventory = feed.latest
            if inventory is None:
                continue
            try:
                await self._reconcile(inventory)
            except self._retried as err:
                delay = self._backoff.next()
                self._on_failure(err, delay)
                await asyncio.sleep(delay)
                self._trigger.set()
            else:
                self._backoff.reset()
