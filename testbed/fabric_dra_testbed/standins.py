"""Stand-ins for what surrounds a role under test or benchmark, beside the processes of
:mod:`fabric_dra_testbed.stack`: a small real HTTP server that speaks the fabric manager's inventory and
attachment API (``manager_api.models``), its inventory factories, and pool ResourceSlices shaped as
the publisher writes them.

The manager stand-in speaks the REST contract exactly (same paths, bodies and error bodies), so a
controller under test uses the real :class:`manager_api.client.ManagerClient`; it runs in a
background thread of the caller. It binds partitions of a GPU (design 35-36, A4: the GPU bound to
the node of its first partition, placements held per claim, 409 ``DeviceBusy`` naming what is in
the way) and shares of a memory pool (B4: a share per allocation's share ID, never more than the
pool holds). Given :class:`~fabric_dra_testbed.standin_hosts.EmulatedHosts`, what it binds appears
in the nodes' emulated host views, as the emulator's own bindings do, for a plugin under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dra_driver.controller.devices import ATTRIBUTE_NAMES
from fabric.state.changes import ChangeHistory
from fabric_dra_testbed.stack import free_port
from fabric_dra_testbed.standin_hosts import EmulatedHosts
from manager_api.models import (
    API_PREFIX,
    Attachment,
    AttachmentState,
    AttachRequest,
    BindingState,
    Device,
    DeviceType,
    ErrorBody,
    FabricNode,
    FabricPool,
    Health,
    Inventory,
    InventoryChanges,
    MemoryPool,
    MemoryShare,
    PartitionHolder,
    ResetReport,
)
from manager_api.partitions import PartitionDevice, conflict, parse_partition
from plumbing import DEFAULT_DRIVER_NAME

__all__ = [
    "EmulatedHosts",
    "InventoryServer",
    "inventory_server",
    "make_device",
    "make_inventory",
    "make_pool",
    "pool_device",
    "resource_slice",
]

_MODELS = {
    DeviceType.GPU: ("NVIDIA", "0x10de", "0x2330", "H100 80GB HBM3", 80 * 2**30),
    DeviceType.NVME: ("Samsung", "0x144d", "0xa80a", "PM1733", 3840 * 10**9),
    DeviceType.NIC: ("Mellanox", "0x15b3", "0x101d", "ConnectX-6 Dx", None),
    DeviceType.FPGA: ("Xilinx", "0x10ee", "0x5000", "Alveo U250", 64 * 2**30),
    DeviceType.CXL_MEMORY: ("Samsung", None, None, "CXL Type-3 256GB", 64 * 2**30),
    DeviceType.OTHER: ("Broadcom", "0x14e4", "0x1750", "Accelerator", None),
}


def make_device(
    name: str,
    *,
    pool: str = "fabric-pcie",
    fabric: str = "PCIe",
    type: DeviceType = DeviceType.GPU,
    switch: str | None = "Switch1",
    port: str | None = None,
    health: Health = Health.OK,
    **overrides: Any,
) -> Device:
    vendor, vendor_id, device_id, model, memory = _MODELS[type]
    fields: dict[str, Any] = {
        "name": name,
        "pool": pool,
        "fabric": fabric,
        "type": type,
        "vendor": vendor,
        "vendor_id": vendor_id,
        "device_id": device_id,
        "model": model,
        "serial": f"SN-{name.upper()}",
        "uuid": None,
        # a drive's size is storage capacity, never memory (as discovery describes drives)
        "memory_bytes": None if type is DeviceType.NVME else memory,
        "capacity_bytes": memory if type is DeviceType.NVME else None,
        "pcie_generation": 5 if type is not DeviceType.CXL_MEMORY else None,
        "pcie_width": 16 if type is not DeviceType.CXL_MEMORY else None,
        "switch": switch,
        "port": port or f"P-{name}",
        "health": health,
        "binding_style": "connection" if type is DeviceType.CXL_MEMORY else "zone",
        "redfish_uri": f"/redfish/v1/Fabrics/{fabric}/Endpoints/{name}",
    }
    fields.update(overrides)
    return Device(**fields)


def make_pool(
    name: str,
    size_bytes: int,
    *,
    min_chunk_bytes: int = 1 << 30,
    increment_bytes: int = 1 << 30,
    pool: str = "fabric-cxl",
    fabric: str = "CXL",
    **overrides: Any,
) -> Device:
    """A CXL memory pool that makes chunks on demand (a creatable MemoryDomain's device)."""
    memory_pool = MemoryPool(
        size_bytes=size_bytes, min_chunk_bytes=min_chunk_bytes, increment_bytes=increment_bytes
    )
    return make_device(
        name,
        pool=pool,
        fabric=fabric,
        type=DeviceType.CXL_MEMORY,
        memory_bytes=size_bytes,
        memory_pool=memory_pool,
        **overrides,
    )


def make_inventory(
    devices: list[Device],
    *,
    pools: dict[str, list[str]] | None = None,
    version: int = 1,
) -> Inventory:
    """An inventory over ``devices``; ``pools`` maps pool → reachable nodes (default: 2 nodes each)."""
    pool_names = sorted({d.pool for d in devices} | set(pools or {}))
    reach = {p: (pools or {}).get(p, ["node-a", "node-b"]) for p in pool_names}
    fabric_of = {d.pool: d.fabric for d in devices}
    node_names = sorted({n for nodes in reach.values() for n in nodes})
    return Inventory(
        version=version,
        pools=[FabricPool(pool=p, fabric=fabric_of.get(p, p), nodes=reach[p]) for p in pool_names],
        devices=devices,
        nodes=[
            FabricNode(
                name=n,
                host=f"host-{n}",
                pools=[p for p in pool_names if n in reach[p]],
                fabrics=sorted({fabric_of.get(p, p) for p in pool_names if n in reach[p]}),
            )
            for n in node_names
        ],
    )


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    """The manager's error answer: its wire body (``ErrorBody``) with that status."""
    body = ErrorBody(code=code, message=message, **extra).model_dump(by_alias=True, exclude_none=True)
    return JSONResponse(body, status_code=status)


class InventoryServer:
    """Serves ``GET /api/v1/inventory`` (with the ``after`` long poll) and the attachment calls.

    Attach/detach follow the manager's rules (idempotent per claim + device, 409 DeviceBusy when
    another claim or node holds the device) so the controller's binding flow can be exercised;
    ``fail_attach[device] = code`` makes the next attach of that device answer that error;
    ``fail_every_attach[device] = code`` makes every attach of it fail so.

    One class past 400 lines on purpose: it is the manager's attach and detach contract as the
    node's and the controller's tests meet it — whole devices, partitions and shares side by side,
    each route a method — so that one reading shows every rule the stand-in holds them to.
    """

    def __init__(
        self,
        inventory: Inventory,
        *,
        token: str | None = None,
        hosts: EmulatedHosts | None = None,
        changes: bool = True,
        history_versions: int = 1024,
    ) -> None:
        #: serve the change feed (``GET /inventory/changes``, an epoch in the inventory), as the
        #: manager does (False: a manager from before it); its history is the manager's own class
        self.changes = changes
        self.history = ChangeHistory(
            inventory.version, epoch=time.time_ns() // 1000, max_versions=history_versions
        )
        self._inventory = inventory.model_copy(update={"epoch": self.history.epoch if changes else None})
        self.token = token
        #: the nodes' emulated host views the bindings appear in (None: no host side)
        self.hosts = hosts
        #: every share made, in order (a chunk each)
        self.shares_made: list[MemoryShare] = []
        #: devices whose attach answers ``resetRequired`` (warm after another tenant, no Redfish
        #: reset) until the node reports the reset; the reports, as (device, node, outcome)
        self.reset_required: set[str] = set()
        self.reset_reports: list[tuple[str, str, str]] = []
        self.fail_attach: dict[str, str] = {}
        self.fail_every_attach: dict[str, str] = {}
        self.attach_calls: list[tuple[str, str, str]] = []
        self.detach_calls: list[tuple[str, str, str]] = []
        self.inventory_calls = 0
        self.changes_calls = 0
        #: set while change answers may go out; cleared, they wait (a consumer falling behind)
        self._changes_flow: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Condition | None = None
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._closing = False
        self.url = ""

    # -- control from the test ------------------------------------------------------------

    @property
    def inventory(self) -> Inventory:
        with self._lock:
            return self._inventory

    def set_inventory(self, inventory: Inventory) -> None:
        """Publish a new inventory; its version is forced above the current one."""
        with self._lock:
            version = max(inventory.version, self._inventory.version + 1)
            epoch = self.history.epoch if self.changes else None
            before = {d.name: d for d in self._inventory.devices}
            after = {d.name: d for d in inventory.devices}
            changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
            self._inventory = inventory.model_copy(update={"version": version, "epoch": epoch})
            self.history.record(version, frozenset(changed))
        self._notify()

    def hold_changes(self, held: bool) -> None:
        """Hold every change answer back (True) or let them go (False)."""
        loop, flow = self._loop, self._changes_flow
        if loop is not None and flow is not None:
            loop.call_soon_threadsafe(flow.clear if held else flow.set)

    def restart(self) -> None:
        """What a restarted manager does to the change feed: a new epoch, so every cursor given out
        so far is answered 410 ResyncRequired."""
        with self._lock:
            epoch = self.history.epoch + 1
            self.history = ChangeHistory(
                self._inventory.version, epoch=epoch, max_versions=self.history.max_versions
            )
            self._inventory = self._inventory.model_copy(update={"epoch": epoch})
        self._notify()

    def update_devices(self, change: Callable[[list[Device]], list[Device]]) -> Inventory:
        current = self.inventory
        new = make_inventory(
            change(list(current.devices)),
            pools={p.pool: p.nodes for p in current.pools},
            version=current.version + 1,
        )
        self.set_inventory(new)
        return self.inventory

    def _notify(self) -> None:
        loop, changed = self._loop, self._changed
        if loop is None or changed is None:
            return

        async def wake() -> None:
            async with changed:
                changed.notify_all()

        asyncio.run_coroutine_threadsafe(wake(), loop).result(timeout=5)

    # -- the app ----------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        """The manager's routes the plugin and the controller call."""
        app = FastAPI()
        app.get(f"{API_PREFIX}/inventory")(self._get_inventory)
        if self.changes:
            app.get(f"{API_PREFIX}/inventory/changes")(self._get_changes)
        app.post(f"{API_PREFIX}/attachments")(self._post_attachment)
        app.post(API_PREFIX + "/devices/{name}/reset")(self._post_reset)
        app.delete(API_PREFIX + "/attachments/{name}")(self._delete_attachment)
        return app

    def _denied(self, request: Request) -> JSONResponse | None:
        if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
            return _error(401, "Unauthenticated", "missing or unknown bearer token")
        return None

    async def _get_inventory(
        self, request: Request, after: int | None = None, timeoutSeconds: float = 30.0
    ) -> Any:
        if (resp := self._denied(request)) is not None:
            return resp
        self.inventory_calls += 1
        assert self._changed is not None
        if after is not None:
            deadline = time.monotonic() + timeoutSeconds
            async with self._changed:
                while self.inventory.version <= after and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), remaining)
        body = self.inventory.model_dump(mode="json", by_alias=True)
        if body.get("epoch") is None:
            body.pop("epoch", None)  # a manager from before the change feed has none
        return JSONResponse(body)

    async def _get_changes(
        self, request: Request, epoch: int, since: int, timeoutSeconds: float = 30.0
    ) -> Any:
        """The manager's change feed: the devices changed after ``since``, or 410 ResyncRequired."""
        if (resp := self._denied(request)) is not None:
            return resp
        self.changes_calls += 1
        assert self._changed is not None
        assert self._changes_flow is not None
        await self._changes_flow.wait()
        with self._lock:
            known = self.history.holds(epoch, since)
        if known:
            deadline = time.monotonic() + timeoutSeconds
            async with self._changed:
                while self.inventory.version == since and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), remaining)
        await self._changes_flow.wait()  # a poll already waiting is held back too
        with self._lock:
            names = self.history.since(epoch, since)
            inventory = self._inventory
        if names is None:
            return _error(
                410, "ResyncRequired", f"changes since {since} of epoch {epoch} are no longer known"
            )
        present = {d.name: d for d in inventory.devices if d.name in names}
        answer = InventoryChanges(
            epoch=self.history.epoch,
            since=since,
            version=inventory.version,
            devices=[present[n] for n in sorted(present)],
            removed=sorted(names - set(present)),
            pools=inventory.pools,
            nodes=inventory.nodes,
            notices=inventory.notices,
        )
        return JSONResponse(answer.model_dump(mode="json", by_alias=True))

    async def _post_attachment(self, request: Request, waitSeconds: float = 0.0) -> Any:
        if (resp := self._denied(request)) is not None:
            return resp
        body = AttachRequest.model_validate(await request.json())
        self.attach_calls.append((body.device, body.node, body.claim_uid))
        partition = self._partition(body.device)
        name = partition.gpu if partition is not None else body.device
        device = next((d for d in self.inventory.devices if d.name == name), None)
        if device is None:
            return _error(404, "DeviceNotFound", f"device {body.device} not found", device=body.device)
        if body.device in self.fail_attach or body.device in self.fail_every_attach:
            return self._injected_failure(device, body)
        if device.memory_pool is not None:
            return self._attach_share(device, body, _error)
        if (body.share_id is None) != (body.memory_bytes is None) or body.share_id is not None:
            return _error(
                422, "InvalidRequest", f"device {body.device} is no memory pool: it has no shares",
                device=body.device,
            )  # fmt: skip
        if partition is not None:
            return self._attach_partition(device, partition, body, _error)
        return self._attach_whole(device, body)

    def _injected_failure(self, device: Device, body: AttachRequest) -> JSONResponse:
        code = self.fail_attach.pop(body.device, None) or self.fail_every_attach[body.device]
        # Counted in the inventory as the manager does (fabric.state.inventory.note_attach).
        self._replace(
            device.model_copy(update={"attach_failures": device.attach_failures + 1, "attach_error": code})
        )
        return _error(502, code, f"injected failure of {body.device}", device=body.device)

    def _attach_whole(self, device: Device, body: AttachRequest) -> Any:
        """The device bound to the node for the claim; busy when it serves partitions or another
        claim or node holds it."""
        if device.partitions:
            holders = ", ".join(f"{h.node}/{h.claim_uid}" for h in device.partitions)
            return _error(
                409, "DeviceBusy", f"device {body.device} serves partitions ({holders})",
                device=body.device, held_by=holders,
            )  # fmt: skip
        if device.claim_uid and (device.claim_uid, device.node) != (body.claim_uid, body.node):
            return _error(
                409,
                "DeviceBusy",
                f"device {body.device} is held by {device.node}",
                device=body.device,
                held_by=f"{device.node}/{device.claim_uid}",
            )
        bound = device.model_copy(
            update={
                "state": BindingState.BOUND,
                "node": body.node,
                "claim_uid": body.claim_uid,
                "attach_failures": 0,
                "attach_error": None,
            }
        )
        if self.hosts is not None:
            self.hosts.plug(body.node, bound)
        self._replace(bound)
        return Attachment(
            device=bound,
            node=body.node,
            claim_uid=body.claim_uid,
            state=AttachmentState.ATTACHED,
            reset_required=bound.name in self.reset_required,
        )

    async def _post_reset(self, request: Request, name: str, waitSeconds: float = 0.0) -> Any:
        """The node reset the device it was answered ``resetRequired`` for: recorded, and the
        attach is answered without it from now on (after a failed reset the manager power-
        cycles the device for the claim; here it is taken as done)."""
        if (resp := self._denied(request)) is not None:
            return resp
        report = ResetReport.model_validate(await request.json())
        device = next((d for d in self.inventory.devices if d.name == name), None)
        if device is None:
            return _error(404, "DeviceNotFound", f"device {name} not found", device=name)
        self.reset_reports.append((name, report.node, report.outcome.value))
        self.reset_required.discard(name)
        return Attachment(
            device=device, node=report.node, claim_uid=report.claim_uid, state=AttachmentState.ATTACHED
        )

    async def _delete_attachment(
        self,
        request: Request,
        name: str,
        claimUid: str,
        node: str,
        waitSeconds: float = 0.0,
        shareId: str | None = None,
    ) -> Any:
        if (resp := self._denied(request)) is not None:
            return resp
        self.detach_calls.append((name, node, claimUid))
        partition = self._partition(name)
        device = next(
            (d for d in self.inventory.devices if d.name == (partition.gpu if partition else name)), None
        )
        if device is None:
            return _error(404, "DeviceNotFound", f"device {name} not found", device=name)
        if device.memory_pool is not None:
            return self._detach_share(device, claimUid, node, shareId)
        if partition is not None:
            return self._detach_partition(device, partition, claimUid, node)
        if (device.claim_uid, device.node) == (claimUid, node):
            device = device.model_copy(update={"state": BindingState.FREE, "node": None, "claim_uid": None})
            if self.hosts is not None:
                self.hosts.unplug(name)
            self._replace(device)
        return Attachment(device=device, node=node, claim_uid=claimUid, state=AttachmentState.DETACHED)

    # -- partitions and shares (design 35-36, A4 and B4) ------------------------------------

    def _partition(self, name: str) -> PartitionDevice | None:
        tables = {d.name: d.partition_table for d in self.inventory.devices if d.partition_table is not None}
        return parse_partition(name, tables)

    def _attach_partition(
        self, gpu: Device, partition: PartitionDevice, body: AttachRequest, error: Callable[..., JSONResponse]
    ) -> Any:
        """The GPU is bound to the node of its first partition; a placement is held by one claim,
        and none overlaps another (``conflict``); the GPU held whole, or for another node, is busy."""
        mine = PartitionHolder(partition=partition.name, claim_uid=body.claim_uid, node=body.node)
        if mine not in gpu.partitions:
            if gpu.claim_uid is not None or (gpu.node not in (None, body.node)):
                holder = f"{gpu.node}/{gpu.claim_uid or 'partitions'}"
                return error(
                    409, "DeviceBusy", f"GPU {gpu.name} of partition {partition.name} is held by {holder}",
                    device=partition.name, held_by=holder,
                )  # fmt: skip
            held = [self._partition(h.partition) for h in gpu.partitions]
            why = conflict(partition, [h for h in held if h is not None])
            if why is not None:
                holders = ", ".join(f"{h.node}/{h.claim_uid}" for h in gpu.partitions)
                return error(409, "DeviceBusy", why, device=partition.name, held_by=holders)
            gpu = gpu.model_copy(
                update={
                    "state": BindingState.BOUND,
                    "node": body.node,
                    "partitions": [*gpu.partitions, mine],
                    "attach_failures": 0,
                    "attach_error": None,
                }
            )
            if self.hosts is not None:
                self.hosts.plug(body.node, gpu)
            self._replace(gpu)
        return Attachment(
            device=gpu,
            node=body.node,
            claim_uid=body.claim_uid,
            state=AttachmentState.ATTACHED,
            partition=partition.name,
            reset_required=gpu.name in self.reset_required,
        )

    def _detach_partition(self, gpu: Device, partition: PartitionDevice, claim_uid: str, node: str) -> Any:
        """The holder goes; the GPU is unbound only with its last partition."""
        mine = PartitionHolder(partition=partition.name, claim_uid=claim_uid, node=node)
        if mine in gpu.partitions:
            left = [h for h in gpu.partitions if h != mine]
            update: dict[str, Any] = {"partitions": left}
            if not left:
                update |= {"state": BindingState.FREE, "node": None}
                if self.hosts is not None:
                    self.hosts.unplug(gpu.name)
            gpu = gpu.model_copy(update=update)
            self._replace(gpu)
        return Attachment(
            device=gpu,
            node=node,
            claim_uid=claim_uid,
            state=AttachmentState.DETACHED,
            partition=partition.name,
        )

    def _attach_share(self, pool: Device, body: AttachRequest, error: Callable[..., JSONResponse]) -> Any:
        """A chunk of exactly the share's size, connected to the node; never more than the pool
        holds (what the manager checks even when the scheduler's view is stale)."""
        assert pool.memory_pool is not None
        if body.share_id is None or body.memory_bytes is None:
            return error(
                422,
                "InvalidRequest",
                f"device {body.device} is a memory pool: ask for a share (shareId, memoryBytes)",
                device=body.device,
            )
        memory = pool.memory_pool
        share = next((s for s in memory.shares if s.share_id == body.share_id), None)
        if share is not None:
            if (share.claim_uid, share.node, share.memory_bytes) != (
                body.claim_uid,
                body.node,
                body.memory_bytes,
            ):
                return error(
                    409, "DeviceBusy", f"share {body.share_id} of {pool.name} is another allocation's",
                    device=body.device, held_by=f"{share.node}/{share.claim_uid}",
                )  # fmt: skip
        else:
            used = memory.outside_bytes + sum(s.memory_bytes for s in memory.shares)
            if used + body.memory_bytes > memory.size_bytes:
                return error(
                    409, "DeviceBusy",
                    f"{pool.name}: {used} of {memory.size_bytes} bytes in use; {body.memory_bytes} asked",
                    device=body.device,
                )  # fmt: skip
            chunk = f"{pool.redfish_uri}/MemoryDomains/0/MemoryChunks/{len(self.shares_made)}"
            share = MemoryShare(
                share_id=body.share_id,
                claim_uid=body.claim_uid,
                node=body.node,
                memory_bytes=body.memory_bytes,
                chunk=chunk,
                connection=f"/redfish/v1/Fabrics/{pool.fabric}/Connections/{len(self.shares_made)}",
            )
            self.shares_made.append(share)
            if self.hosts is not None:
                self.hosts.plug(
                    body.node, pool, target=f"{pool.name}/{share.share_id}", size=share.memory_bytes
                )
            pool = pool.model_copy(
                update={"memory_pool": memory.model_copy(update={"shares": [*memory.shares, share]})}
            )
            self._replace(pool)
        return Attachment(
            device=pool, node=body.node, claim_uid=body.claim_uid, state=AttachmentState.ATTACHED, share=share
        )

    def _detach_share(self, pool: Device, claim_uid: str, node: str, share_id: str | None) -> Any:
        """The connection goes, then the chunk (the host's region with it)."""
        assert pool.memory_pool is not None
        memory = pool.memory_pool
        share = next(
            (s for s in memory.shares if (s.share_id, s.claim_uid, s.node) == (share_id, claim_uid, node)),
            None,
        )
        if share is not None:
            if self.hosts is not None:
                self.hosts.unplug(f"{pool.name}/{share.share_id}")
            left = [s for s in memory.shares if s is not share]
            pool = pool.model_copy(update={"memory_pool": memory.model_copy(update={"shares": left})})
            self._replace(pool)
        return Attachment(
            device=pool, node=node, claim_uid=claim_uid, state=AttachmentState.DETACHED, share=share
        )

    def _replace(self, device: Device) -> None:
        with self._lock:
            devices = [device if d.name == device.name else d for d in self._inventory.devices]
            self._inventory = self._inventory.model_copy(
                update={"devices": devices, "version": self._inventory.version + 1}
            )
            self.history.record(self._inventory.version, frozenset({device.name}))
        assert self._changed is not None
        changed = self._changed

        async def wake() -> None:
            async with changed:
                changed.notify_all()

        assert self._loop is not None
        self._loop.create_task(wake())

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> InventoryServer:
        port = free_port()
        config = uvicorn.Config(
            self._app(),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._changed = asyncio.Condition()
            self._changes_flow = asyncio.Event()
            self._changes_flow.set()
            ready.set()
            assert self._server is not None
            loop.run_until_complete(self._server.serve())
            loop.close()

        self._thread = threading.Thread(target=serve, name="inventory-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("inventory server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        # Long polls in flight answer at once, so shutdown does not wait for their timeout.
        self._closing = True
        if self._thread is not None and self._thread.is_alive():
            self.hold_changes(False)
            self._notify()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> InventoryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def inventory_server(
    inventory: Inventory, *, token: str | None = None, hosts: EmulatedHosts | None = None
) -> Iterator[InventoryServer]:
    server = InventoryServer(inventory, token=token, hosts=hosts).start()
    try:
        yield server
    finally:
        server.stop()


# -- pool ResourceSlices -------------------------------------------------------------------------

#: the string attributes of :func:`pool_device`: the driver's own, less its two integers
SLICE_ATTRIBUTES = tuple(name for name in ATTRIBUTE_NAMES if name not in ("pcieGen", "pcieWidth"))


def pool_device(index: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        f"{DEFAULT_DRIVER_NAME}/{name}": {"string": f"{name}-{index}"} for name in SLICE_ATTRIBUTES
    }
    attributes[f"{DEFAULT_DRIVER_NAME}/pcieGen"] = {"int": 5}
    attributes[f"{DEFAULT_DRIVER_NAME}/pcieWidth"] = {"int": 16}
    return {
        "name": f"gpu-{index}",
        "attributes": attributes,
        "capacity": {f"{DEFAULT_DRIVER_NAME}/memory": {"value": "80Gi"}},
    }


def resource_slice(name: str = "fabric-pcie-0", devices: int = 128, generation: int = 1) -> dict[str, Any]:
    """A pool ResourceSlice as the publisher writes it (node selector, up to 128 devices)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"fabric-dra.io/pool": "fabric-pcie"}},
        "spec": {
            "driver": DEFAULT_DRIVER_NAME,
            "pool": {"name": "fabric-pcie", "generation": generation, "resourceSliceCount": 1},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "fabric-dra.io/fabric", "operator": "In", "values": ["pcie"]}
                        ]
                    }
                ]
            },
            "devices": [pool_device(i) for i in range(devices)],
        },
    }
