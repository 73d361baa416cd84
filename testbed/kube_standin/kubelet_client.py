"""The kubelet's side of DRA, for tests and debugging: its plugin manager (registration) and its
DRA manager's calls (NodePrepareResources, NodeUnprepareResources, NodeWatchResources).

Copied behaviour, from Kubernetes v1.34:

* ``pkg/kubelet/pluginmanager/pluginwatcher``: every unix socket in the registry directory
  (recursively, names starting with ``.`` ignored) is a plugin to register; a socket that is
  re-created is registered again; a removed one is deregistered.
* ``pkg/kubelet/pluginmanager/reconciler``: a loop (1 s) registers what was found; a failed
  registration is retried with exponential back-off (0.5 s doubling to 2 min 2 s,
  ``pkg/util/goroutinemap/exponentialbackoff``).
* ``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go``: dial (10 s),
  ``GetInfo`` (1 s); an unknown type, or a validation failure, is reported with
  ``NotifyRegistrationStatus(plugin_registered=false, error=...)`` (5 s) using the kubelet's
  own error strings; otherwise the handler registers the plugin and the kubelet notifies
  ``plugin_registered=true``. An empty endpoint means the registration socket itself.
* ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``: type ``DRAPlugin``; the chosen service
  is the first entry of the plugin's ``supported_versions`` that the kubelet supports
  (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``) — plugins list ``v1`` first to have it preferred;
  one endpoint cannot be registered twice for a driver; the most recently registered plugin
  of a driver serves its calls; the health stream (``v1alpha1.DRAResourceHealth``) is opened
  after registration and re-opened every 5 s while it fails.
* ``pkg/kubelet/cm/dra/plugin/dra_plugin.go``: every DRA call has a 45 s deadline.
* ``pkg/kubelet/cm/dra/manager.go``: claims are grouped by the drivers named in their
  allocation and each plugin gets only namespace, name and UID; a claim missing from the
  answer, or answered with an error, fails the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc

from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from dra_driver.proto.dra_v1 import api_pb2 as v1_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as v1_grpc
from dra_driver.proto.dra_v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver.proto.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from kube_standin.errors import KubeletError
from plumbing.backoff import Backoff
from plumbing.kube.dra import ResourceClaim
from plumbing.logs import get_logger

__all__ = [
    "DRA_CALL_TIMEOUT",
    "DRA_PLUGIN_TYPE",
    "SERVICES_SUPPORTED_BY_KUBELET",
    "ClaimRef",
    "DRAPluginClient",
    "DeviceHealth",
    "DraCallError",
    "KubeletError",
    "PluginManager",
    "PrepareResult",
    "PreparedDevice",
    "RegistrationAttempt",
    "RegistrationFailed",
    "claim_drivers",
    "find_plugin_sockets",
    "register_plugin",
]

log = get_logger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
V1_SERVICE = "v1.DRAPlugin"
V1BETA1_SERVICE = "v1beta1.DRAPlugin"
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
#: the kubelet's own list, most recent first (dra_plugin.go servicesSupportedByKubelet).
SERVICES_SUPPORTED_BY_KUBELET: tuple[str, ...] = (V1_SERVICE, V1BETA1_SERVICE)

DIAL_TIMEOUT = 10.0
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
DRA_CALL_TIMEOUT = 45.0
RECONCILE_PERIOD = 1.0
HEALTH_RETRY_PERIOD = 5.0
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 122.0


class RegistrationFailed(KubeletError):
    """Registration failed; ``notified`` is the error the plugin was sent, if it was told."""

    def __init__(self, message: str, notified: str = "") -> None:
        super().__init__(message)
        self.notified = notified


class DraCallError(KubeletError):
    """A DRA call failed as a whole (transport error, deadline, or a claim left out)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """All the kubelet tells a plugin about a claim."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, claim: Mapping[str, Any]) -> ClaimRef:
        meta = claim.get("metadata") or {}
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""))


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    health: Literal["Unknown", "Healthy", "Unhealthy"]
    last_updated: int


@dataclass(frozen=True, slots=True)
class RegistrationAttempt:
    """What one registration attempt saw and said, for tests to assert on."""

    socket: Path
    driver: str
    endpoint: str
    supported_versions: tuple[str, ...]
    registered: bool
    error: str
    chosen_service: str = ""
    at: float = field(default_factory=time.time)


def _claims(claims: Iterable[ClaimRef]) -> list[v1_pb2.Claim]:
    return [v1_pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


def _beta_claims(claims: Iterable[ClaimRef]) -> list[v1beta1_pb2.Claim]:
    return [v1beta1_pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


def _require_success(method: str, claims: Sequence[ClaimRef], errors: Mapping[str, str]) -> None:
    """As the kubelet's DRA manager: every claim must be answered, and without an error."""
    missing = [c for c in claims if c.uid not in errors]
    if missing:
        raise DraCallError(f"{method} left out {len(missing)} claims")
    for claim in claims:
        if errors[claim.uid]:
            raise DraCallError(
                f"{method} failed for claim {claim.namespace}/{claim.name}: {errors[claim.uid]}"
            )


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def find_plugin_sockets(registry_dir: Path) -> dict[Path, tuple[int, int]]:
    """Every socket the kubelet's plugin watcher would pick up, with an identity that changes
    when the socket is re-created (inode, change time)."""
    found: dict[Path, tuple[int, int]] = {}
    if not registry_dir.is_dir():
        return found
    for root, dirs, files in os.walk(registry_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = Path(root) / name
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISSOCK(info.st_mode):
                found[path] = (info.st_ino, info.st_ctime_ns)
    return found


def _unix_target(path: str) -> str:
    return "unix://" + os.path.abspath(path)


def _choose_service(driver: str, endpoint: str, supported: Sequence[str]) -> str:
    """The DRA handler's validateSupportedServices, with its error strings."""
    if not supported:
        raise RegistrationFailed(
            f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: "
            "empty list of supported gRPC services (aka supported versions)"
        )
    for service in supported:
        if service in SERVICES_SUPPORTED_BY_KUBELET:
            return service
    raise RegistrationFailed(
        f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: "
        f"none of services supported by the plugin ({list(supported)!r}) are supported by the kubelet "
        f"({list(SERVICES_SUPPORTED_BY_KUBELET)!r})"
    )


async def _notify(stub: Any, registered: bool, error: str, deadline: float) -> None:
    await stub.NotifyRegistrationStatus(
        reg_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=deadline
    )


async def register_plugin(
    socket_path: Path,
    *,
    registered_endpoints: Mapping[str, set[str]] | None = None,
    dial_timeout: float = DIAL_TIMEOUT,
    get_info_timeout: float = GET_INFO_TIMEOUT,
    notify_timeout: float = NOTIFY_TIMEOUT,
) -> RegistrationAttempt:
    """One registration, exactly as the kubelet's operation generator runs it.

    Returns the attempt when the plugin was registered (and told so); raises
    :class:`RegistrationFailed` with the kubelet's message otherwise (after telling the plugin,
    when the failure is the plugin's fault rather than the transport's).
    """
    where = str(socket_path)
    async with grpc.aio.insecure_channel(_unix_target(where)) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), dial_timeout)
        except TimeoutError as err:
            raise RegistrationFailed(
                f"RegisterPlugin error -- dial failed at socket {where}, err: "
                f"failed to dial socket {where}, err: context deadline exceeded"
            ) from err
        # The generated stubs are typed for the blocking API; on an aio channel calls are awaitables.
        stub: Any = reg_grpc.RegistrationStub(channel)
        try:
            info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=get_info_timeout)
        except grpc.aio.AioRpcError as err:
            raise RegistrationFailed(
                f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {where}, "
                f"err: {err.details() or err.code().name}"
            ) from err
        endpoint = info.endpoint or where
        versions = tuple(info.supported_versions)

        async def reject(message: str, returned: str) -> RegistrationFailed:
            try:
                await _notify(stub, False, message, notify_timeout)
            except grpc.aio.AioRpcError as err:
                return RegistrationFailed(
                    f"RegisterPlugin error -- failed to send error at socket {where}, err: {message}: "
                    f"{err.details() or err.code().name}"
                )
            return RegistrationFailed(returned, notified=message)

        if info.type != DRA_PLUGIN_TYPE:
            message = (
                "RegisterPlugin error -- no handler registered for plugin type: "
                f"{info.type} at socket {where}"
            )
            raise await reject(message, message)
        try:
            if not info.name:
                raise RegistrationFailed("DRA driver name is empty")
            chosen = _choose_service(info.name, endpoint, versions)
        except RegistrationFailed as err:
            raise await reject(
                f"RegisterPlugin error -- plugin validation failed with err: {err}",
                "RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed",
            ) from err
        if endpoint in (registered_endpoints or {}).get(info.name, set()):
            message = (
                "RegisterPlugin error -- plugin registration failed with err: "
                f"endpoint {endpoint} already registered for DRA driver plugin {info.name}"
            )
            raise await reject(message, message)
        try:
            await _notify(stub, True, "", notify_timeout)
        except grpc.aio.AioRpcError as err:
            raise RegistrationFailed(
                f"RegisterPlugin error -- failed to send registration status at socket {where}, "
                f"err: {err.details() or err.code().name}"
            ) from err
    return RegistrationAttempt(socket_path, info.name, endpoint, versions, True, "", chosen)


class DRAPluginClient:
    """The kubelet's connection to one registered plugin's DRA endpoint."""

    def __init__(
        self,
        driver: str,
        endpoint: str,
        chosen_service: str,
        *,
        call_timeout: float = DRA_CALL_TIMEOUT,
        socket: Path | None = None,
    ) -> None:
        if chosen_service not in SERVICES_SUPPORTED_BY_KUBELET:
            raise ValueError(f"unsupported DRA service {chosen_service!r}")
        self.driver = driver
        self.endpoint = endpoint
        self.chosen_service = chosen_service
        self.call_timeout = call_timeout
        self.socket = socket
        self._channel = grpc.aio.insecure_channel(_unix_target(endpoint))
        self._v1: Any = v1_grpc.DRAPluginStub(self._channel)
        self._v1beta1: Any = v1beta1_grpc.DRAPluginStub(self._channel)
        self._health: Any = health_grpc.DRAResourceHealthStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> DRAPluginClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _fail(self, method: str, err: grpc.aio.AioRpcError) -> DraCallError:
        return DraCallError(
            f"{method} of DRA driver {self.driver} at {self.endpoint} failed: "
            f"rpc error: code = {err.code().name} desc = {err.details()}",
            err.code(),
        )

    async def node_prepare_resources(
        self, claims: Sequence[ClaimRef], *, deadline: float | None = None
    ) -> dict[str, PrepareResult]:
        """One NodePrepareResources call; the result per claim UID (errors per claim included)."""
        seconds = self.call_timeout if deadline is None else deadline
        try:
            if self.chosen_service == V1_SERVICE:
                response: Any = await self._v1.NodePrepareResources(
                    v1_pb2.NodePrepareResourcesRequest(claims=_claims(claims)), timeout=seconds
                )
            else:
                response = await self._v1beta1.NodePrepareResources(
                    v1beta1_pb2.NodePrepareResourcesRequest(claims=_beta_claims(claims)), timeout=seconds
                )
        except grpc.aio.AioRpcError as err:
            raise self._fail("NodePrepareResources", err) from err
        results: dict[str, PrepareResult] = {}
        for uid, answer in response.claims.items():
            devices = tuple(
                PreparedDevice(tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                for d in answer.devices
            )
            results[uid] = PrepareResult(devices, answer.error)
        return results

    async def node_unprepare_resources(
        self, claims: Sequence[ClaimRef], *, deadline: float | None = None
    ) -> dict[str, str]:
        """One NodeUnprepareResources call; the error per claim UID ('' when it succeeded)."""
        seconds = self.call_timeout if deadline is None else deadline
        try:
            if self.chosen_service == V1_SERVICE:
                response: Any = await self._v1.NodeUnprepareResources(
                    v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(claims)), timeout=seconds
                )
            else:
                response = await self._v1beta1.NodeUnprepareResources(
                    v1beta1_pb2.NodeUnprepareResourcesRequest(claims=_beta_claims(claims)), timeout=seconds
                )
        except grpc.aio.AioRpcError as err:
            raise self._fail("NodeUnprepareResources", err) from err
        return {uid: answer.error for uid, answer in response.claims.items()}

    async def prepare(
        self, claims: Sequence[ClaimRef], *, deadline: float | None = None
    ) -> dict[str, PrepareResult]:
        """As the kubelet's DRA manager: every claim must be answered, and without an error."""
        results = await self.node_prepare_resources(claims, deadline=deadline)
        _require_success("NodePrepareResources", claims, {uid: r.error for uid, r in results.items()})
        return results

    async def unprepare(self, claims: Sequence[ClaimRef], *, deadline: float | None = None) -> None:
        """As the kubelet's DRA manager: every claim must be answered, and without an error."""
        errors = await self.node_unprepare_resources(claims, deadline=deadline)
        _require_success("NodeUnprepareResources", claims, errors)

    async def watch_resources(self) -> AsyncIterator[list[DeviceHealth]]:
        """The NodeWatchResources stream: one list of device health per message."""
        names = {
            health_pb2.UNKNOWN: "Unknown",
            health_pb2.HEALTHY: "Healthy",
            health_pb2.UNHEALTHY: "Unhealthy",
        }
        stream = self._health.NodeWatchResources(health_pb2.NodeWatchResourcesRequest())
        try:
            async for message in stream:
                yield [
                    DeviceHealth(
                        d.device.pool_name,
                        d.device.device_name,
                        names.get(d.health, "Unknown"),  # type: ignore[arg-type]
                        int(d.last_updated_time),
                    )
                    for d in message.devices
                ]
        except grpc.aio.AioRpcError as err:
            raise self._fail("NodeWatchResources", err) from err
        finally:
            stream.cancel()


def claim_drivers(claim: Mapping[str, Any]) -> list[str]:
    """The drivers the kubelet calls for an allocated claim, in order of first appearance."""
    view = ResourceClaim.read(claim)
    return view.drivers() if view is not None else []


@dataclass
class _Registered:
    client: DRAPluginClient
    attempt: RegistrationAttempt
    identity: tuple[int, int]
    health_task: asyncio.Task[None] | None = None


@dataclass
class _Pending:
    identity: tuple[int, int]
    backoff: Backoff
    next_try: float = 0.0


class PluginManager:
    """The kubelet's plugin manager and DRA plugin manager for one registry directory.

    ``run()`` watches ``registry_dir`` until cancelled; ``plugin(driver)`` is the client the
    kubelet would use for a driver; ``attempts`` records every registration attempt and
    ``health`` the last health reported per (driver, pool, device).
    """

    def __init__(
        self,
        registry_dir: Path,
        *,
        reconcile_period: float = RECONCILE_PERIOD,
        call_timeout: float = DRA_CALL_TIMEOUT,
        watch_health: bool = True,
        health_retry_period: float = HEALTH_RETRY_PERIOD,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self.registry_dir = registry_dir
        self.reconcile_period = reconcile_period
        self.call_timeout = call_timeout
        self.watch_health = watch_health
        self.health_retry_period = health_retry_period
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.attempts: list[RegistrationAttempt] = []
        self.health: dict[tuple[str, str, str], DeviceHealth] = {}
        self._registered: dict[Path, _Registered] = {}
        self._pending: dict[Path, _Pending] = {}
        self._inflight: dict[Path, asyncio.Task[None]] = {}
        self._changed = asyncio.Condition()

    # -- state ---------------------------------------------------------------------------------

    def drivers(self) -> list[str]:
        return sorted({r.attempt.driver for r in self._registered.values()})

    def plugin(self, driver: str) -> DRAPluginClient | None:
        """The most recently registered plugin of ``driver`` (the kubelet's heuristic)."""
        best: _Registered | None = None
        for registered in self._registered.values():
            if registered.attempt.driver == driver and (
                best is None or registered.attempt.at >= best.attempt.at
            ):
                best = registered
        return best.client if best else None

    async def wait_for_plugin(self, driver: str, within: float = 30.0) -> DRAPluginClient:
        async def ready() -> DRAPluginClient:
            async with self._changed:
                while True:
                    client = self.plugin(driver)
                    if client is not None:
                        return client
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(ready(), within)
        except TimeoutError as err:
            tried = [a for a in self.attempts if a.driver == driver or not a.driver]
            if tried:
                last = f"; last attempt: {tried[-1].error}"
            elif not find_plugin_sockets(self.registry_dir):
                last = "; no registration socket is there: is the plugin running with this --registry-dir?"
            else:
                last = "; a plugin registered, but for another driver"
            raise KubeletError(
                f"DRA driver {driver} did not register within {within:.0f}s in {self.registry_dir}{last}"
            ) from err

    async def wait_for_attempt(
        self, predicate: Callable[[RegistrationAttempt], bool], within: float = 30.0
    ) -> RegistrationAttempt:
        """The first registration attempt (past or future) for which ``predicate(attempt)`` holds."""

        async def seen() -> RegistrationAttempt:
            async with self._changed:
                while True:
                    for attempt in self.attempts:
                        if predicate(attempt):
                            return attempt
                    await self._changed.wait()

        return await asyncio.wait_for(seen(), within)

    async def _notify_change(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- DRA calls (the DRA manager's side) ----------------------------------------------------

    def _client_for(self, driver: str) -> DRAPluginClient:
        client = self.plugin(driver)
        if client is None:
            raise DraCallError(f"DRA driver {driver} is not registered")
        return client

    async def prepare_claims(
        self, claims: Sequence[Mapping[str, Any]]
    ) -> dict[str, dict[str, PrepareResult]]:
        """Prepare allocated ResourceClaim objects as the kubelet does for a pod: one call per
        driver, with the claims allocated (in part) to it. Returns {claim UID: {driver: result}}."""
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in claims:
            drivers = claim_drivers(claim)
            if not drivers:
                raise DraCallError(
                    f"claim {ClaimRef.of(claim).namespace}/{ClaimRef.of(claim).name} is not allocated"
                )
            for driver in drivers:
                by_driver.setdefault(driver, []).append(ClaimRef.of(claim))
        out: dict[str, dict[str, PrepareResult]] = {}
        for driver, refs in by_driver.items():
            results = await self._client_for(driver).prepare(refs)
            for uid, result in results.items():
                out.setdefault(uid, {})[driver] = result
        return out

    async def unprepare_claims(self, claims: Sequence[Mapping[str, Any]]) -> None:
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in claims:
            for driver in claim_drivers(claim):
                by_driver.setdefault(driver, []).append(ClaimRef.of(claim))
        for driver, refs in by_driver.items():
            await self._client_for(driver).unprepare(refs)

    # -- the watch/reconcile loop --------------------------------------------------------------

    async def run(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        try:
            while True:
                await self.reconcile()
                await asyncio.sleep(self.reconcile_period)
        finally:
            await self.close()

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        for task in list(self._inflight.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for path in list(self._registered):
            await self._deregister(path, reason="plugin manager stopped")

    async def reconcile(self) -> None:
        """One reconciler pass: deregister what is gone or was re-created, register what is new."""
        found = find_plugin_sockets(self.registry_dir)
        for path, registered in list(self._registered.items()):
            if found.get(path) != registered.identity:
                why = "socket removed" if path not in found else "socket re-created"
                await self._deregister(path, reason=why)
        for path in list(self._pending):
            if path not in found:
                del self._pending[path]
        now = time.monotonic()
        for path, identity in found.items():
            if path in self._registered or path in self._inflight:
                continue
            pending = self._pending.get(path)
            if pending is None or pending.identity != identity:
                # goroutinemap's exponential backoff has no jitter.
                backoff = Backoff(self.backoff_initial, self.backoff_max, jitter=0)
                pending = self._pending[path] = _Pending(identity, backoff)
            if now < pending.next_try:
                continue
            # Registrations run side by side (the kubelet's pending operations): a socket
            # nobody answers on must not hold up the others for its dial timeout.
            self._inflight[path] = asyncio.create_task(self._register_once(path, pending))

    async def _register_once(self, path: Path, pending: _Pending) -> None:
        try:
            await self._register(path, pending)
        finally:
            self._inflight.pop(path, None)

    async def _register(self, path: Path, pending: _Pending) -> None:
        endpoints: dict[str, set[str]] = {}
        for registered in self._registered.values():
            endpoints.setdefault(registered.attempt.driver, set()).add(registered.attempt.endpoint)
        try:
            attempt = await register_plugin(path, registered_endpoints=endpoints)
        except RegistrationFailed as err:
            delay = pending.backoff.next()
            pending.next_try = time.monotonic() + delay
            detail = err.notified or str(err)
            self.attempts.append(RegistrationAttempt(path, "", "", (), False, detail))
            log.warning("plugin registration failed", socket=str(path), error=detail, retry_in=delay)
            await self._notify_change()
            return
        self._pending.pop(path, None)
        client = DRAPluginClient(
            attempt.driver,
            attempt.endpoint,
            attempt.chosen_service,
            call_timeout=self.call_timeout,
            socket=path,
        )
        registered = _Registered(client, attempt, pending.identity)
        if self.watch_health:
            registered.health_task = asyncio.create_task(self._health_loop(client))
        self._registered[path] = registered
        self.attempts.append(attempt)
        log.info(
            "registered DRA plugin",
            driver=attempt.driver,
            endpoint=attempt.endpoint,
            service=attempt.chosen_service,
            socket=str(path),
        )
        await self._notify_change()

    async def _deregister(self, path: Path, *, reason: str) -> None:
        registered = self._registered.pop(path, None)
        if registered is None:
            return
        if registered.health_task is not None:
            registered.health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await registered.health_task
        await registered.client.close()
        log.info("deregistered DRA plugin", driver=registered.attempt.driver, socket=str(path), reason=reason)
        await self._notify_change()

    async def _health_loop(self, client: DRAPluginClient) -> None:
        while True:
            try:
                async for devices in client.watch_resources():
                    for device in devices:
                        self.health[(client.driver, device.pool, device.device)] = device
                    await self._notify_change()
                log.info("health stream ended", driver=client.driver)
            except DraCallError as err:
                level = log.debug if err.code == grpc.StatusCode.UNIMPLEMENTED else log.info
                level("health stream failed, retrying", driver=client.driver, error=str(err))
            await asyncio.sleep(self.health_retry_period)
