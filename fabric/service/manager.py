"""``fabric-dra manager serve``: wires the parts together and runs them until SIGTERM.

Start-up order: HTTP listener (so probes answer at once; ``/readyz`` says why it is not ready yet),
ready file, then leadership — at once without ``--leader-elect``, else through the Lease. On
becoming leader the ledger is (re)loaded and a discovery pass reconciles it with the fabric before
the replica reports ready; on losing the Lease it stops touching the fabric immediately (every
mutation is fenced). On SIGTERM it stops accepting requests, releases the Lease, and logs out of the
Redfish service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl

from fabric.api.app import AppContext, build_app
from fabric.api.auth import (
    AllowAll,
    Authenticator,
    Chain,
    MetricsTokenFile,
    StaticTokens,
    TokenReviewAuthenticator,
    load_static_tokens,
)
from fabric.api.request_guard import server_refusal
from fabric.backends.discovery import Discovery
from fabric.backends.watch import InventoryWatch
from fabric.bindings.attachments import Attachments
from fabric.bindings.orphans import OrphanReconciler
from fabric.bindings.reconcile import ForeignBindings, Reconciler
from fabric.bindings.usage import (
    ConfigMapUsageStore,
    FileUsageStore,
    UsageMeter,
    UsageStore,
    usage_record_name,
)
from fabric.bindings.warm import WarmPool
from fabric.driver.operations import OperationDriver
from fabric.errors import ConfigError
from fabric.redfish.client import RedfishClient
from fabric.service.config import ManagerSettings
from fabric.state.claims import ClaimView
from fabric.state.inventory import Inventory
from fabric.state.ledger import ConfigMapLedgerStore, FileLedgerStore, Ledger, LedgerStore
from fabric.state.metrics import ManagerMetrics
from fabric.state.nodes import NodeResolver, load_node_map
from fabric.state.reports import PluginReports
from manager_api.errors import FabricError
from plumbing.httpserve import ConnectionLimits, HttpServer
from plumbing.kube.client import KubeClient, load_config
from plumbing.kube.events import EventRecorder
from plumbing.kube.leader import LeaderElector
from plumbing.logs import get_logger

__all__ = ["ManagerService"]

log = get_logger(__name__)


class ManagerService:
    def __init__(self, settings: ManagerSettings) -> None:
        self.settings = settings
        self._leading = False
        self._ledger_loaded = False
        self._elector: LeaderElector | None = None
        self._stop = asyncio.Event()
        self.url = ""

    def is_leader(self) -> bool:
        if not self._leading or not self._ledger_loaded:
            return False
        return self._elector is None or self._elector.is_leader

    def _not_ready(self, inventory: Inventory) -> str | None:
        # The same rule the API serves by (is_leader): a replica whose last renewal is older than
        # the renew deadline refuses writes, so it must not say it is ready either.
        if not self._leading or (self._elector is not None and not self._elector.is_leader):
            holder = self._elector.current_holder if self._elector else None
            return f"not the leader (leader: {holder or 'unknown'})"
        if not self._ledger_loaded:
            return "loading the ledger"
        if not inventory.loaded.is_set():
            err = inventory.last_error
            return "reading the fabric" + (f": {err.message}" if err else "")
        return None

    def _authenticator(self, kube: KubeClient | None, namespace: str) -> Chain:
        s = self.settings
        chain: list[Authenticator] = []
        if s.insecure_no_auth:
            log.warning("authentication is OFF (--insecure-no-auth): anyone may attach any device")
            chain.append(AllowAll())
        if s.static_tokens is not None:
            chain.append(StaticTokens(load_static_tokens(s.static_tokens)))
        if s.metrics_token_file is not None and not s.insecure_no_auth:
            chain.append(MetricsTokenFile(s.metrics_token_file))
        if kube is not None and not s.insecure_no_auth:
            chain.append(
                TokenReviewAuthenticator(
                    kube,
                    plugin_accounts=s.plugin_accounts or [f"{namespace}:fabric-dra-plugin"],
                    controller_accounts=s.controller_accounts or [f"{namespace}:fabric-dra-controller"],
                    operator_groups=s.operator_groups,
                    operator_users=s.operator_users,
                    audiences=s.token_audiences,
                )
            )
        return Chain(chain)

    async def run(self) -> int:
        s = self.settings
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)

        kube: KubeClient | None = None
        lease_client: KubeClient | None = None
        namespace = s.namespace or "default"
        if s.uses_kube:
            config = load_config(s.kubeconfig)
            kube = KubeClient(config)
            namespace = s.namespace or config.namespace

        metrics = ManagerMetrics()
        redfish = RedfishClient(s.redfish, observer=metrics.observe_redfish)
        discovery = Discovery(redfish, s.binding)
        resolver = NodeResolver(load_node_map(s.node_map) if s.node_map else None, kube)
        inventory = Inventory(fabric_name=s.fabric_name)
        watch = InventoryWatch(
            discovery,
            inventory,
            resolver,
            resync_seconds=s.resync_seconds,
            poll_seconds=s.poll_seconds,
            use_events=s.events,
        )
        store: LedgerStore
        usage_store: UsageStore  # beside the ledger, in a store of the same kind
        if s.ledger == "configmap":
            if kube is None:
                raise ConfigError("--ledger configmap needs Kubernetes API access")
            store = ConfigMapLedgerStore(kube, name=s.ledger_name, namespace=namespace)
            usage_store = ConfigMapUsageStore(
                kube, name=usage_record_name(s.ledger_name), namespace=namespace
            )
        else:
            if s.state_dir is None:
                raise ConfigError("--ledger file needs --state-dir")
            s.state_dir.mkdir(parents=True, exist_ok=True)
            store = FileLedgerStore(s.state_dir)
            usage_store = FileUsageStore(s.state_dir)
        ledger = Ledger(store, max_entries_per_node=s.max_bindings_per_node)
        inventory.follow(ledger)
        # One name for this replica in the Lease and in the Events it records.
        identity = s.identity or f"{socket.gethostname()}-{os.getpid()}"
        events = (
            EventRecorder(kube, controller="fabric-dra.io/manager", instance=identity)
            if kube is not None
            else None
        )
        driver = OperationDriver(
            inventory,
            ledger,
            discovery.backend_for,
            redfish,
            metrics=metrics,
            is_leader=self.is_leader,
            settings=s.binder,
            events=events,
        )
        warm = WarmPool(s.warm, inventory, ledger, driver, metrics=metrics)
        driver.records.attach_observers.append(warm.attached)
        claims = ClaimView(kube) if kube is not None else None
        if claims is None:
            log.info("no Kubernetes API access: attaches are not checked against ResourceClaims")
        attachments = Attachments(inventory, ledger, driver, warm=warm, claims=claims)
        reconciler = Reconciler(inventory, ledger, driver)
        watch.after_refresh.append(reconciler.reconcile)
        metrics.watch_inventory(
            inventory.snapshot, lambda: inventory.loaded.is_set() and inventory.last_error is None
        )
        metrics.is_leader.set_function(lambda: 1.0 if self.is_leader() else 0.0)
        watch.after_refresh.append(ForeignBindings(inventory.snapshot).check)
        reports = PluginReports(ttl=s.plugin_report_ttl_seconds)
        orphans: OrphanReconciler | None = None
        usage = UsageMeter(
            ledger,
            inventory,
            usage_store,
            claims=claims,
            orphans_in_grace=lambda: orphans.in_grace() if orphans else 0,
        )
        metrics.watch_usage(lambda: usage.tick() if self.is_leader() else None, usage.totals, usage.stranded)
        app = build_app(
            AppContext(
                inventory=inventory,
                attachments=attachments,
                operations=driver.operations,
                reports=reports,
                auth=self._authenticator(kube, namespace),
                metrics=metrics,
                is_leader=self.is_leader,
                not_ready=lambda: self._not_ready(inventory),
                usage=usage,
            )
        )

        server = HttpServer(
            app,
            host=s.host,
            port=s.port,
            backlog=512,
            tls_cert=s.tls_cert,
            tls_key=s.tls_key,
            # The service handles SIGTERM itself: it must release the Lease and the Redfish
            # session before the process ends.
            handle_signals=False,
            lifespan="off",
            ssl_cert_reqs=ssl.CERT_NONE,
            timeout_graceful_shutdown=5,
            error_body=server_refusal,
            limits=ConnectionLimits(max_connections=s.max_connections),
        )
        self.url = server.url
        await server.start(s.ready_file)
        tasks = [server.serving]
        log.info(
            "fabric manager listening", url=self.url, redfish=s.redfish.base_url, ledger=store.describe()
        )

        async def on_leadership(leading: bool) -> None:
            if not leading:
                self._leading = False
                self._ledger_loaded = False
                await usage.pause()  # what was counted is written (fenced: refused once another leads)
                return
            self._leading = True
            while self._leading and not self._ledger_loaded:
                try:
                    await ledger.load()
                    self._ledger_loaded = True
                except FabricError as err:
                    log.error("cannot load the ledger, retrying", error=err.message)
                    await asyncio.sleep(2.0)
            if self._ledger_loaded:
                # The record after the ledger: its countedUntil is where the ledger's entries start
                # to be counted again. Accounting never holds up binding: a record that cannot be
                # read is retried by the usage loop.
                await usage.try_resume()
            watch.request_refresh()
            with contextlib.suppress(FabricError):
                if inventory.loaded.is_set():
                    await reconciler.reconcile()

        tasks.append(asyncio.create_task(watch.run(), name="inventory"))
        if kube is not None:
            tasks.append(asyncio.create_task(resolver.watch(watch.remap_nodes), name="node-watch"))
        if claims is not None:
            tasks.append(asyncio.create_task(claims.run(), name="claims"))
        tasks.append(asyncio.create_task(reconciler.run(), name="reconciler"))
        warm_task = asyncio.create_task(warm.run(), name="warm-pool")
        tasks.append(warm_task)
        tasks.append(asyncio.create_task(usage.run(self.is_leader), name="usage"))
        if kube is not None and s.orphan_grace_seconds > 0:
            orphans = OrphanReconciler(
                kube,
                attachments,
                grace_seconds=s.orphan_grace_seconds,
                interval=s.orphan_interval_seconds,
                reports=reports,
                metrics=metrics,
                events=events,
            )
            tasks.append(asyncio.create_task(orphans.run(), name="orphans"))
        elif s.orphan_grace_seconds > 0:
            log.info("no Kubernetes API access: orphaned bindings are not detached (claims cannot be read)")
        if s.leader_elect:
            if kube is None:
                raise ConfigError("--leader-elect needs Kubernetes API access")
            if s.ledger == "file":
                log.warning(
                    "--leader-elect with a ledger file: replicas share it only if --state-dir is shared "
                    "storage; use --ledger configmap",
                    ledger=store.describe(),
                )
            # The Lease gets a connection pool of its own: the ledger's load reads its 256 shards
            # at once through the shared client, and a renewal queued behind them on a busy API
            # server missed the renew deadline 2 s after the replica became leader (it stepped
            # down while its /readyz had just said ready).
            lease_client = KubeClient(kube.config, max_connections=2)
            self._elector = LeaderElector(
                lease_client,
                name=s.lease_name,
                namespace=namespace,
                identity=identity,
                lease_duration=s.lease_duration,
                renew_deadline=s.renew_deadline,
                retry_period=s.retry_period,
                on_change=on_leadership,
            )
            tasks.append(asyncio.create_task(self._elector.run(), name="leader-election"))
        else:
            await on_leadership(True)

        stop = asyncio.create_task(self._stop.wait())
        # The warm pool's task ends early only to refuse its policy (a model the fabric lacks).
        await asyncio.wait([stop, tasks[0], warm_task], return_when=asyncio.FIRST_COMPLETED)
        log.info("fabric manager stopping")
        await inventory.release_waiters()
        if self._ledger_loaded:
            # Outcomes written in the background, and the seconds counted, reach the store before
            # the Lease is given up.
            with contextlib.suppress(FabricError):
                await ledger.commit()
            await usage.pause()
        server.stop()
        for task in tasks[1:]:
            task.cancel()
        for task in tasks:
            # Python 3.11's wait_for loses a cancellation that races the completion of what it
            # waits for (the inventory's refresh event, set by a stream connecting at that
            # moment; python/cpython#86296): cancel again until the task ends.
            while task is not tasks[0] and not task.done():
                await asyncio.wait([task], timeout=1.0)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        server.listener.close()
        stop.cancel()
        await redfish.aclose()
        if kube is not None:
            await kube.aclose()
        if lease_client is not None:
            await lease_client.aclose()
        if warm_task.done() and not warm_task.cancelled() and warm_task.exception() is not None:
            raise ConfigError(str(warm_task.exception()))
        return 0
