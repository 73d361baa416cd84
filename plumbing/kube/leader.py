"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

A candidate takes the Lease when it is free or its holder has not renewed it for
``lease_duration`` (measured on *this* process's clock from when the record last changed,
as client-go does, so clock skew between nodes does not matter). The leader renews every
``retry_period``; if it cannot renew within ``renew_deadline`` it steps down *before* the
Lease could expire for others (``renew_deadline < lease_duration``), so two leaders never act
at once. On a clean shutdown the Lease is released so a follower takes over at once.

``on_change`` runs beside the renewals, not in their loop: what a new leader does first (load its
ledger, say) may take longer than ``renew_deadline``, and a loop waiting for it renewed nothing —
the replica stepped down seconds after it became leader. Callbacks run in order; one for becoming
leader that is still running when leadership is lost is cancelled, as its work is moot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from plumbing.kube.client import ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.resources import LEASES
from plumbing.logs import get_logger

__all__ = ["LeaderElector", "micro_time"]

log = get_logger(__name__)


def micro_time(now: datetime | None = None) -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds, in UTC."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], Awaitable[None] | None] | None = None,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self._client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_change = on_change
        self._is_leader = False
        self._last_renew = 0.0
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        #: the last ``on_change`` call, running beside the renewals
        self._callback: asyncio.Task[None] | None = None
        self.leader_event = asyncio.Event()
        self.current_holder: str | None = None

    @property
    def is_leader(self) -> bool:
        """True only while the last successful renewal is younger than ``renew_deadline``."""
        return self._is_leader and time.monotonic() - self._last_renew < self.renew_deadline

    async def run(self) -> None:
        """Campaign and renew until cancelled; releases the Lease on the way out."""
        try:
            while True:
                try:
                    acquired = await self._try_acquire_or_renew()
                except ApiError as err:
                    log.warning("leader election: lease update failed", lease=self.name, error=str(err))
                    acquired = False
                if acquired:
                    self._last_renew = time.monotonic()
                    await self._set_leader(True)
                elif self._is_leader and time.monotonic() - self._last_renew >= self.renew_deadline:
                    log.error("leader election: could not renew in time, stepping down", lease=self.name)
                    await self._set_leader(False)
                elif not acquired and self._is_leader and self.current_holder not in (None, self.identity):
                    await self._set_leader(False)
                await asyncio.sleep(self.retry_period)
        finally:
            if self._is_leader:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._release())
                await self._set_leader(False)
            if self._callback is not None:  # the last word (lost leadership) is said before we end
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await self._callback

    async def _set_leader(self, value: bool) -> None:
        if value == self._is_leader:
            return
        self._is_leader = value
        if value:
            self.leader_event.set()
            log.info("leader election: became leader", lease=self.name, identity=self.identity)
        else:
            self.leader_event.clear()
            log.info("leader election: lost leadership", lease=self.name, identity=self.identity)
        if self._on_change is None:
            return
        previous, callback = self._callback, self._on_change

        async def call() -> None:
            if previous is not None:
                if not value:
                    previous.cancel()  # becoming leader is moot once leadership is lost
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await previous
            result = callback(value)
            if result is not None:
                await result

        self._callback = asyncio.create_task(call(), name=f"leader-{self.name}-{value}")

    async def _try_acquire_or_renew(self) -> bool:
        now = micro_time()
        try:
            lease = await self._client.get(LEASES, self.name, self.namespace)
        except NotFound:
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": int(self.lease_duration),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                await self._client.create(LEASES, body, self.namespace)
            except ApiError as err:
                # Another candidate may have won the race (AlreadyExists); anything else — a missing
                # namespace, no RBAC for leases — would otherwise keep every replica a follower silently.
                if err.status != 409:
                    log.warning(
                        "leader election: cannot create the lease",
                        lease=self.name,
                        namespace=self.namespace,
                        error=str(err),
                    )
                return False
            self.current_holder = self.identity
            return True

        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        self.current_holder = holder or None
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and time.monotonic() - self._observed_at < duration:
            return False  # someone else holds a live lease

        new_spec = dict(spec)
        new_spec["holderIdentity"] = self.identity
        new_spec["leaseDurationSeconds"] = int(self.lease_duration)
        new_spec["renewTime"] = now
        if holder != self.identity:
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        lease["spec"] = new_spec
        try:
            await self._client.replace(LEASES, lease)
        except Conflict:
            return False
        self.current_holder = self.identity
        return True

    async def _release(self) -> None:
        lease = await self._client.get(LEASES, self.name, self.namespace)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        spec["holderIdentity"] = None
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = micro_time()
        lease["spec"] = spec
        await self._client.replace(LEASES, lease)
        log.info("leader election: released lease", lease=self.name, identity=self.identity)
