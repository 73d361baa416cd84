"""An in-memory fabric for the attach/detach unit tests: it binds, fails and hangs on command.

It stands in for a Redfish service only in these state-machine tests; the integration tests run
the same flows against the real emulator over HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric.backends.base import Backend, BindContext, DiscoveryResult
from fabric.backends.walk import Walk
from fabric.backends.watch import InventoryWatch
from fabric.bindings.attachments import Attachments
from fabric.bindings.reconcile import Reconciler
from fabric.driver.operations import OperationDriver
from fabric.driver.settings import OperationSettings
from fabric.state.inventory import Inventory
from fabric.state.ledger import FileLedgerStore, Ledger
from fabric.state.model import (
    DeviceRecord,
    DiscoveredAttributes,
    FabricInfo,
    FabricSnapshot,
    HostRecord,
)
from fabric.state.nodes import NodeResolver
from manager_api.devices import BindingStyle, DeviceType
from manager_api.errors import FabricError, FabricUnavailable

FABRIC = "PCIe"


class DoubleBinding(AssertionError):
    pass


@dataclass
class Fault:
    """What the next bind/unbind of a device does instead of succeeding."""

    error: FabricError
    #: True: the fabric did the bind/unbind, but the answer was lost
    applied: bool = False


@dataclass
class FakeFabric:
    hosts: list[str]
    devices: list[str]
    bound: dict[str, str] = field(default_factory=dict)  # device → host
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    delay: float = 0.0
    read_delay: float = 0.0
    reachable: bool = True
    binds: list[tuple[str, str]] = field(default_factory=list)
    unbinds: list[tuple[str, str]] = field(default_factory=list)
    #: task monitors that never finish until cancelled
    hung_tasks: set[str] = field(default_factory=set)
    hang_next_bind: set[str] = field(default_factory=set)
    cancelled: list[str] = field(default_factory=list)
    #: devices whose binds and unbinds the fabric answers as done without doing them
    ignored: set[str] = field(default_factory=set)

    def check_reachable(self) -> None:
        if not self.reachable:
            raise FabricUnavailable("Redfish service at https://fabric unreachable: cannot connect (refused)")


class FakeTasks:
    """The Redfish tasks the fake fabric runs: hung ones never end until cancelled."""

    def __init__(self, fabric: FakeFabric) -> None:
        self.fabric = fabric

    async def task_running(self, monitor: str) -> bool:
        self.fabric.check_reachable()
        return monitor in self.fabric.hung_tasks

    async def cancel_task(self, monitor: str) -> None:
        self.fabric.cancelled.append(monitor)
        self.fabric.hung_tasks.discard(monitor)


class FakeBackend(Backend):
    style = BindingStyle.ZONE
    authority = "fake binding table"

    def __init__(self, fabric: FakeFabric) -> None:
        self.fabric = fabric
        self.fabric_id = FABRIC
        self.fabric_uri = f"/redfish/v1/Fabrics/{FABRIC}"

    async def discover(self, walk: Walk, hosts: Any) -> DiscoveryResult:  # pragma: no cover - not used
        raise NotImplementedError

    async def read_bindings(self, walk: Walk) -> dict[str, tuple[str, ...]]:
        self.fabric.check_reachable()
        return {f"/redfish/v1/Fabrics/{FABRIC}/Endpoints/{d}": (h,) for d, h in self.fabric.bound.items()}

    async def read_binding(self, device: DeviceRecord, hosts: Sequence[HostRecord] = ()) -> tuple[str, ...]:
        self.fabric.check_reachable()
        await asyncio.sleep(self.fabric.read_delay)
        host = self.fabric.bound.get(device.name)
        return (host,) if host else ()

    async def _change(self, device: DeviceRecord, host: HostRecord, ctx: BindContext, bind: bool) -> None:
        self.fabric.check_reachable()
        ctx.fence()
        if self.fabric.delay:
            await asyncio.sleep(self.fabric.delay)
        faults = self.fabric.faults.get(device.name)
        if faults:
            fault = faults.pop(0)
            if fault.applied:
                self._apply(device.name, host.id, bind)
            raise fault.error
        if bind and device.name in self.fabric.hang_next_bind:
            self.fabric.hang_next_bind.discard(device.name)
            monitor = f"/redfish/v1/TaskService/TaskMonitors/{device.name}"
            self.fabric.hung_tasks.add(monitor)
            if ctx.on_task:
                await ctx.on_task(monitor)
            from manager_api.errors import AttachTimeout

            raise AttachTimeout(
                f"the fabric did not finish bind in time; its task {monitor} is still running"
            )
        if device.name in self.fabric.ignored:
            (self.fabric.binds if bind else self.fabric.unbinds).append((device.name, host.id))
            return
        self._apply(device.name, host.id, bind)

    def _apply(self, device: str, host: str, bind: bool) -> None:
        if bind:
            holder = self.fabric.bound.get(device)
            if holder is not None and holder != host:
                raise DoubleBinding(f"{device} bound to {holder} and {host}")
            self.fabric.bound[device] = host
            self.fabric.binds.append((device, host))
        else:
            if self.fabric.bound.get(device) == host:
                del self.fabric.bound[device]
            self.fabric.unbinds.append((device, host))

    async def bind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        await self._change(device, host, ctx, True)

    async def unbind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        await self._change(device, host, ctx, False)


def _attributes(device: str) -> DiscoveredAttributes:
    """A ``nic*`` is a NIC without a Redfish Reset action (its node resets it); anything else a GPU
    whose Processor offers ``#Processor.Reset``, as the emulator's do."""
    if device.startswith("nic"):
        return DiscoveredAttributes(type=DeviceType.NIC, model="ConnectX-7")
    return DiscoveredAttributes(
        type=DeviceType.GPU,
        model="H100",
        reset_target=f"/redfish/v1/Chassis/{FABRIC}/Processors/{device}/Actions/Processor.Reset",
    )


class FakeDiscovery:
    def __init__(self, fabric: FakeFabric) -> None:
        self.fabric = fabric
        self.backend = FakeBackend(fabric)

    def backend_for(self, device: DeviceRecord) -> Backend:
        return self.backend

    async def scan_bindings(self) -> tuple[dict[str, tuple[str, ...]], int, float]:
        """Who is bound, as a bindings-only pass reads it: (device key → hosts, GETs, start)."""
        started = time.monotonic()
        self.fabric.check_reachable()
        bound: dict[str, tuple[str, ...]] = {}
        for d in self.fabric.devices:
            host = self.fabric.bound.get(d)
            bound[f"/redfish/v1/Fabrics/{FABRIC}/Endpoints/{d}"] = (host,) if host else ()
        return bound, 1, started

    async def scan(self) -> FabricSnapshot:
        self.fabric.check_reachable()
        hosts = {
            h: HostRecord(id=h, uri=f"/redfish/v1/Systems/{h}", initiators={FABRIC: (f"/i/{h}",)})
            for h in self.fabric.hosts
        }
        devices = [
            DeviceRecord(
                key=f"/redfish/v1/Fabrics/{FABRIC}/Endpoints/{d}",
                resource_id=d,
                fabric=FABRIC,
                style=BindingStyle.ZONE,
                attributes=_attributes(d),
                bound_hosts=(self.fabric.bound[d],) if d in self.fabric.bound else (),
                reachable_hosts=tuple(self.fabric.hosts),
                endpoint=f"/redfish/v1/Fabrics/{FABRIC}/Endpoints/{d}",
                name=d,
            )
            for d in self.fabric.devices
        ]
        return FabricSnapshot(
            devices=devices,
            hosts=hosts,
            fabrics={FABRIC: FabricInfo(FABRIC, None, (BindingStyle.ZONE,), tuple(self.fabric.hosts))},
        )


@dataclass
class Harness:
    fabric: FakeFabric
    inventory: Inventory
    #: the discovery passes that land in the inventory (``await h.watch.refresh()``)
    watch: InventoryWatch
    ledger: Ledger
    attachments: Attachments
    driver: OperationDriver
    reconciler: Reconciler
    leader: list[bool]


async def make_harness(
    tmp: Path,
    *,
    hosts: int = 2,
    devices: int = 2,
    fabric: FakeFabric | None = None,
    settings: OperationSettings | None = None,
) -> Harness:
    fake = fabric or FakeFabric(
        hosts=[f"node-{i}" for i in range(hosts)], devices=[f"gpu{i}" for i in range(devices)]
    )
    discovery = FakeDiscovery(fake)
    inventory = Inventory()
    watch = InventoryWatch(discovery, inventory, NodeResolver(), use_events=False)  # type: ignore[arg-type]
    ledger = Ledger(FileLedgerStore(tmp))
    await ledger.load()
    inventory.follow(ledger)
    leader = [True]
    driver = OperationDriver(
        inventory,
        ledger,
        discovery.backend_for,
        FakeTasks(fake),
        is_leader=lambda: leader[0],
        settings=settings
        or OperationSettings(
            operation_timeout=2.0, task_timeout=0.5, settle_seconds=0.01, retry_seconds=0.05
        ),
    )
    attachments = Attachments(inventory, ledger, driver)
    reconciler = Reconciler(inventory, ledger, driver)
    watch.after_refresh.append(reconciler.reconcile_changes)  # as the manager's wiring does
    await watch.refresh()
    return Harness(fake, inventory, watch, ledger, attachments, driver, reconciler, leader)
