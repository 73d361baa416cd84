"""What the kubelet's probes of the plugin pod ask: ``/healthz`` (liveness) and ``/readyz``
(readiness), served beside ``/metrics`` on ``--metrics-port``.

- **Live** = both gRPC servers answer through their sockets, as the kubelet reaches them:
  ``GetInfo`` on the registration socket and a ``NodePrepareResources`` without claims on the
  DRA socket (the same two calls kubernetes-sigs/dra-example-driver's health check makes,
  ``cmd/dra-example-kubeletplugin/health.go``). The calls come from the HTTP server's own thread,
  so an event loop that no longer runs (the gRPC servers live on it) fails them by timeout.
- **Ready** = the checkpoint is loaded and reconciled, the kubelet accepted the registration
  (``NotifyRegistrationStatus(plugin_registered=true)``), and the plugin is live. A DaemonSet
  rollout (``maxSurge: 1``) stops the old pod only once the new one is Ready, so the node always
  has a registered plugin that knows its prepared claims; ``kubectl rollout status`` waits for it.

While the plugin is still starting, both answer 503: a startup probe gives it time before the
liveness probe may restart it. While it stops, it is no longer ready but still live (the
remaining unprepare calls must finish).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import grpc

from dra_driver.plugin.registration import RegistrationStatus
from dra_driver.proto.dra_v1 import api_pb2 as dra_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as dra_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc

__all__ = ["Phase", "PluginProbes", "ProbeAnswer"]


class Phase(Enum):
    STARTING = "starting"
    SERVING = "serving"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    ok: bool
    reason: str

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


def _answers(socket: Path, call: Callable[[grpc.Channel], object]) -> str | None:
    """None when ``call`` succeeds on a fresh channel to ``socket``; else why not (one line)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        try:
            call(channel)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            name = code.name if code is not None else "error"
            return f"{socket} does not answer: {name}: {details}"
    return None


class PluginProbes:
    """The plugin's state as its probes see it; :class:`.server.PluginServer` moves the phase."""

    def __init__(
        self,
        *,
        dra_socket: Path,
        registration_socket: Path,
        registration: Callable[[], RegistrationStatus | None],
        timeout: float = 3.0,
    ) -> None:
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self._registration = registration
        self.timeout = timeout
        self.phase = Phase.STARTING

    def _grpc_problem(self) -> str | None:
        timeout = self.timeout
        return _answers(
            self.registration_socket,
            lambda channel: reg_grpc.RegistrationStub(channel).GetInfo(
                reg_pb2.InfoRequest(), timeout=timeout
            ),
        ) or _answers(
            self.dra_socket,
            lambda channel: dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(), timeout=timeout
            ),
        )

    def live(self) -> ProbeAnswer:
        if self.phase is Phase.STARTING:
            return ProbeAnswer(False, "starting: loading the checkpoint and reconciling")
        if self.phase is Phase.STOPPING:
            return ProbeAnswer(True, "stopping")
        problem = self._grpc_problem()
        return ProbeAnswer(problem is None, problem or "ok")

    def ready(self) -> ProbeAnswer:
        if self.phase is Phase.STARTING:
            return ProbeAnswer(False, "starting: loading the checkpoint and reconciling")
        if self.phase is Phase.STOPPING:
            return ProbeAnswer(False, "stopping")
        status = self._registration()
        if status is None or not status.registered:
            why = f" (the kubelet said: {status.last_error})" if status and status.last_error else ""
            return ProbeAnswer(False, f"not registered with the kubelet yet{why}")
        problem = self._grpc_problem()
        return ProbeAnswer(problem is None, problem or "ok")

    def answer(self, path: str) -> ProbeAnswer | None:
        """The answer for an HTTP path, or None when the path is not a probe's."""
        if path == "/healthz":
            return self.live()
        if path == "/readyz":
            return self.ready()
        return None
