"""Binding conditions written into a ResourceClaim's ``status.devices``: only this driver's entry
of one device, as metav1 conditions, with a compare-and-swap PUT on ``/status``.

The claim binder (:mod:`.binding_conditions`) decides *what* a device's conditions say; this module
is how they get there, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plumbing.kube import Conflict, KubeClient, NotFound
from plumbing.kube.dra import ConditionChanges as Changes
from plumbing.kube.dra import merge_conditions
from plumbing.kube.informer import object_uid
from plumbing.kube.resources import RESOURCE_CLAIMS

__all__ = ["ConditionWriter", "Target", "merge_conditions"]

_STATUS_RETRIES = 8


@dataclass(frozen=True, slots=True)
class Target:
    """One allocated device that waits for its binding condition; a share of a device allocated many
    times (``allowMultipleAllocations``) is told apart by its ``share_id``."""

    pool: str
    device: str
    node: str | None
    share_id: str | None = None
    #: the share's ``consumedCapacity`` of memory, in bytes (None: not a share, or none given)
    memory_bytes: int | None = None

    @property
    def label(self) -> str:
        """The device, and the share where there is one: ``cxlpool0/<share id>``."""
        return f"{self.device}/{self.share_id}" if self.share_id else self.device


class ConditionWriter:
    """Writes conditions into claims, reading and updating ``claims`` (UID → the latest object
    seen: the binder's informer cache, so a claim just written is not written again from stale)."""

    def __init__(
        self,
        kube: KubeClient,
        driver: str,
        claims: dict[str, dict[str, Any]],
        allocates: Callable[[dict[str, Any], Target], bool],
    ) -> None:
        self._kube = kube
        self._driver = driver
        self._claims = claims
        self._allocates = allocates

    async def set(self, uid: str, target: Target, changes: Changes) -> bool:
        """Merge conditions into the claim's ``status.devices`` entry of ``target``.

        A compare-and-swap PUT on ``/status``, retried on conflict; only this driver's entry is
        touched. False when the claim no longer allocates the device (nothing to report then).
        """
        obj = self._claims.get(uid)
        for _ in range(_STATUS_RETRIES):
            if obj is None or not self._allocates(obj, target):
                return False
            status, entry = self._entry(obj, target)
            merged = merge_conditions(
                entry.get("conditions") or [], changes, (obj.get("metadata") or {}).get("generation")
            )
            if merged == (entry.get("conditions") or []):
                return True
            entry["conditions"] = merged
            try:
                stored = await self._kube.replace(
                    RESOURCE_CLAIMS, {**obj, "status": status}, subresource="status"
                )
            except Conflict:
                obj = await self._get(obj)
                continue
            except NotFound:
                return False
            if object_uid(stored) == uid:
                self._claims[uid] = stored
            return True
        raise Conflict(409, "Conflict", f"claim {uid}: status kept changing under {_STATUS_RETRIES} updates")

    def _entry(self, obj: dict[str, Any], target: Target) -> tuple[dict[str, Any], dict[str, Any]]:
        """A copy of the claim's status, and in it this driver's entry of ``target`` (added if missing)."""
        status = dict(obj.get("status") or {})
        devices = [dict(d) for d in status.get("devices") or []]
        entry = next(
            (
                d
                for d in devices
                if d.get("driver") == self._driver
                and d.get("pool") == target.pool
                and d.get("device") == target.device
                and (d.get("shareID") or None) == target.share_id
            ),
            None,
        )
        if entry is None:
            entry = {"driver": self._driver, "pool": target.pool, "device": target.device}
            if target.share_id:
                entry["shareID"] = target.share_id
            devices.append(entry)
        status["devices"] = devices
        return status, entry

    async def _get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        meta = obj.get("metadata") or {}
        try:
            fresh = await self._kube.get(RESOURCE_CLAIMS, str(meta.get("name")), str(meta.get("namespace")))
        except NotFound:
            return None
        return fresh if object_uid(fresh) == object_uid(obj) else None
