"""Attaching a claim's devices at prepare: every device not yet in place, concurrently and in the
background (an attach outlives the kubelet's call when the fabric is slow); what each attach ended
in, recorded in the claim's entry; the kubelet's error naming every device that is not done. When
the allocation cannot work on this node at all, what the claim holds here is released again.

Devices a claim has found on the host are reserved for it until its entry records them, so that
two claims preparing at once never take the same host device.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from dra_driver.plugin import prepare_errors
from dra_driver.plugin.backend import AttachedDevice, DeviceBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, PreparedDevice
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import DeviceNotVisible, HostDevice
from dra_driver.plugin.metrics import observe_phase
from dra_driver.plugin.prepare_errors import PrepareFailed
from dra_driver.plugin.state import InflightWork
from manager_api.errors import FabricError
from plumbing.logs import get_logger

__all__ = ["ClaimAttacher"]

log = get_logger(__name__)


@dataclass
class _Outcome:
    """What the attaches of one kubelet call ended in."""

    #: device → its record, attached and (unless the backend has no host side) seen
    attached: dict[str, PreparedDevice] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    #: a failure says the allocation cannot work on this node, however often it is retried
    permanent: bool = False
    #: devices whose attach outlived the call
    still: list[str] = field(default_factory=list)


class ClaimAttacher:
    def __init__(
        self,
        backend: DeviceBackend,
        store: CheckpointStore,
        *,
        node: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.store = store
        self.node = node
        self.inflight = InflightWork()
        self._clock = clock
        #: sysfs paths found for a claim but not yet in its checkpoint entry
        self._reserved: dict[str, str] = {}

    # -- host devices held by claims -----------------------------------------------------------

    def held_paths(self, except_uid: str) -> set[str]:
        held = {path for path, uid in self._reserved.items() if uid != except_uid}
        for uid, entry in self.store.claims().items():
            if uid == except_uid:
                continue
            held.update(d.host.sysfs_path for d in entry.devices if d.host is not None)
        return held

    def reserve(self, uid: str, host: HostDevice | None) -> None:
        if host is not None:
            self._reserved[host.sysfs_path] = uid

    def drop_reservations(self, uid: str) -> None:
        for path in [p for p, owner in self._reserved.items() if owner == uid]:
            del self._reserved[path]

    # -- attaching ------------------------------------------------------------------------------

    async def attach_all(self, ref: ClaimRef, entry: ClaimEntry, deadline: float) -> ClaimEntry:
        """Attach every device not yet in place; record progress; raise :class:`PrepareFailed`
        naming every device that is not done by ``deadline``."""
        todo = [d for d in entry.devices if not self.in_place(d)]
        if not todo:
            return entry
        tasks = {
            d.device: self.inflight.get_or_start((ref.uid, d.device), self._attach(ref, d)) for d in todo
        }
        done, _pending = await asyncio.wait(tasks.values(), timeout=max(0.0, deadline - self._clock()))
        outcome = self._outcome(ref, entry, tasks, done)
        if outcome.attached:
            entry = entry.model_copy(
                update={"devices": [outcome.attached.get(d.device, d) for d in entry.devices]}
            )
            self.store.put(entry)
        if not outcome.failures and not outcome.still:
            return entry
        raise await self._failure(ref, entry, outcome, deadline)

    def _attach(self, ref: ClaimRef, device: PreparedDevice) -> Callable[[], Any]:
        """The attach of ``device`` for the claim, as a task the next kubelet call can pick up."""

        def exclude() -> Collection[str]:
            return self.held_paths(ref.uid)

        async def run() -> AttachedDevice:
            attached = await self.backend.attach(
                ref.uid, device.device, exclude=exclude, pool=device.pool, namespace=ref.namespace
            )
            self.reserve(ref.uid, attached.host)  # before any await: no other claim may take it
            return attached

        return run

    def _outcome(
        self,
        ref: ClaimRef,
        entry: ClaimEntry,
        tasks: dict[str, asyncio.Task[Any]],
        done: set[asyncio.Task[Any]],
    ) -> _Outcome:
        outcome = _Outcome()
        for device, task in tasks.items():
            if task not in done:
                outcome.still.append(device)
                continue
            self.inflight.finished((ref.uid, device))
            try:
                attached = task.result()
            except (FabricError, DeviceNotVisible) as err:
                outcome.failures.append(prepare_errors.attach_failure(err, device, self.node, ref.uid))
                outcome.permanent = outcome.permanent or prepare_errors.cannot_work_here(
                    err, ref.uid, self.node
                )
            except asyncio.CancelledError:
                outcome.failures.append(
                    f"attaching device {device} to node {self.node} was cancelled; the kubelet retries"
                )
            else:
                asked = next(d for d in entry.devices if d.device == device)
                outcome.attached[device] = PreparedDevice(
                    **{**DeviceFacts.of(attached.device), "device": device, "pool": asked.pool},
                    request_names=asked.request_names,
                    attached=True,
                    host=attached.host,
                )
        return outcome

    async def _failure(
        self, ref: ClaimRef, entry: ClaimEntry, outcome: _Outcome, deadline: float
    ) -> PrepareFailed:
        """The kubelet's error for the claim; first, when the allocation cannot work here, give
        back what the claim holds on this node, and record what is attached now."""
        if outcome.permanent:
            # This allocation cannot work on this node: give back what the claim holds here, so no
            # device stays bound to a node whose pod has to be deleted.
            entry, note = await self._roll_back(ref, entry, outcome.still, deadline)
            messages = [*outcome.failures, note]
        else:
            # Retriable: keep what did get attached for the kubelet's retry, and say so.
            kept = [d.device for d in entry.devices if d.attached]
            waiting = [
                prepare_errors.still_attaching(d, self.node, self.backend.pending_error(ref.uid, d))
                for d in sorted(outcome.still)
            ]
            messages = (
                outcome.failures + waiting + ([prepare_errors.kept_attached(kept, self.node)] if kept else [])
            )
        if outcome.attached or outcome.permanent:
            # The call ends here: record what is attached now (the completed record covers the rest).
            with observe_phase("checkpoint"):
                await self.store.commit()
        return PrepareFailed(f"claim {ref.namespace}/{ref.name}: " + " | ".join(messages))

    async def _roll_back(
        self, ref: ClaimRef, entry: ClaimEntry, still: list[str], deadline: float
    ) -> tuple[ClaimEntry, str]:
        """Detach every device the claim holds (or is still attaching) on this node; the entry
        with what stays attached, and one line saying what was released and what was not."""
        await self.inflight.cancel_claim(ref.uid)  # the manager rolls back an attach it is still running
        held = [d for d in entry.devices if d.attached or d.device in still]
        budget = max(0.0, deadline - self._clock())
        results = await asyncio.gather(
            *(self.backend.release(ref.uid, d, within=budget) for d in held), return_exceptions=True
        )
        released: list[str] = []
        kept: list[tuple[str, BaseException]] = []
        for prepared, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                kept.append((prepared.device, result))
            else:
                released.append(prepared.device)
        gone = set(released)
        entry = entry.model_copy(
            update={
                "devices": [
                    d.model_copy(update={"attached": False, "host": None}) if d.device in gone else d
                    for d in entry.devices
                ]
            }
        )
        self.store.put(entry)
        if not kept:
            self.drop_reservations(ref.uid)
        log.warning(
            "claim cannot be prepared on this node; rolled back",
            claim=ref.uid,
            node=self.node,
            released=",".join(released) or None,
            kept=",".join(d for d, _ in kept) or None,
        )
        return entry, prepare_errors.rolled_back(released, kept, self.node)

    def in_place(self, device: PreparedDevice) -> bool:
        """Attached, and (unless the backend has no host side) seen by the host."""
        return device.attached and (device.host is not None or self.backend.name == "noop")
