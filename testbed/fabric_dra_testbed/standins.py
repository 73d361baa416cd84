"""Stand-ins for what surrounds a role under test or benchmark, beside the processes of
:mod:`fabric_dra_testbed.stack`: a small real HTTP server that speaks the fabric manager's inventory and
attachment API (``manager_api.models``), its inventory factories, and pool ResourceSlices shaped as
the publisher writes them.

The manager stand-in speaks the REST contract exactly (same paths, bodies and error bodies), so a
controller under test uses the real :class:`manager_api.client.ManagerClient`; it runs in a
background thread of the caller.
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
from fabric_dra_testbed.stack import free_port
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
)
from plumbing import DEFAULT_DRIVER_NAME

__all__ = [
    "InventoryServer",
    "inventory_server",
    "make_device",
    "make_inventory",
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


class InventoryServer:
    """Serves ``GET /api/v1/inventory`` (with the ``after`` long poll) and the attachment calls.

    Attach/detach follow the manager's rules (idempotent per claim + device, 409 DeviceBusy when
    another claim or node holds the device) so the controller's binding flow can be exercised;
    ``fail_attach[device] = code`` makes the next attach of that device answer that error;
    ``fail_every_attach[device] = code`` makes every attach of it fail so.
    """

    def __init__(self, inventory: Inventory, *, token: str | None = None) -> None:
        self._inventory = inventory
        self.token = token
        self.fail_attach: dict[str, str] = {}
        self.fail_every_attach: dict[str, str] = {}
        self.attach_calls: list[tuple[str, str, str]] = []
        self.detach_calls: list[tuple[str, str, str]] = []
        self.inventory_calls = 0
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
            self._inventory = inventory.model_copy(update={"version": version})
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
        app = FastAPI()

        def error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
            body = ErrorBody(code=code, message=message, **extra).model_dump(by_alias=True, exclude_none=True)
            return JSONResponse(body, status_code=status)

        def denied(request: Request) -> JSONResponse | None:
            if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
                return error(401, "Unauthenticated", "missing or unknown bearer token")
            return None

        @app.get(f"{API_PREFIX}/inventory")
        async def inventory(request: Request, after: int | None = None, timeoutSeconds: float = 30.0) -> Any:
            if (resp := denied(request)) is not None:
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
            return JSONResponse(self.inventory.model_dump(mode="json", by_alias=True))

        @app.post(f"{API_PREFIX}/attachments")
        async def attach(request: Request, waitSeconds: float = 0.0) -> Any:
            if (resp := denied(request)) is not None:
                return resp
            body = AttachRequest.model_validate(await request.json())
            self.attach_calls.append((body.device, body.node, body.claim_uid))
            device = next((d for d in self.inventory.devices if d.name == body.device), None)
            if device is None:
                return error(404, "DeviceNotFound", f"device {body.device} not found", device=body.device)
            if body.device in self.fail_attach or body.device in self.fail_every_attach:
                code = self.fail_attach.pop(body.device, None) or self.fail_every_attach[body.device]
                # Counted in the inventory as the manager does (fabric.state.inventory.note_attach).
                self._replace(
                    device.model_copy(
                        update={"attach_failures": device.attach_failures + 1, "attach_error": code}
                    )
                )
                return error(502, code, f"injected failure of {body.device}", device=body.device)
            if device.claim_uid and (device.claim_uid, device.node) != (body.claim_uid, body.node):
                return error(
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
            self._replace(bound)
            return Attachment(
                device=bound, node=body.node, claim_uid=body.claim_uid, state=AttachmentState.ATTACHED
            )

        @app.delete(API_PREFIX + "/attachments/{name}")
        async def detach(
            request: Request, name: str, claimUid: str, node: str, waitSeconds: float = 0.0
        ) -> Any:
            if (resp := denied(request)) is not None:
                return resp
            self.detach_calls.append((name, node, claimUid))
            device = next((d for d in self.inventory.devices if d.name == name), None)
            if device is None:
                return error(404, "DeviceNotFound", f"device {name} not found", device=name)
            if (device.claim_uid, device.node) == (claimUid, node):
                device = device.model_copy(
                    update={"state": BindingState.FREE, "node": None, "claim_uid": None}
                )
                self._replace(device)
            return Attachment(device=device, node=node, claim_uid=claimUid, state=AttachmentState.DETACHED)

        return app

    def _replace(self, device: Device) -> None:
        with self._lock:
            devices = [device if d.name == device.name else d for d in self._inventory.devices]
            self._inventory = self._inventory.model_copy(
                update={"devices": devices, "version": self._inventory.version + 1}
            )
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
def inventory_server(inventory: Inventory, *, token: str | None = None) -> Iterator[InventoryServer]:
    server = InventoryServer(inventory, token=token).start()
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
