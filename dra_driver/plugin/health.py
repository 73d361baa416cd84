"""Device health for the kubelet: the ``v1alpha1.DRAResourceHealth`` stream (NodeWatchResources).

The fabric is the source: the manager's inventory long poll (``GET /api/v1/inventory?after=V``)
carries every device's Redfish ``Status.Health`` and binding. A prepared device is

- HEALTHY when the fabric reports it ``OK`` or ``Warning`` (still usable) and bound to this node
  for the claim, and (where the host is scanned) its sysfs directory still exists;
- UNHEALTHY when it is ``Critical``, unavailable, bound elsewhere or no longer bound, or gone
  from the host;
- UNKNOWN while the fabric manager cannot be reached (or with the no-op backend).

The inventory is read at most once per ``min_poll_interval`` (1 s): every attach on any node
moves its version, and a read per change on every node would cost the manager and each plugin
far more than the health reports are worth.

Each report lists every prepared device; it is re-sent every ``resend_seconds`` because the
kubelet treats a device it has not heard about within its health timeout (30 s) as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from dra_driver.plugin.backend import DeviceBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimState
from dra_driver.plugin.hostdev import HostScanner
from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from manager_api.models import BindingState, Device, Health
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["HEALTH_SERVICE", "DeviceHealthReport", "HealthMonitor", "health_servicer"]

log = get_logger(__name__)

#: The name the kubelet looks for in PluginInfo.supported_versions: the gRPC service name
#: (k8s.io/kubelet/pkg/apis/dra-health/v1alpha1, DRAResourceHealth_ServiceDesc.ServiceName).
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"

DeviceHealthReport = list[tuple[str, str, int]]  # (pool, device, HealthStatus)


class HealthMonitor:
    def __init__(
        self,
        backend: DeviceBackend,
        store: CheckpointStore,
        *,
        node: str,
        scanner: HostScanner | None = None,
        resend_seconds: float = 10.0,
        poll_timeout: float = 30.0,
        min_poll_interval: float = 1.0,
    ) -> None:
        self.backend = backend
        self.store = store
        self.node = node
        self.scanner = scanner
        self.resend_seconds = resend_seconds
        self.poll_timeout = poll_timeout
        self.min_poll_interval = min_poll_interval
        self._fabric: dict[str, Device] | None = None
        self._version: int | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow_fabric(), name="health-follow-fabric")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def notify(self) -> None:
        """Something changed (a claim prepared or unprepared, or the fabric): send a report."""
        # Replace the event so that every stream waiting on the old one wakes, none misses it.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _follow_fabric(self) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        while True:
            try:
                result = await self.backend.watch_devices(self._version, self.poll_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # any failure: devices become Unknown, retry
                if self._fabric is not None:
                    log.warning("lost the fabric manager; device health is unknown", error=str(err))
                self._fabric, self._version = None, None
                self.notify()
                await backoff.sleep()
                continue
            if result is None:
                return  # this backend has no fabric to follow
            backoff.reset()
            changed = self._version is not None and result[0] != self._version
            self._version, self._fabric = result
            self.notify()
            if changed:
                # Every attach anywhere moves the inventory version; under churn that would be an
                # inventory read per change on every node. At most one per interval: a health
                # change reaches the kubelet within it (its own health timeout is 30 s).
                await asyncio.sleep(self.min_poll_interval)

    def _status(self, uid: str, device: str, host_path: str | None) -> int:
        if self.scanner is not None and host_path is not None and not self.scanner.present_path(host_path):
            return health_pb2.UNHEALTHY
        if self._fabric is None:
            return health_pb2.UNKNOWN
        info = self._fabric.get(device)
        if info is None or info.state is BindingState.UNAVAILABLE:
            return health_pb2.UNHEALTHY
        if info.node != self.node or (info.claim_uid is not None and info.claim_uid != uid):
            return health_pb2.UNHEALTHY
        return health_pb2.UNHEALTHY if info.health is Health.CRITICAL else health_pb2.HEALTHY

    def report(self) -> DeviceHealthReport:
        out: DeviceHealthReport = []
        for uid, entry in sorted(self.store.claims().items()):
            if entry.state is not ClaimState.PREPARE_COMPLETED:
                continue
            for d in entry.devices:
                path = d.host.sysfs_path if d.host else None
                out.append((d.pool, d.device, self._status(uid, d.device, path)))
        return out

    async def reports(self) -> AsyncGenerator[DeviceHealthReport, None]:
        """A report now, then on every change and at least every ``resend_seconds``."""
        while True:
            changed = self._changed
            yield self.report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.resend_seconds)


class _HealthServicer(health_grpc.DRAResourceHealthServicer):
    def __init__(self, monitor: HealthMonitor) -> None:
        self.monitor = monitor

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        last: DeviceHealthReport | None = None
        last_sent = 0.0
        async for report in self.monitor.reports():
            now = time.time()
            if report == last and now - last_sent < self.monitor.resend_seconds:
                continue
            last, last_sent = report, now
            yield health_pb2.NodeWatchResourcesResponse(
                devices=[
                    health_pb2.DeviceHealth(
                        device=health_pb2.DeviceIdentifier(pool_name=pool, device_name=device),
                        health=status,  # type: ignore[arg-type]
                        last_updated_time=int(now),
                    )
                    for pool, device, status in report
                ]
            )


def health_servicer(monitor: HealthMonitor, server: grpc.aio.Server) -> list[str]:
    health_grpc.add_DRAResourceHealthServicer_to_server(_HealthServicer(monitor), server)
    return [HEALTH_SERVICE]
