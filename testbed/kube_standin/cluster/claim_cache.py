"""The stand-in scheduler's view of ResourceClaims: the informer's copies, with the scheduler's own
writes kept until the informer has them, and what the claims hold.

kube-scheduler keeps its own writes in an assume cache until the informer has a version at least
as new (``assumecache.AssumeCache``, and ``inFlightAllocations`` in ``dynamicresources.go``), and
builds the allocator's ``AllocatedState`` from every allocated claim (``foreachAllocatedDevice``):
exclusive devices, shares of ``allowMultipleAllocations`` devices with their consumed capacity —
which is also what the pools' shared counters are counted against.
"""

from __future__ import annotations

from typing import Any

from dra_driver.selection import AllocatedState
from plumbing.kube.informer import Informer

__all__ = ["ClaimCache", "claim_key"]


def claim_key(claim: dict[str, Any]) -> str:
    """``namespace/name``, as :class:`AllocatedState` names the claim holding a device."""
    return f"{claim['metadata'].get('namespace') or ''}/{claim['metadata']['name']}"


class ClaimCache:
    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        #: claims as the scheduler last wrote them, by ``namespace/name``, until the informer has them
        self._assumed: dict[str, dict[str, Any]] = {}
        #: what each claim holds, by ``namespace/name``, with the (uid, resourceVersion) it was read
        #: from: :meth:`held` reads each version of a claim once
        self._held_by_claim: dict[str, tuple[tuple[str, str], AllocatedState]] = {}

    def current(self) -> list[dict[str, Any]]:
        """The cached claims, each as this scheduler last wrote it while the informer trails.

        A pod allocated earlier in this pass must count for the next: the informer takes our
        writes (:meth:`Informer.apply`), but a watch event of an older version may still overwrite
        them, and a claim would look free while it holds a device."""
        claims = {claim_key(c): c for c in self.informer.values()}
        for key, mine in list(self._assumed.items()):
            if _own_write_wins(claims.get(key), mine):
                claims[key] = mine
            else:
                del self._assumed[key]  # deleted since (nothing of it is held), or caught up
        return list(claims.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One claim as :meth:`current` sees it: our own write while the informer trails (a stale
        watch event must not make a claim we allocated look unallocated, or un-reserve it with an
        old resourceVersion)."""
        cached = self.informer.get(namespace, name)
        mine = self._assumed.get(f"{namespace}/{name}")
        return mine if mine is not None and _own_write_wins(cached, mine) else cached

    def assume(self, claim: dict[str, Any]) -> None:
        """Take our own write of a claim into the cache and keep it until the informer has it."""
        self.informer.apply(claim)
        self._assumed[claim_key(claim)] = claim

    def held(self, exclude: set[str]) -> AllocatedState:
        """What the current claims hold, but those in ``exclude`` (``namespace/name``)."""
        held = AllocatedState()
        seen: set[str] = set()
        for claim in self.current():
            key = claim_key(claim)
            seen.add(key)
            if key in exclude:
                continue
            meta = claim["metadata"]
            version = (str(meta.get("uid")), str(meta.get("resourceVersion")))
            known = self._held_by_claim.get(key)
            if known is None or known[0] != version or not meta.get("resourceVersion"):
                known = self._held_by_claim[key] = (version, AllocatedState.from_claims([claim]))
            held.merge(known[1])
        for key in self._held_by_claim.keys() - seen:
            del self._held_by_claim[key]
        return held


def _own_write_wins(cached: dict[str, Any] | None, mine: dict[str, Any]) -> bool:
    """Whether the scheduler's own write of a claim is newer than the informer's copy (the same
    object, an older resourceVersion there); otherwise the copy is the truth."""
    return (
        cached is not None
        and cached["metadata"].get("uid") == mine["metadata"].get("uid")
        and _version(cached) < _version(mine)
    )


def _version(obj: dict[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
