"""Kubelet plugin registration: the ``pluginregistration.Registration`` service on the registry socket.

The kubelet's plugin watcher finds ``<registry-dir>/<driver>[-<POD_UID>]-reg.sock``, calls
``GetInfo`` (type ``DRAPlugin``, the driver name, the DRA socket, the services offered), validates,
and reports the outcome with ``NotifyRegistrationStatus``; afterwards it keeps calling ``GetInfo``
to see the plugin is alive (pkg/kubelet/pluginmanager/pluginwatcher/README.md).

A rejection (``plugin_registered=false``) is logged with the kubelet's own error and recorded.
The kubelet retries a failed registration by itself (with back-off), so the plugin keeps serving;
if it is still rejected after ``--registration-timeout`` the plugin exits with status 1, so the
DaemonSet shows a crash-looping pod with that error instead of a silently unregistered driver.
If the socket file disappears (someone cleaned the registry directory), the server is re-created.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from plumbing.logs import get_logger

__all__ = ["DRA_PLUGIN_TYPE", "RegistrationServicer", "RegistrationStatus", "add_registration_servicer"]

log = get_logger(__name__)

#: k8s.io/kubelet/pkg/apis/pluginregistration/v1.DRAPlugin
DRA_PLUGIN_TYPE = "DRAPlugin"


@dataclass
class RegistrationStatus:
    registered: bool = False
    rejected_since: float | None = None
    last_error: str = ""
    info_calls: int = 0

    def rejected_for(self, now: float) -> float:
        return 0.0 if self.rejected_since is None else now - self.rejected_since


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        supported_versions: list[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.supported_versions = list(supported_versions)
        self.status = RegistrationStatus()
        self._clock = clock

    async def GetInfo(
        self, request: reg_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb2.PluginInfo:
        self.status.info_calls += 1
        return reg_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=self.supported_versions,
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            if not self.status.registered:
                log.info("registered with the kubelet", driver=self.driver_name, endpoint=self.endpoint)
            self.status.registered = True
            self.status.rejected_since = None
            self.status.last_error = ""
        else:
            log.error(
                "the kubelet rejected the plugin registration",
                driver=self.driver_name,
                kubelet_error=request.error,
            )
            self.status.registered = False
            self.status.last_error = request.error
            if self.status.rejected_since is None:
                self.status.rejected_since = self._clock()
        return reg_pb2.RegistrationStatusResponse()


def add_registration_servicer(servicer: RegistrationServicer, server: grpc.aio.Server) -> None:
    reg_grpc.add_RegistrationServicer_to_server(servicer, server)
