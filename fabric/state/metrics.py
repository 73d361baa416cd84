"""Prometheus metrics of the fabric manager (``GET /metrics``).

Labels stay low-cardinality: device type, model, pool, node, outcome (a word: an error *class* or an
HTTP status phrase, never a message or a number), Redfish method and resource kind (the collection
or action name, never a URI). ``deploy/components/monitoring`` holds the dashboard and the alerts
built on them; a test checks each metric they use is in a scrape of a running manager.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fabric.state.inventory import DeviceFacts
from manager_api import models as api
from plumbing.promstats import outcome_word, register_process_metrics

__all__ = ["BudgetRow", "ManagerMetrics"]

_OP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0)
_REDFISH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _family(name: str, documentation: str, labels: list[str], counts: Counter[Any]) -> GaugeMetricFamily:
    """A gauge family of ``counts`` (label values → count), in label order."""
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for values, count in sorted(counts.items()):
        family.add_metric(list(values) if isinstance(values, tuple) else [values], count)
    return family


class _PoolCollector(Collector):
    def __init__(self, devices: Callable[[], Iterable[DeviceFacts]]) -> None:
        #: what the inventory keeps of each device for this (not the devices' models, which a
        #: scrape would build for every device)
        self._devices = devices

    def collect(self) -> Iterator[Metric]:
        counts: Counter[tuple[str, str, str, str]] = Counter()
        foreign: Counter[str] = Counter()
        unhealthy: Counter[tuple[str, str, str]] = Counter()
        per_node: Counter[tuple[str, str]] = Counter()
        drained: Counter[tuple[str, str, str]] = Counter()
        for device in self._devices():
            if device.drain_effect is not None:
                drained[(device.pool, device.drain_effect, str(device.state))] += 1
            counts[(device.pool, device.type, device.model or "", str(device.state))] += 1
            if not device.managed and device.state is api.BindingState.BOUND:
                foreign[device.pool] += 1
            if device.health is not api.Health.OK:
                unhealthy[(device.pool, str(device.state), str(device.health))] += 1
            if device.node and device.state is not api.BindingState.FREE:
                per_node[(device.pool, device.node)] += 1
        yield _family(
            "fabric_dra_pool_devices",
            "Devices in each fabric pool by model and binding state",
            ["pool", "type", "model", "state"],
            counts,
        )
        yield _family(
            "fabric_dra_unmanaged_bindings",
            "Bindings made outside fabric-dra (reported, never touched)",
            ["pool"],
            foreign,
        )
        yield _family(
            "fabric_dra_unhealthy_devices",
            "Devices whose Redfish health is not OK, by binding state (bound: a workload is affected)",
            ["pool", "state", "health"],
            unhealthy,
        )
        yield _family(
            "fabric_dra_drained_devices",
            "Devices an operator drained, by the taint's effect and binding state (bound: still in use)",
            ["pool", "effect", "state"],
            drained,
        )
        yield _family(
            "fabric_dra_node_devices",
            "Devices bound (or being bound or unbound) to each Kubernetes node",
            ["pool", "node"],
            per_node,
        )


#: why a device is bound to a node with no claim using it (``fabric_dra_stranded_devices{reason}``)
STRANDED_REASONS = ("warm", "orphan-grace", "outside")


class _UsageCollector(Collector):
    """Device-seconds from the durable usage record (:mod:`fabric.bindings.usage`): the counter carries on
    across restarts and leader changes instead of starting from zero in each process."""

    def __init__(
        self,
        refresh: Callable[[], None],
        totals: Callable[[], dict[tuple[str, str, str], float]],
        stranded: Callable[[], dict[str, int]],
        attributed: Callable[[], dict[tuple[str, str, str, str], float]],
    ) -> None:
        self._refresh = refresh
        self._totals = totals
        self._stranded = stranded
        self._attributed = attributed

    def collect(self) -> Iterator[Metric]:
        self._refresh()  # counted up to this scrape
        seconds = CounterMetricFamily(
            "fabric_dra_device_seconds",
            "Seconds devices spent in each state (bound: to a claim; warm: held for the warm pool; "
            "attaching, detaching; outside: bound outside fabric-dra), by the claim's namespace and "
            "the model; kept in the usage record, so it carries on across restarts",
            labels=["namespace", "model", "state"],
        )
        partitions = CounterMetricFamily(
            "fabric_dra_partition_seconds",
            "Seconds of GPU partitions held bound by claims, each at its share of the GPU (its memory "
            "slices of the GPU's), by the claim's namespace and the GPU's model",
            labels=["namespace", "model"],
        )
        memory = CounterMetricFamily(
            "fabric_dra_memory_gib_seconds",
            "GiB-seconds of memory shares (chunks of a memory pool) held bound by claims, by the claim's "
            "namespace and the pool's model",
            labels=["namespace", "model"],
        )
        for (namespace, model, state), value in sorted(self._totals().items()):
            if state == api.USAGE_PARTITION:
                partitions.add_metric([namespace, model], value)
            elif state == api.USAGE_MEMORY_GIB:
                memory.add_metric([namespace, model], value)
            else:
                seconds.add_metric([namespace, model, state], value)
        yield seconds
        yield partitions
        yield memory
        attributed = CounterMetricFamily(
            "fabric_dra_attributed_seconds",
            "Seconds by the claims' attribution labels (--attribution-label): device-seconds by state, "
            "partition (GPU-seconds at the partition's share) and memory-gib (GiB-seconds); each key's "
            "values beyond --attribution-values-max counted as other; kept in the usage record",
            labels=["key", "value", "model", "state"],
        )
        for (key, label_value, model, state), total in sorted(self._attributed().items()):
            attributed.add_metric([key, label_value, model, state], total)
        yield attributed
        stranded = self._stranded()
        yield _family(
            "fabric_dra_stranded_devices",
            "Devices bound to a node with no claim using them, by why: warm (the warm pool), "
            "orphan-grace (the claim is gone, detached after the grace period), outside (bound outside "
            "fabric-dra)",
            ["reason"],
            Counter({reason: stranded.get(reason, 0) for reason in STRANDED_REASONS}),
        )


#: one limit of one tree of one DeviceBudget: (namespace, budget, tree, limit, used, max)
BudgetRow = tuple[str, str, str, str, float, float]


class _BudgetCollector(Collector):
    """What each tree of each DeviceBudget may hold and holds, as the status writer last counted
    it (docs/budgets.md): the alerts at 80 % and 100 % divide the two."""

    def __init__(self, rows: Callable[[], list[BudgetRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "budget", "tree", "limit"]
        limit = GaugeMetricFamily(
            "fabric_dra_budget_limit",
            "What a DeviceBudget allows one tree: devices, bytes of memory, or device-hours in its window",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "fabric_dra_budget_used",
            "What one tree of a DeviceBudget holds now (attaches in flight included), in the limit's unit",
            labels=labels,
        )
        for namespace, budget, tree, name, held, cap in self._rows():
            limit.add_metric([namespace, budget, tree, name], cap)
            used.add_metric([namespace, budget, tree, name], held)
        yield limit
        yield used


class ManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        register_process_metrics(self.registry, "manager")
        self._declare_operations()
        self._declare_replica()
        self._declare_holders()

    def _declare_operations(self) -> None:
        """Attaches and detaches: how long they take, how many run, the Redfish requests they
        make, and those refused for good."""
        self.attach_seconds = Histogram(
            "fabric_dra_attach_duration_seconds",
            "Time from an attach request to the device bound (or the attach failed)",
            ["type", "outcome"],
            buckets=_OP_BUCKETS,
            registry=self.registry,
        )
        self.detach_seconds = Histogram(
            "fabric_dra_detach_duration_seconds",
            "Time from a detach request to the device unbound (or the detach failed)",
            ["type", "outcome"],
            buckets=_OP_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "fabric_dra_operations_in_flight",
            "Attach and detach operations not finished yet",
            ["operation"],
            registry=self.registry,
        )
        for operation in ("attach", "detach"):
            self.in_flight.labels(operation).set(0)
        self.redfish_seconds = Histogram(
            "fabric_dra_redfish_request_duration_seconds",
            "Latency of requests to the Redfish service",
            ["method", "resource"],
            buckets=_REDFISH_BUCKETS,
            registry=self.registry,
        )
        self.redfish_errors = PromCounter(
            "fabric_dra_redfish_request_errors_total",
            "Requests to the Redfish service that failed (HTTP >= 400 or no answer)",
            ["method", "resource", "outcome"],
            registry=self.registry,
        )
        self.attach_refused = PromCounter(
            "fabric_dra_attach_refused_total",
            "Attaches refused for good (BindRefused: the node does not reach the device), by who said "
            "so: the manager's inventory, or the fabric's own 400",
            ["refused_by"],
            registry=self.registry,
        )

    def _declare_replica(self) -> None:
        """This replica: its inventory's version, whether the fabric reads, whether it leads."""
        self.inventory_version = Gauge(
            "fabric_dra_inventory_version", "Current inventory version", registry=self.registry
        )
        self.fabric_reachable = Gauge(
            "fabric_dra_fabric_reachable",
            "1 while the last read of the fabric's inventory succeeded, 0 while the Redfish service fails",
            registry=self.registry,
        )
        self.is_leader = Gauge(
            "fabric_dra_manager_leader", "1 while this replica is the leader", registry=self.registry
        )

    def set_orphaned_tree_claims(self, counts: dict[tuple[str, str], int]) -> None:
        """The orphaned agent-tree claims of the last pass, by (namespace, reason); series that
        dropped to nothing are removed, not left at their last value."""
        self.orphaned_tree_claims.clear()
        for (namespace, reason), count in counts.items():
            self.orphaned_tree_claims.labels(namespace, reason).set(count)

    def _declare_holders(self) -> None:
        """Who holds devices: orphans, the warm pool and its resets."""
        self.orphan_bindings = Gauge(
            "fabric_dra_orphan_bindings",
            "Bindings made by fabric-dra that nothing explains now (detached after the grace period)",
            registry=self.registry,
        )
        self.orphans_detached = PromCounter(
            "fabric_dra_orphans_detached_total",
            "Orphaned bindings detached, by why nothing explained them",
            ["reason"],
            registry=self.registry,
        )
        self.orphaned_tree_claims = Gauge(
            "fabric_dra_orphaned_tree_claims",
            "Claims holding bindings whose agent tree's root is gone and whose pods are gone "
            "(root-gone-pods-gone) or stuck Terminating past the grace (root-gone-pods-terminating)",
            ["namespace", "reason"],
            registry=self.registry,
        )
        self.orphaned_tree_released = PromCounter(
            "fabric_dra_orphaned_tree_claims_released_total",
            "Orphaned agent-tree claims whose bindings were released (--orphaned-trees release)",
            ["namespace"],
            registry=self.registry,
        )
        self.warm_claims = PromCounter(
            "fabric_dra_warm_claims_total",
            "Claims' attach requests by how they met the warm pool: hit (warm on the claim's node, no "
            "hot-add), miss (warm on another node, moved), cold (not warm: a hot-add)",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.device_resets = PromCounter(
            "fabric_dra_device_resets_total",
            "Resets of devices a claim gave back to the warm pool, before another claim may have them: "
            "success, or failure (the device leaves the pool)",
            ["outcome"],
            registry=self.registry,
        )
        self.budget_refusals = PromCounter(
            "fabric_dra_budget_refusals_total",
            "Attaches a DeviceBudget refused (enforcement: Enforce), by the limit that refused",
            ["namespace", "budget", "limit"],
            registry=self.registry,
        )
        self.warm_devices = Gauge(
            "fabric_dra_warm_devices",
            "Devices warm (bound to a node with no claim) by model",
            ["model"],
            registry=self.registry,
        )

    def watch_inventory(
        self,
        devices: Callable[[], Iterable[DeviceFacts]],
        version: Callable[[], int],
        reachable: Callable[[], bool] | None = None,
    ) -> None:
        self.registry.register(_PoolCollector(devices))
        self.inventory_version.set_function(lambda: float(version()))
        if reachable is not None:
            self.fabric_reachable.set_function(lambda: 1.0 if reachable() else 0.0)

    def watch_usage(
        self,
        refresh: Callable[[], None],
        totals: Callable[[], dict[tuple[str, str, str], float]],
        stranded: Callable[[], dict[str, int]],
        attributed: Callable[[], dict[tuple[str, str, str, str], float]] | None = None,
    ) -> None:
        """``fabric_dra_device_seconds_total``, ``fabric_dra_stranded_devices`` and
        ``fabric_dra_attributed_seconds_total`` (by attribution label), read at each scrape after
        ``refresh`` (the usage meter's tick)."""
        self.registry.register(_UsageCollector(refresh, totals, stranded, attributed or dict))

    def watch_budgets(self, rows: Callable[[], list[BudgetRow]]) -> None:
        """``fabric_dra_budget_limit`` and ``fabric_dra_budget_used``, read at each scrape."""
        self.registry.register(_BudgetCollector(rows))

    def observe_redfish(self, method: str, resource: str, outcome: str, seconds: float) -> None:
        """A :data:`fabric.redfish.client.RequestObserver`."""
        self.redfish_seconds.labels(method, resource).observe(seconds)
        if not outcome.isdigit() or int(outcome) >= 400:
            self.redfish_errors.labels(method, resource, outcome_word(outcome)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
