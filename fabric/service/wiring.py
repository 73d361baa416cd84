"""The manager's parts, built from its settings and wired together: who is handed what.

Only the operation driver is handed the backends (``Discovery.backend_for``) and the Redfish task
control; the attach/detach front, the warm pool and the reconciler are handed the driver. The
inventory follows the ledger (each device shows its holder and operation), and every discovery pass
is followed by the reconciler and by the report of bindings made outside fabric-dra.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI

from fabric.api.app import build_app
from fabric.api.auth import (
    AllowAll,
    Authenticator,
    Chain,
    MetricsTokenFile,
    StaticTokens,
    TokenReviewAuthenticator,
    load_static_tokens,
)
from fabric.api.context import AppContext
from fabric.backends.discovery import Discovery
from fabric.backends.watch import InventoryWatch
from fabric.bindings.attachments import Attachments
from fabric.bindings.attribution import Attribution, attributed_seconds, load_price_list
from fabric.bindings.budget_status import BudgetStatus
from fabric.bindings.budgets import BudgetGate
from fabric.bindings.orphan_trees import OrphanedTrees
from fabric.bindings.orphans import OrphanReconciler
from fabric.bindings.reconcile import ForeignBindings, Reconciler
from fabric.bindings.trees import KindPaths, OwnerChains, TreeRootLabel
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
from fabric.state.budgets import BudgetView
from fabric.state.claims import ClaimView
from fabric.state.drains import ConfigMapDrainStore, DrainBook, DrainStore, FileDrainStore, drain_record_name
from fabric.state.inventory import Inventory
from fabric.state.ledger import ConfigMapLedgerStore, FileLedgerStore, Ledger, LedgerStore
from fabric.state.metrics import ManagerMetrics
from fabric.state.nodes import NodeResolver, load_node_map
from fabric.state.reports import PluginReports
from plumbing.kube.client import KubeClient
from plumbing.kube.events import EventRecorder
from plumbing.logs import get_logger

__all__ = ["Holders", "ManagerParts", "build_parts"]

log = get_logger(__name__)


@dataclass
class ManagerParts:
    """Every part of one manager replica, wired."""

    redfish: RedfishClient
    inventory: Inventory
    watch: InventoryWatch
    store: LedgerStore
    ledger: Ledger
    driver: OperationDriver
    holders: Holders
    usage: UsageMeter
    app: FastAPI
    #: the operators' drains, loaded with the ledger
    drains: DrainBook
    #: this replica's name in the Lease and in the Events it records
    identity: str
    #: the DeviceBudgets and their status writer; None without Kubernetes API access
    budgets: BudgetStatus | None = None


def build_parts(
    s: ManagerSettings,
    kube: KubeClient | None,
    namespace: str,
    *,
    is_leader: Callable[[], bool],
    not_ready: Callable[[Inventory], str | None],
) -> ManagerParts:
    """The parts of a replica whose leadership ``is_leader`` tells, and whose readiness
    ``not_ready`` judges from its inventory; nothing runs yet."""
    metrics = ManagerMetrics()
    redfish = RedfishClient(s.redfish, observer=metrics.observe_redfish)
    discovery = Discovery(redfish, s.binding)
    history = {"history_versions": s.change_history_versions, "history_devices": s.change_history_devices}
    inventory = Inventory(fabric_name=s.fabric_name, **history)
    watch = InventoryWatch(
        discovery,
        inventory,
        NodeResolver(load_node_map(s.node_map) if s.node_map else None, kube),
        resync_seconds=s.resync_seconds,
        poll_seconds=s.poll_seconds,
        use_events=s.events,
    )
    store, usage_store = _stores(s, kube, namespace)
    ledger = Ledger(store, max_entries_per_node=s.max_bindings_per_node)
    inventory.follow(ledger)
    drains = DrainBook(_drain_store(s, kube, namespace))
    inventory.follow_drains(drains.drain_of, lambda: drains.version)
    drains.listeners.append(inventory.changed)
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
        is_leader=is_leader,
        settings=s.binder,
        events=events,
    )
    holders = _holders(s, kube, inventory, ledger, driver, metrics, events)
    watch.after_refresh.append(holders.reconciler.reconcile_changes)
    watch.after_refresh.append(ForeignBindings(inventory.facts).check)
    usage = _usage(s, ledger, inventory, usage_store, holders)
    budgets = _budgets(kube, holders, ledger, inventory, usage, events, metrics)
    _watch_metrics(metrics, inventory, usage, is_leader)
    app = build_app(
        AppContext(
            inventory=inventory,
            attachments=holders.attachments,
            operations=driver.operations,
            reports=holders.reports,
            auth=_authenticator(s, kube, namespace),
            metrics=metrics,
            is_leader=is_leader,
            not_ready=lambda: not_ready(inventory),
            usage=usage,
            drains=drains,
            orphaned_trees=holders.orphaned_trees.findings if holders.orphaned_trees is not None else None,
            budgets=budgets,
        )
    )
    return ManagerParts(
        redfish, inventory, watch, store, ledger, driver, holders, usage, app, drains, identity, budgets
    )


def _usage(
    s: ManagerSettings, ledger: Ledger, inventory: Inventory, store: UsageStore, holders: Holders
) -> UsageMeter:
    """The device-seconds accounting, attributed by the claims' labels the settings name."""
    return UsageMeter(
        ledger,
        inventory,
        store,
        claims=holders.claims,
        orphans_in_grace=holders.orphans.in_grace if holders.orphans is not None else lambda: 0,
        attribution=Attribution(
            keys=tuple(dict.fromkeys(s.attribution_labels)),
            values_max=s.attribution_values_max,
            prices=load_price_list(s.price_list) if s.price_list is not None else None,
        ),
    )


def _budgets(
    kube: KubeClient | None,
    holders: Holders,
    ledger: Ledger,
    inventory: Inventory,
    usage: UsageMeter,
    events: EventRecorder | None,
    metrics: ManagerMetrics,
) -> BudgetStatus | None:
    """DeviceBudgets checked at every new hold and their status written (docs/budgets.md); none
    without Kubernetes API access, where there are no budgets and no claims to find trees of."""
    if kube is None or holders.claims is None:
        log.info("no Kubernetes API access: no DeviceBudget is read or enforced")
        metrics.watch_budgets(list)  # the families are there, empty: dashboards and alerts find them
        return None
    gate = BudgetGate(
        BudgetView(kube),
        holders.claims,
        ledger,
        inventory,
        partition=holders.attachments.sharing.partition,
        roots=OwnerChains((holders.kinds or KindPaths(kube)).fetch),
        usage=usage,
        events=events,
        metrics=metrics,
    )
    holders.attachments.use_budgets(gate)
    status = BudgetStatus(gate, kube)
    metrics.watch_budgets(status.rows)
    return status


@dataclass
class Holders:
    """Who decides which device is whose, each handed the operation driver."""

    warm: WarmPool
    #: the cluster's ResourceClaims an attach must match; None without Kubernetes API access
    claims: ClaimView | None
    attachments: Attachments
    reconciler: Reconciler
    #: what each node's plugin reports as prepared
    reports: PluginReports
    #: None without Kubernetes API access, or with the grace period 0 (orphans are never detached)
    orphans: OrphanReconciler | None
    #: claims of agent trees whose root is gone; None without Kubernetes API access or when off
    orphaned_trees: OrphanedTrees | None = None
    #: the owner kinds' paths, read once from discovery for every owner-chain walk (budgets, orphans)
    kinds: KindPaths | None = None


def _holders(
    s: ManagerSettings,
    kube: KubeClient | None,
    inventory: Inventory,
    ledger: Ledger,
    driver: OperationDriver,
    metrics: ManagerMetrics,
    events: EventRecorder | None,
) -> Holders:
    warm = WarmPool(s.warm, inventory, ledger, driver, metrics=metrics)
    driver.records.attach_observers.append(warm.attached)
    claims = ClaimView(kube) if kube is not None else None
    if claims is None:
        log.info("no Kubernetes API access: attaches are not checked against ResourceClaims")
    attachments = Attachments(inventory, ledger, driver, warm=warm, claims=claims)
    reports = PluginReports(ttl=s.plugin_report_ttl_seconds)
    orphans = None
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
    trees = None
    kinds = KindPaths(kube) if kube is not None else None
    if kinds is not None and claims is not None and s.orphaned_trees != "off":
        trees = OrphanedTrees(
            attachments,
            claims,
            kinds.fetch,
            reports,
            policy=s.orphaned_trees,
            grace_seconds=s.orphaned_tree_grace_seconds,
            interval=s.orphan_interval_seconds,
            root_label=TreeRootLabel.parse(s.tree_root_label) if s.tree_root_label else None,
            metrics=metrics,
            events=events,
        )
    return Holders(
        warm,
        claims,
        attachments,
        Reconciler(inventory, ledger, driver, chunk_grace=s.orphan_grace_seconds),
        reports,
        orphans,
        trees,
        kinds,
    )


def _stores(s: ManagerSettings, kube: KubeClient | None, namespace: str) -> tuple[LedgerStore, UsageStore]:
    """Where the ledger is kept, and the usage record beside it, in a store of the same kind."""
    if s.ledger == "configmap":
        if kube is None:
            raise ConfigError("--ledger configmap needs Kubernetes API access")
        return (
            ConfigMapLedgerStore(kube, name=s.ledger_name, namespace=namespace),
            ConfigMapUsageStore(kube, name=usage_record_name(s.ledger_name), namespace=namespace),
        )
    if s.state_dir is None:
        raise ConfigError("--ledger file needs --state-dir")
    s.state_dir.mkdir(parents=True, exist_ok=True)
    return FileLedgerStore(s.state_dir), FileUsageStore(s.state_dir)


def _drain_store(s: ManagerSettings, kube: KubeClient | None, namespace: str) -> DrainStore:
    """Where the drains are kept: beside the ledger, in a store of the same kind (``_stores`` checked
    that the settings allow it)."""
    if s.ledger == "configmap" and kube is not None:
        return ConfigMapDrainStore(kube, name=drain_record_name(s.ledger_name), namespace=namespace)
    if s.state_dir is None:
        raise ConfigError("--ledger file needs --state-dir")
    return FileDrainStore(s.state_dir)


def _watch_metrics(
    metrics: ManagerMetrics, inventory: Inventory, usage: UsageMeter, is_leader: Callable[[], bool]
) -> None:
    """The gauges read at each scrape: the pool, the fabric's reachability, leadership, usage."""
    metrics.watch_inventory(
        inventory.facts,
        lambda: inventory.version,
        lambda: inventory.loaded.is_set() and inventory.last_error is None,
    )
    metrics.is_leader.set_function(lambda: 1.0 if is_leader() else 0.0)
    metrics.watch_usage(
        lambda: usage.tick() if is_leader() else None,
        usage.totals,
        usage.stranded,
        attributed=lambda: attributed_seconds(usage.label_totals(), usage.attribution),
    )


def _authenticator(s: ManagerSettings, kube: KubeClient | None, namespace: str) -> Chain:
    """Who may call the API: the authenticators the settings turn on, tried in order."""
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
