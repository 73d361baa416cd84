"""Run the plugin: load and reconcile state, serve the DRA socket, then register with the kubelet.

Order matters: the DRA services must answer before the kubelet learns the endpoint, so the
registration socket appears last; on SIGTERM it disappears first (the kubelet deregisters the
plugin) and the DRA socket is removed after in-flight calls finished.

The metrics port comes up first and carries the kubelet's probes (:mod:`.probes`): not ready
until the checkpoint is loaded and the kubelet accepted the registration, not live while either
gRPC server stops answering on its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from pathlib import Path

import grpc

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin.backend import DeviceBackend, FabricBackend, NoopBackend
from dra_driver.plugin.checkpoint import CheckpointCorrupt, CheckpointStore
from dra_driver.plugin.claims import ClaimReader, ClaimSource
from dra_driver.plugin.claimstatus import ClaimStatusWriter
from dra_driver.plugin.config import DeviceBackendKind, HostMode, PluginConfig, socket_path_problem
from dra_driver.plugin.driver import Driver, dra_servicers
from dra_driver.plugin.health import HealthMonitor, health_servicer
from dra_driver.plugin.hostdev import HostScanner, SysfsChanges
from dra_driver.plugin.hostmemory import HostMemory
from dra_driver.plugin.linkhealth import LinkJudge
from dra_driver.plugin.metrics import MetricsServer, serve_metrics
from dra_driver.plugin.nvml import NvmlPartitioner
from dra_driver.plugin.partitioner import EmulatedPartitioner, Partitioner
from dra_driver.plugin.probes import Phase, PluginProbes
from dra_driver.plugin.reconcile import reconcile
from dra_driver.plugin.registration import RegistrationServicer, add_registration_servicer
from dra_driver.plugin.report import PreparedReporter
from dra_driver.plugin.routes import RoutedBackend
from dra_driver.plugin.state import ClaimLocks
from plumbing.fsutil import atomic_write
from plumbing.logs import get_logger

__all__ = ["PluginError", "PluginServer", "serve"]

log = get_logger(__name__)


class PluginError(KubeletPluginError):
    """A startup failure the operator can act on (one line)."""


def _listen(server: grpc.aio.Server, path: Path, flag: str) -> None:
    """Bind ``server`` to the unix socket ``path``; grpc's bind failure as one line."""
    try:
        server.add_insecure_port(f"unix://{path}")
    except RuntimeError as err:
        raise PluginError(f"cannot listen on {path}: {err}; check {flag}") from None


def _remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class PluginServer:
    """The running plugin: both gRPC servers, the driver, the health monitor."""

    def __init__(
        self,
        config: PluginConfig,
        *,
        claims: ClaimSource | None = None,
        backend: DeviceBackend | None = None,
    ) -> None:
        self.config = config
        self._claims_override = claims
        self._backend_override = backend
        self._closers: list[object] = []
        self.stopped = asyncio.Event()
        self.exit_code = 0
        self.dra_server: grpc.aio.Server | None = None
        self.reg_server: grpc.aio.Server | None = None
        self.registration: RegistrationServicer | None = None
        self.driver: Driver | None = None
        self.health: HealthMonitor | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._reporters: list[asyncio.Task[None]] = []
        self._metrics: MetricsServer | None = None
        self.probes = PluginProbes(
            dra_socket=config.dra_socket,
            registration_socket=config.registration_socket,
            registration=lambda: self.registration.status if self.registration is not None else None,
        )
        self._kube: object | None = None
        self.status_writer: ClaimStatusWriter | None = None
        self.backend: DeviceBackend | None = None
        self.store: CheckpointStore | None = None
        self.locks: ClaimLocks | None = None

    def _backend(self) -> tuple[DeviceBackend, HostScanner | None]:
        cfg = self.config
        if self._backend_override is not None:
            return self._backend_override, None
        if cfg.device_backend is DeviceBackendKind.NOOP:
            return NoopBackend(cfg.node_name), None
        from manager_api.client import ManagerClient

        endpoints = cfg.endpoints()
        if not endpoints:
            raise ValueError("the plugin needs --manager-url (or --noop-fabric)")
        real = cfg.host_mode is HostMode.REAL
        changes = SysfsChanges()
        if real:
            changes.start_udev()
        scanner = HostScanner(cfg.sysfs_root, real_host=real, pci_rescan=cfg.pci_rescan, changes=changes)
        # a real host's GPUs are partitioned through NVML (imported on the first partition), an
        # emulated host's in its tree
        partitioner: Partitioner = NvmlPartitioner() if real else EmulatedPartitioner(cfg.sysfs_root)
        memory = HostMemory(cfg.sysfs_root, real_host=real)
        backends = [
            (
                endpoint,
                FabricBackend(
                    ManagerClient(
                        endpoint.url,
                        token_file=endpoint.token_file,
                        ca_file=str(endpoint.ca_file) if endpoint.ca_file else None,
                    ),
                    scanner,
                    node=cfg.node_name,
                    visible_timeout=cfg.visible_timeout,
                    host_removal=cfg.host_removal,
                    retry_budget=cfg.attach_retry_seconds,
                    partitioner=partitioner,
                    memory=memory,
                ),
            )
            for endpoint in endpoints
        ]
        if len(backends) == 1 and not cfg.managers:
            return backends[0][1], scanner
        return RoutedBackend(backends, node=cfg.node_name), scanner

    def _start_reporters(self, backend: DeviceBackend, store: CheckpointStore) -> None:
        """Tell each manager which claims this node has prepared: with several, each of its own
        pools' devices."""
        cfg = self.config
        reporters: list[PreparedReporter] = []
        if isinstance(backend, FabricBackend):
            reporters.append(
                PreparedReporter(backend.client, store, node=cfg.node_name, interval=cfg.report_seconds)
            )
        elif isinstance(backend, RoutedBackend):
            for endpoint in cfg.endpoints():

                def keep(pool: str, manager: str = endpoint.name) -> bool:
                    return backend.owner_of(pool) in (manager, None)

                client = backend.backend_of(endpoint.name).client
                reporters.append(
                    PreparedReporter(
                        client, store, node=cfg.node_name, interval=cfg.report_seconds, keep=keep
                    )
                )
        self._reporters = [
            asyncio.create_task(r.run(), name=f"prepared-claims-report-{i}") for i, r in enumerate(reporters)
        ]

    async def _claims(self) -> ClaimSource:
        if self._claims_override is not None:
            return self._claims_override
        from plumbing.kube import KubeClient, load_config

        try:
            kube_config = await asyncio.to_thread(load_config, self.config.kubeconfig)
        except Exception as err:
            raise PluginError(
                f"cannot load the Kubernetes client configuration ({err}); pass --kubeconfig or run in a pod"
            ) from err
        kube = KubeClient(kube_config, user_agent=f"fabric-dra-plugin/{self.config.node_name}")
        self._kube = kube
        if self.config.claim_status:
            self.status_writer = ClaimStatusWriter(
                kube,
                driver=self.config.driver_name,
                node=self.config.node_name,
                version=lambda: reader.version,
            )
        reader = ClaimReader(kube, on_read=self.status_writer.seen if self.status_writer else None)
        return reader

    async def start(self) -> None:
        """Come up in the order the kubelet needs: directories, probes, the record of prepared
        claims (repaired against the CDI specs and the fabric), the DRA services, registration."""
        cfg = self.config
        self._prepare_directories()
        self._serve_probes()
        backend, scanner = self._backend()
        self.backend = backend
        claims = await self._claims()
        store = await self._load_checkpoint(backend, scanner)
        self.locks = ClaimLocks(cfg.lock_file)
        links = LinkJudge(
            hold_seconds=cfg.link_hold_seconds,
            recover_seconds=cfg.link_recover_seconds,
            correctable_per_minute=cfg.link_correctable_per_minute,
        )
        self.driver = Driver(
            cfg,
            store=store,
            locks=self.locks,
            backend=backend,
            claims=claims,
            status=self.status_writer,
            links=links,
        )
        self.health = HealthMonitor(
            backend, store, node=cfg.node_name, scanner=scanner, links=links, status=self.status_writer
        )
        self.driver.health = self.health
        self.health.start()
        await self._serve_dra(self.driver, self.health)
        self.probes.phase = Phase.SERVING
        if cfg.ready_file is not None:
            atomic_write(cfg.ready_file, f"{cfg.dra_socket}\n", durable=False)
        self._watchdog = asyncio.create_task(self._watch(), name="registration-watchdog")
        self._start_reporters(backend, store)
        log.info(
            "plugin serving",
            driver=cfg.driver_name,
            node=cfg.node_name,
            dra_socket=str(cfg.dra_socket),
            registration_socket=str(cfg.registration_socket),
            backend=backend.name,
            host_mode=cfg.host_mode.value,
            claims=len(store.claims()),
        )

    def _prepare_directories(self) -> None:
        cfg = self.config
        problem = socket_path_problem(cfg)
        if problem is not None:
            raise PluginError(problem)
        for directory in (cfg.plugin_dir, cfg.registry_dir, cfg.cdi_root):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise PluginError(f"cannot create directory {directory}: {err.strerror}") from err

    def _serve_probes(self) -> None:
        """First, so that probes and scrapes are answered (503 "starting") while state is loaded."""
        cfg = self.config
        if cfg.metrics_port is None:
            return
        self._metrics = serve_metrics(cfg.metrics_host, cfg.metrics_port, probes=self.probes)
        log.info(
            "serving metrics and probes",
            address=f"http://{cfg.metrics_host}:{self._metrics.port}",
            paths="/metrics /healthz /readyz",
        )

    async def _load_checkpoint(self, backend: DeviceBackend, scanner: HostScanner | None) -> CheckpointStore:
        """The record of prepared claims, reconciled; a corrupt one is moved aside and rebuilt."""
        cfg = self.config
        store = CheckpointStore(cfg.checkpoint_file, driver=cfg.driver_name, node=cfg.node_name)
        rebuild = False
        try:
            store.load()
        except CheckpointCorrupt as err:
            moved = store.quarantine()
            log.error(
                "checkpoint is corrupt; moved aside and rebuilding it from the CDI specs and the fabric",
                error=str(err),
                quarantined=str(moved),
            )
            rebuild = True
        self.store = store
        await reconcile(
            store,
            backend,
            cdi_root=cfg.cdi_root,
            driver=cfg.driver_name,
            real_host=cfg.host_mode is HostMode.REAL,
            scanner=scanner,
            rebuild=rebuild,
            node=cfg.node_name,
            partitioner=backend.partitioner if isinstance(backend, FabricBackend | RoutedBackend) else None,
            hook_path=cfg.cdi_hook_path,
        )
        return store

    async def _serve_dra(self, driver: Driver, health: HealthMonitor) -> None:
        """DRA services first: the kubelet may call them as soon as registration names the endpoint."""
        cfg = self.config
        _remove_socket(cfg.dra_socket)
        self.dra_server = grpc.aio.server()
        services = dra_servicers(driver, self.dra_server) + health_servicer(health, self.dra_server)
        _listen(self.dra_server, cfg.dra_socket, "--plugin-dir")
        await self.dra_server.start()
        self.registration = RegistrationServicer(cfg.driver_name, str(cfg.dra_socket), services)
        await self._start_registration()

    async def _start_registration(self) -> None:
        if self.registration is None:
            raise RuntimeError("the registration server was not built before it was started")
        path = self.config.registration_socket
        _remove_socket(path)  # only our own name: never another plugin's socket
        server = grpc.aio.server()
        add_registration_servicer(self.registration, server)
        _listen(server, path, "--registry-dir")
        await server.start()
        self.reg_server = server

    async def _watch(self) -> None:
        """Exit when the kubelet keeps rejecting us; re-create a registration socket that vanished."""
        if self.registration is None:
            raise RuntimeError("the registration server was not built before it was watched")
        while True:
            await asyncio.sleep(1.0)
            status = self.registration.status
            if status.rejected_for(time.monotonic()) > self.config.registration_timeout:
                log.error(
                    "the kubelet has rejected the registration for too long; exiting so the pod restarts",
                    kubelet_error=status.last_error,
                    timeout_seconds=self.config.registration_timeout,
                )
                self.exit_code = 1
                self.stopped.set()
                return
            if not self.config.registration_socket.exists():
                log.warning(
                    "registration socket vanished, re-created", path=str(self.config.registration_socket)
                )
                if self.reg_server is not None:
                    await self.reg_server.stop(None)
                await self._start_registration()

    @property
    def metrics_port(self) -> int | None:
        """The port of /metrics and the probes (the real one when --metrics-port is 0)."""
        return self._metrics.port if self._metrics is not None else None

    async def stop(self) -> None:
        cfg = self.config
        self.probes.phase = Phase.STOPPING
        for task in (self._watchdog, *self._reporters):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.reg_server is not None:
            await self.reg_server.stop(None)
        _remove_socket(cfg.registration_socket)
        if self.dra_server is not None:
            await self.dra_server.stop(grace=5.0)
        _remove_socket(cfg.dra_socket)
        if self.driver is not None:
            await self.driver.inflight.cancel_all()
        if self.store is not None:
            await self.store.commit()
        if self.health is not None:
            await self.health.stop()
        if self.backend is not None:
            with contextlib.suppress(Exception):
                await self.backend.aclose()
        if self.status_writer is not None:
            with contextlib.suppress(Exception):
                # what is said by now is written; a claim still being written gets it on restart
                await asyncio.wait_for(self.status_writer.flush(), timeout=2.0)
            await self.status_writer.aclose()
        if self._kube is not None:
            with contextlib.suppress(Exception):
                await self._kube.aclose()  # type: ignore[attr-defined]
        if self.locks is not None:
            self.locks.close()
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.close)
        if cfg.ready_file is not None:
            with contextlib.suppress(FileNotFoundError):
                cfg.ready_file.unlink()
        log.info("plugin stopped", driver=cfg.driver_name, node=cfg.node_name)


async def serve(config: PluginConfig) -> int:
    server = PluginServer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopped.set)
    try:
        await server.start()
        # What start-up built (modules, classes, the checkpoint, the clients) lives as long as the
        # process: kept out of the collector's generations, a full collection no longer walks it
        # each time the claims' garbage triggers one (8 % of a plugin's CPU at ten nodes, issue 37).
        gc.collect()
        gc.freeze()
        await server.stopped.wait()
    finally:
        await server.stop()
    return server.exit_code
