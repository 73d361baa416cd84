"""``fabric-dra manager serve``: builds the parts (:mod:`fabric.service.wiring`) and runs them until
SIGTERM.

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
import signal
import ssl

from fastapi import FastAPI

from fabric.api.request_guard import server_refusal
from fabric.errors import ConfigError
from fabric.service.config import ManagerSettings
from fabric.service.wiring import ManagerParts, build_parts
from fabric.state.inventory import Inventory
from manager_api.errors import FabricError
from plumbing.httpserve import ConnectionLimits, HttpServer
from plumbing.kube.client import KubeClient, load_config
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
        self._lease_client: KubeClient | None = None
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

    async def run(self) -> int:
        """Serve until SIGTERM (or until the warm pool refuses its policy): listen, run every
        loop, lead, then shut down in order."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        kube, namespace = self._kube()
        parts = build_parts(
            self.settings, kube, namespace, is_leader=self.is_leader, not_ready=self._not_ready
        )
        server = self._server(parts.app)
        self.url = server.url
        await server.start(self.settings.ready_file)
        log.info(
            "fabric manager listening",
            url=self.url,
            redfish=self.settings.redfish.base_url,
            ledger=parts.store.describe(),
        )
        loops, warm_task = self._start_loops(parts, kube)
        tasks = [server.serving, *loops]
        await self._lead(parts, kube, namespace, tasks)
        stop = asyncio.create_task(self._stop.wait())
        # The warm pool's task ends early only to refuse its policy (a model the fabric lacks).
        await asyncio.wait([stop, server.serving, warm_task], return_when=asyncio.FIRST_COMPLETED)
        await self._shut_down(parts, server, tasks)
        stop.cancel()
        await parts.redfish.aclose()
        for client in (kube, self._lease_client):
            if client is not None:
                await client.aclose()
        if warm_task.done() and not warm_task.cancelled() and warm_task.exception() is not None:
            raise ConfigError(str(warm_task.exception()))
        return 0

    def _kube(self) -> tuple[KubeClient | None, str]:
        """The Kubernetes API client (None without API access) and the namespace to work in."""
        s = self.settings
        if not s.uses_kube:
            return None, s.namespace or "default"
        config = load_config(s.kubeconfig)
        return KubeClient(config), s.namespace or config.namespace

    def _server(self, app: FastAPI) -> HttpServer:
        s = self.settings
        return HttpServer(
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

    def _start_loops(
        self, parts: ManagerParts, kube: KubeClient | None
    ) -> tuple[list[asyncio.Task[None]], asyncio.Task[None]]:
        """Every loop of the replica, started: the inventory's watch, the node and claim watches,
        the reconciler, the warm pool (also returned alone), the accounting, the orphan reconciler."""
        loops = [asyncio.create_task(parts.watch.run(), name="inventory")]
        if kube is not None:
            loops.append(
                asyncio.create_task(parts.watch.resolver.watch(parts.watch.remap_nodes), name="node-watch")
            )
        if parts.holders.claims is not None:
            loops.append(asyncio.create_task(parts.holders.claims.run(), name="claims"))
        loops.append(asyncio.create_task(parts.holders.reconciler.run(), name="reconciler"))
        warm = asyncio.create_task(parts.holders.warm.run(), name="warm-pool")
        loops.append(warm)
        loops.append(asyncio.create_task(parts.usage.run(self.is_leader), name="usage"))
        if parts.budgets is not None:
            loops.append(asyncio.create_task(parts.budgets.gate.view.run(), name="budgets"))
            loops.append(asyncio.create_task(parts.budgets.run(self.is_leader), name="budget-status"))
        if parts.holders.orphans is not None:
            loops.append(asyncio.create_task(parts.holders.orphans.run(), name="orphans"))
        elif self.settings.orphan_grace_seconds > 0:
            log.info("no Kubernetes API access: orphaned bindings are not detached (claims cannot be read)")
        if parts.holders.orphaned_trees is not None:
            loops.append(asyncio.create_task(parts.holders.orphaned_trees.run(), name="orphaned-trees"))
        return loops, warm

    async def _lead(
        self, parts: ManagerParts, kube: KubeClient | None, namespace: str, tasks: list[asyncio.Task[None]]
    ) -> None:
        """Lead at once, or (``--leader-elect``) run for the Lease in a task of its own."""
        s = self.settings

        async def on_leadership(leading: bool) -> None:
            await self._leadership_changed(parts, leading)

        if not s.leader_elect:
            await on_leadership(True)
            return
        if kube is None:
            raise ConfigError("--leader-elect needs Kubernetes API access")
        if s.ledger == "file":
            log.warning(
                "--leader-elect with a ledger file: replicas share it only if --state-dir is shared "
                "storage; use --ledger configmap",
                ledger=parts.store.describe(),
            )
        # The Lease gets a connection pool of its own: the ledger's load reads its 256 shards
        # at once through the shared client, and a renewal queued behind them on a busy API
        # server missed the renew deadline 2 s after the replica became leader (it stepped
        # down while its /readyz had just said ready).
        self._lease_client = KubeClient(kube.config, max_connections=2)
        self._elector = LeaderElector(
            self._lease_client,
            name=s.lease_name,
            namespace=namespace,
            identity=parts.identity,
            lease_duration=s.lease_duration,
            renew_deadline=s.renew_deadline,
            retry_period=s.retry_period,
            on_change=on_leadership,
        )
        tasks.append(asyncio.create_task(self._elector.run(), name="leader-election"))

    async def _leadership_changed(self, parts: ManagerParts, leading: bool) -> None:
        """Leading: load the ledger (retried until it reads), resume the accounting, and reconcile
        with the fabric. No longer leading: stop at once (every mutation is fenced), and write what
        was counted."""
        if not leading:
            self._leading = False
            self._ledger_loaded = False
            await parts.usage.pause()  # what was counted is written (fenced: refused once another leads)
            return
        self._leading = True
        while self._leading and not self._ledger_loaded:
            try:
                await parts.ledger.load()
                await parts.drains.load()
                self._ledger_loaded = True
            except FabricError as err:
                log.error("cannot load the ledger, retrying", error=err.message)
                await asyncio.sleep(2.0)
        if self._ledger_loaded:
            # The record after the ledger: its countedUntil is where the ledger's entries start
            # to be counted again. Accounting never holds up binding: a record that cannot be
            # read is retried by the usage loop.
            await parts.usage.try_resume()
        # What the ledger is reconciled against is who is bound: a bindings-only pass (a full
        # one when none has run yet). A full pass asked for here landed, at a start, while the
        # first pass still ran, and read the whole fabric again right after /readyz.
        parts.watch.request_refresh(bindings_only=True)
        with contextlib.suppress(FabricError):
            if parts.inventory.loaded.is_set():
                await parts.holders.reconciler.reconcile()

    async def _shut_down(
        self, parts: ManagerParts, server: HttpServer, tasks: list[asyncio.Task[None]]
    ) -> None:
        """Answer the long polls, write what is pending while still leader, stop listening, and end
        every loop (``tasks[0]`` is the server's own)."""
        log.info("fabric manager stopping")
        await parts.inventory.release_waiters()
        if self._ledger_loaded:
            # Outcomes written in the background, and the seconds counted, reach the store before
            # the Lease is given up.
            with contextlib.suppress(FabricError):
                await parts.ledger.commit()
            await parts.usage.pause()
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
