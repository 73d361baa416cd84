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
"""

from __future__ import annotations

from collections import deque

__all__ = ["ChangeHistory"]


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
        self._entries: deque[tuple[int, frozenset[str]]] = deque()
        self._names = 0

    def record(self, version: int, names: frozenset[str]) -> None:
        """Version ``version`` (greater than any recorded) changed the devices ``names``."""
        self._entries.append((version, names))
        self._names += len(names)
        self.current = version
        while self._entries and (len(self._entries) > self.max_versions or self._names > self._max_devices):
            dropped, gone = self._entries.popleft()
            self._names -= len(gone)
            self.oldest = dropped

    def since(self, epoch: int, version: int) -> set[str] | None:
        """The names changed after ``version`` of ``epoch``; None when this history cannot say
        (another epoch, a version older than it holds, or one it never reached)."""
        if epoch != self.epoch or not self.oldest <= version <= self.current:
            return None
        names: set[str] = set()
        for recorded, changed in reversed(self._entries):
            if recorded <= version:
                break
            names |= changed
        return names

    def __len__(self) -> int:
        return len(self._entries)
