"""The one way to attach a device and wait until the fabric has: ``POST /api/v1/attachments`` asked
again until the answer is ``attached``, transient failures retried after a backoff.

The kubelet plugin (at prepare) and the binding-condition controller (before the pod is bound) both
attach through :func:`attach_until_attached`; what differs between them is policy — how long each
kind of answer is asked again (:class:`AttachPolicy`) — and what they do on the way
(:class:`AttachProgress`: note a pending error, write a claim's status). The request is idempotent
per claim UID + device, so asking again never binds twice: a 202 ``attaching`` answer makes the next
POST a long poll on the same operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from manager_api.client import ManagerClient
from manager_api.errors import AttachStillRunning, DeviceBusy, FabricError
from manager_api.models import Attachment, AttachmentState
from plumbing.backoff import Backoff

__all__ = ["AttachPolicy", "AttachProgress", "attach_until_attached"]


@dataclass(frozen=True, slots=True)
class AttachPolicy:
    """How long one attach goes on; every time is ``time.monotonic()``."""

    #: how long one request may wait for the fabric before the manager answers 202
    wait_seconds: float
    #: transient failures are asked again until then; past it the last failure is raised
    retry_until: float
    #: 202 ``attaching`` answers are asked again until then; past it :class:`AttachStillRunning`
    attaching_until: float
    #: a ``DeviceBusy`` answer is asked again this long from the first one (and never past
    #: ``retry_until``); None raises it at once: only the kubelet's retry can help
    busy_for: float | None = None
    #: the pause between tries grows from ``initial`` to ``maximum`` seconds
    backoff_initial: float = 0.1
    backoff_maximum: float = 5.0


class AttachProgress:
    """What the caller hears while an attach goes on; each hook does nothing unless overridden."""

    def before_request(self) -> None:
        """Each request is about to leave (where a role places its crash point, docs/reliability.md)."""

    def busy(self, err: DeviceBusy) -> None:
        """The first ``DeviceBusy`` answer of a run of them (with ``busy_for`` set)."""

    def retrying(self, err: FabricError) -> None:
        """A transient failure that is asked again after a pause."""

    async def attaching(self, attachment: Attachment, waited: float) -> None:
        """A 202 answer: the fabric has been working on it ``waited`` seconds; asked again at once."""


async def attach_until_attached(
    client: ManagerClient,
    device: str,
    node: str,
    claim_uid: str,
    policy: AttachPolicy,
    *,
    pool: str | None = None,
    namespace: str | None = None,
    progress: AttachProgress | None = None,
    limit: asyncio.Semaphore | None = None,
    share_id: str | None = None,
    memory_bytes: int | None = None,
) -> Attachment:
    """POST the attachment until the fabric says attached (the answer is returned).

    Raises a non-retriable :class:`FabricError` at once, a transient one past
    ``policy.retry_until``, ``DeviceBusy`` as :attr:`AttachPolicy.busy_for` says, and
    :class:`AttachStillRunning` when the fabric is still attaching at ``policy.attaching_until``.
    ``limit`` bounds how many requests are in flight at once (the controller's concurrency). A
    share of a memory pool is asked for with the allocation's ``share_id`` and ``memory_bytes``.
    """
    hear = progress or AttachProgress()
    started = time.monotonic()
    backoff = Backoff(initial=policy.backoff_initial, maximum=policy.backoff_maximum)
    busy_since: float | None = None
    while True:
        hear.before_request()
        try:
            async with limit if limit is not None else contextlib.nullcontext():
                attachment = await client.attach(
                    device,
                    node,
                    claim_uid,
                    wait_seconds=policy.wait_seconds,
                    pool=pool,
                    namespace=namespace,
                    share_id=share_id,
                    memory_bytes=memory_bytes,
                )
        except DeviceBusy as err:
            if policy.busy_for is None:
                raise  # held by another claim or node
            now = time.monotonic()
            if busy_since is None:
                busy_since = now
                hear.busy(err)
            if now - busy_since >= policy.busy_for or now >= policy.retry_until:
                raise
            await asyncio.sleep(backoff.next())
            continue
        except FabricError as err:
            if not err.retriable or time.monotonic() >= policy.retry_until:
                raise
            hear.retrying(err)
            delay = backoff.next()  # grows even while the manager names its own Retry-After
            await asyncio.sleep(err.retry_after or delay)
            continue
        busy_since = None
        if attachment.state is AttachmentState.ATTACHED:
            return attachment
        waited = time.monotonic() - started
        if time.monotonic() >= policy.attaching_until:
            raise AttachStillRunning(
                f"the fabric has been attaching device {device} for {waited:.0f}s "
                f"(operation {attachment.operation_id or 'unknown'})",
                device=device,
                node=node,
            )
        await hear.attaching(attachment, waited)
