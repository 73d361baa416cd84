"""Device backends: how a claimed device gets to this host and away again.

:class:`FabricBackend` is the real one: bind through the fabric manager (keyed by claim UID +
device, so a retry never binds twice), then wait until this host sees the device in sysfs; on
release, remove it host-side and ask for the detach. :class:`NoopBackend` does nothing and
answers at once, so a benchmark measures the plugin's own overhead (claim read, checkpoint, CDI).

A device the claim got from the warm pool after another claim, which the fabric cannot reset, is
answered ``resetRequired``: once it is visible, and before prepare goes on to the CDI spec, the
plugin resets it (:meth:`HostScanner.reset`, a PCIe function-level reset through sysfs) and reports
it; after a failed reset the manager power-cycles it for the claim and the plugin waits for it
again (docs/plugin.md "Reset between tenants").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import DeviceIdentity, HostDevice, HostScanner
from dra_driver.plugin.metrics import observe_phase
from manager_api.attaching import AttachPolicy, AttachProgress, attach_until_attached
from manager_api.client import ManagerClient
from manager_api.errors import DeviceNotFound, FabricError
from manager_api.models import (
    MAX_WAIT_SECONDS,
    Attachment,
    AttachmentState,
    BindingState,
    Device,
    DeviceType,
)
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = [
    "AttachedDevice",
    "DeviceBackend",
    "FabricBackend",
    "NoopBackend",
    "StillDetaching",
]

log = get_logger(__name__)


class StillDetaching(KubeletPluginError, FabricError):
    """The fabric accepted the detach but has not finished it yet (retriable)."""

    code = "StillDetaching"
    retriable = True


@dataclass(frozen=True, slots=True)
class AttachedDevice:
    """A device bound to this node for a claim, as the fabric describes it and the host sees it."""

    device: Device
    host: HostDevice | None


class DeviceBackend(Protocol):
    name: str

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        exclude: Callable[[], Collection[str]],
        pool: str | None = None,
        namespace: str | None = None,
    ) -> AttachedDevice:
        """Bind ``device`` (of ``pool``, when the claim names one) to this node for the claim (of
        ``namespace``, which the manager records) and wait until the host sees it."""
        ...

    async def release(self, claim_uid: str, prepared: PreparedDevice, *, within: float) -> None:
        """Remove the device host-side and detach it; raises :class:`StillDetaching` past ``within`` s."""
        ...

    async def bindings(self) -> list[Device] | None:
        """Devices the fabric has bound (or is binding) to this node; None when it cannot say."""
        ...

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        """Why an attach still running has not finished yet (the last transient error), if known."""
        ...

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        """The fabric's devices by name, once its inventory version passes ``after`` (long poll)."""
        ...

    async def aclose(self) -> None: ...


def identity_of(device: Device) -> DeviceIdentity:
    """What the host scanner looks for, of the manager's answer about ``device``."""
    return DeviceFacts(**DeviceFacts.of(device)).identity()


class _Pending(AttachProgress):
    """Keeps why an attach still running has not finished, for the kubelet's answer meanwhile."""

    def __init__(self, backend: FabricBackend, claim_uid: str, device: str) -> None:
        self._backend, self._key = backend, (claim_uid, device)

    def before_request(self) -> None:
        crash_point("plugin.prepare.before-attach")

    def retrying(self, err: FabricError) -> None:
        claim_uid, device = self._key
        self._backend.note_pending(claim_uid, device, err)
        log.warning(
            "attach failed, retrying", claim=claim_uid, device=device, node=self._backend.node, error=str(err)
        )

    async def attaching(self, attachment: Attachment, waited: float) -> None:
        claim_uid, device = self._key
        # 202 attaching: the same request is a long poll on the same operation (no second bind).
        progress = FabricError(
            f"the fabric has been working on it for {waited:.0f}s "
            f"(operation {attachment.operation_id or 'unknown'})",
            device=device,
            node=self._backend.node,
        )
        self._backend.note_pending(claim_uid, device, progress)


class FabricBackend:
    name = "fabric"

    def __init__(
        self,
        client: ManagerClient,
        scanner: HostScanner,
        *,
        node: str,
        visible_timeout: float,
        host_removal: bool,
        retry_budget: float = 60.0,
        attach_give_up: float = 900.0,
    ) -> None:
        self.client = client
        self.scanner = scanner
        self.node = node
        self.visible_timeout = visible_timeout
        self.host_removal = host_removal and scanner.real_host
        self.retry_budget = retry_budget
        self.attach_give_up = attach_give_up
        #: (claim UID, device) → the last transient error of an attach that is still retrying
        self._pending: dict[tuple[str, str], FabricError] = {}
        #: (claim UID, device) → when its attach started (``time.monotonic()``)
        self._started: dict[tuple[str, str], float] = {}

    def note_pending(self, claim_uid: str, device: str, err: FabricError) -> None:
        """Why the attach of ``device`` for ``claim_uid``, still running, has not finished yet."""
        self._pending[(claim_uid, device)] = err

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        key = (claim_uid, device)
        if key in self._pending:
            return self._pending[key]
        if key in self._started:
            waited = time.monotonic() - self._started[key]
            return FabricError(f"the fabric manager has been attaching it for {waited:.0f}s", device=device)
        return None

    async def _bind(
        self, claim_uid: str, device: str, pool: str | None = None, namespace: str | None = None
    ) -> Attachment:
        """POST the attachment until the fabric says attached; transient failures are retried."""
        started = self._started[(claim_uid, device)] = time.monotonic()
        policy = AttachPolicy(
            wait_seconds=MAX_WAIT_SECONDS,
            retry_until=started + self.retry_budget,
            attaching_until=started + self.attach_give_up,
        )
        try:
            return await attach_until_attached(
                self.client,
                device,
                self.node,
                claim_uid,
                policy,
                pool=pool,
                namespace=namespace,
                progress=_Pending(self, claim_uid, device),
            )
        finally:
            self._pending.pop((claim_uid, device), None)
            self._started.pop((claim_uid, device), None)

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        exclude: Callable[[], Collection[str]],
        pool: str | None = None,
        namespace: str | None = None,
    ) -> AttachedDevice:
        with observe_phase("attach"):
            attachment = await self._bind(claim_uid, device, pool, namespace)
        crash_point("plugin.prepare.after-attach")
        info = attachment.device
        host = await self._visible(info, exclude)
        if attachment.reset_required:
            info, host = await self._reset(claim_uid, info, host, exclude, pool, namespace)
        crash_point("plugin.prepare.after-visible")
        log.info(
            "device attached and visible",
            claim=claim_uid,
            device=device,
            node=self.node,
            sysfs=host.sysfs_path,
        )
        return AttachedDevice(device=info, host=host)

    async def _visible(self, info: Device, exclude: Callable[[], Collection[str]]) -> HostDevice:
        with observe_phase("visible"):
            return await self.scanner.wait_visible(
                identity_of(info), within=self.visible_timeout, exclude=exclude
            )

    async def _reset(
        self,
        claim_uid: str,
        info: Device,
        host: HostDevice,
        exclude: Callable[[], Collection[str]],
        pool: str | None,
        namespace: str | None,
    ) -> tuple[Device, HostDevice]:
        """Reset the device another claim used before this one (the manager answered
        ``resetRequired``) and report it; after a failed reset the manager detached and attached it
        again for this claim (a slot power cycle): bind again and wait for it to be visible."""
        with observe_phase("reset"):
            failure = await asyncio.to_thread(self.scanner.reset, host)
        # A crash before the report leaves the manager's "pending": the retried prepare resets again.
        answer = await self.client.report_reset(
            info.name,
            self.node,
            claim_uid,
            ok=failure is None,
            message=failure or "",
            wait_seconds=MAX_WAIT_SECONDS,
        )
        if failure is None:
            log.info(
                "device reset before its claim uses it", claim=claim_uid, device=info.name, node=self.node
            )
            return info, host
        log.warning(
            "device could not be reset; the fabric power-cycles it for the claim",
            claim=claim_uid,
            device=info.name,
            node=self.node,
            error=failure,
        )
        if answer.state is not AttachmentState.ATTACHED or answer.reset_required:
            answer = await self._bind(claim_uid, info.name, pool, namespace)
        if answer.reset_required:  # cannot happen after a power cycle: never use it unreset
            raise FabricError(
                f"device {info.name} is still due a reset after its power cycle",
                device=info.name,
                node=self.node,
            )
        return answer.device, await self._visible(answer.device, exclude)

    async def release(self, claim_uid: str, prepared: PreparedDevice, *, within: float) -> None:
        if self.host_removal and prepared.host is not None and self.scanner.present(prepared.host):
            with observe_phase("host_removal"):
                await asyncio.to_thread(self.scanner.remove, prepared.host)
        deadline = time.monotonic() + within
        with observe_phase("detach"):
            while True:
                wait = max(0.0, min(MAX_WAIT_SECONDS, deadline - time.monotonic()))
                crash_point("plugin.unprepare.before-detach")
                try:
                    attachment = await self.client.detach(
                        prepared.device, self.node, claim_uid, wait_seconds=wait
                    )
                except DeviceNotFound:
                    log.warning(
                        "device is gone from the fabric; nothing to detach",
                        claim=claim_uid,
                        device=prepared.device,
                        node=self.node,
                    )
                    return
                if attachment.state is AttachmentState.DETACHED:
                    crash_point("plugin.unprepare.after-detach")
                    return
                if time.monotonic() >= deadline:
                    raise StillDetaching(
                        f"the fabric is still detaching device {prepared.device}; the kubelet will retry",
                        device=prepared.device,
                        node=self.node,
                    )

    async def bindings(self) -> list[Device] | None:
        inventory = await self.client.inventory()
        return [
            d
            for d in inventory.devices
            if d.node == self.node and d.state in (BindingState.BOUND, BindingState.ATTACHING)
        ]

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        inventory = await self.client.inventory(after=after, timeout_seconds=wait_seconds)
        return inventory.version, {d.name: d for d in inventory.devices}

    async def aclose(self) -> None:
        await self.client.aclose()
        self.scanner.changes.stop()


class NoopBackend:
    """Binds nothing, sees nothing: every device is 'attached' at once (benchmarks)."""

    name = "noop"

    def __init__(self, node: str) -> None:
        self.node = node

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        exclude: Callable[[], Collection[str]],
        pool: str | None = None,
        namespace: str | None = None,
    ) -> AttachedDevice:
        info = Device(
            name=device,
            pool="",
            fabric="noop",
            type=DeviceType.OTHER,
            state=BindingState.BOUND,
            node=self.node,
            claim_uid=claim_uid,
            binding_style="",
            redfish_uri="",
        )
        return AttachedDevice(device=info, host=None)

    async def release(self, claim_uid: str, prepared: PreparedDevice, *, within: float) -> None:
        return None

    async def bindings(self) -> list[Device] | None:
        return None

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        return None

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        return None

    async def aclose(self) -> None:
        return None
