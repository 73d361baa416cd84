"""A bounded history of which devices each inventory version changed, for the change feed
(``GET /api/v1/inventory/changes?since=V``).

Each version that moved records the names of the devices it changed, added or removed. The history
keeps at most ``max_versions`` versions and ``max_devices`` names in all, dropping the oldest
first; what it no longer holds it cannot answer, and :meth:`ChangeHistory.since` says so (None) —
the consumer reads the whole inventory again, as an informer lists again on a watch's 410 Gone. So
memory stays bounded whatever a consumer does: one that falls behind costs a full read, never a
growing backlog.

The versions count in an ``epoch``, the incarnation of the history (the version it started at, a
wall-clock millisecond): a cursor of another incarnation — a restarted manager, another replica —
never matches, even where its number happens to lie in this one's range.

Each changed name also records the nodes its device concerned, before the change and after it
(bound or attached to the node, a partition held there, a share connected there): a node's plugin
asks for its own node's changes only (:meth:`ChangeHistory.since` with ``node``), so an attach on
one node wakes that node's feed, not every node's. A device leaving a node concerns it (it was
there before), so does one arriving; a device moved from A to B concerns both. A version that
changed no device (the pools, nodes or notices did) concerns every node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable, Mapping

__all__ = ["ChangeHistory", "NodeWaits"]


class ChangeHistory:
    """Which device names each version changed, from ``start`` on, within bounds."""

    def __init__(
        self, start: int, *, epoch: int | None = None, max_versions: int = 1024, max_devices: int = 65536
    ) -> None:
        self.epoch = start if epoch is None else epoch
        #: the oldest version a cursor may name: the changes of every later version are held
        self.oldest = start
        self.current = start
        self.max_versions = max(1, max_versions)
        self._max_devices = max(1, max_devices)
        #: per version: each changed name with the nodes its device concerned before and after
        self._entries: deque[tuple[int, Mapping[str, frozenset[str]]]] = deque()
        self._names = 0

    def record(self, version: int, changed: Mapping[str, frozenset[str]] | frozenset[str]) -> None:
        """Version ``version`` (greater than any recorded) changed the devices named in
        ``changed``, each concerning the nodes it maps to (names alone, or an empty set: no node's
        in particular)."""
        if not isinstance(changed, Mapping):
            changed = dict.fromkeys(changed, frozenset[str]())
        self._entries.append((version, changed))
        self._names += len(changed)
        self.current = version
        while self._entries and (len(self._entries) > self.max_versions or self._names > self._max_devices):
            dropped, gone = self._entries.popleft()
            self._names -= len(gone)
            self.oldest = dropped

    def holds(self, epoch: int, version: int) -> bool:
        """Whether :meth:`since` can answer for ``version`` of ``epoch``, without building the
        answer (a long poll asks before it waits)."""
        return epoch == self.epoch and self.oldest <= version <= self.current

    def since(self, epoch: int, version: int, node: str | None = None) -> set[str] | None:
        """The names changed after ``version`` of ``epoch`` (with ``node``: those concerning it);
        None when this history cannot say (another epoch, a version older than it holds, or one it
        never reached)."""
        if not self.holds(epoch, version):
            return None
        names: set[str] = set()
        for recorded, changed in reversed(self._entries):
            if recorded <= version:
                break
            if node is None:
                names |= changed.keys()
            else:
                names.update(name for name, nodes in changed.items() if node in nodes)
        return names

    def concerns(self, version: int, node: str) -> bool:
        """Whether a version after ``version`` concerns ``node``: changed a device of it, or no
        device at all (the pools, nodes or notices, which every reader keeps)."""
        for recorded, changed in reversed(self._entries):
            if recorded <= version:
                return False
            if not changed or any(node in nodes for nodes in changed.values()):
                return True
        return False

    def __len__(self) -> int:
        return len(self._entries)


class NodeWaits:
    """The per-node change feed's long polls waiting, by node. A version wakes the polls of the
    nodes it concerns only, as :meth:`ChangeHistory.concerns` reads it (the nodes of the devices it
    changed; every node when it changed no device), so with a hundred nodes' plugins polling an
    attach wakes the one poll it concerns, not a hundred."""

    def __init__(self) -> None:
        self._waits: dict[str, set[asyncio.Future[None]]] = {}
        #: shutting down (:meth:`wake_all`): no poll waits any more
        self.closed = False

    async def wait(self, node: str, wait_seconds: float) -> None:
        """Return once a version concerning ``node`` is recorded (:meth:`wake`), at shutdown
        (:meth:`wake_all`), or when ``wait_seconds`` pass."""
        if self.closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waits.setdefault(node, set())
        waiting.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, wait_seconds)
        finally:
            waiting.discard(waiter)
            if not waiting and self._waits.get(node) is waiting:
                del self._waits[node]

    def wake(self, changed: Mapping[str, frozenset[str]]) -> None:
        """A version recorded ``changed`` (each changed device with the nodes it concerned)."""
        if not self._waits:
            return
        nodes = set().union(*changed.values()) if changed else set(self._waits)
        for node in nodes:
            _resolve(self._waits.pop(node, ()))

    def wake_all(self) -> None:
        """Answer every poll now and any that comes later at once: the service is shutting down."""
        self.closed = True
        for waiting in self._waits.values():
            _resolve(waiting)
        self._waits.clear()


def _resolve(waiting: Iterable[asyncio.Future[None]]) -> None:
    for waiter in waiting:
        if not waiter.done():
            waiter.set_result(None)
