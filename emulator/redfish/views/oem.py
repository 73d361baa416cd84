"""``/redfish/v1/Oem/FabricDRA``: the emulator's own admin resources, for tests and operators.

* ``Bindings`` (GET): every binding — target, host, style, zone/connection, host-side names —
  and every operation in flight, straight from the durable state. Tests use it to prove that
  no device is ever bound to two hosts.
* ``Faults`` (GET lists, POST injects one — see :mod:`emulator.redfish.model.faults` — DELETE resets
  all) and ``Faults/{Id}`` (GET, DELETE).

These resources are not linked from the service root (they are not part of any DMTF schema);
faults such as slow or dropped responses never apply to them, so a test can always reset.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.faults import fault_adapter
from emulator.redfish.model.registries import message
from emulator.redfish.tree.http import Reply, Request
from emulator.redfish.tree.nodes import Context, Node

__all__ = ["OemNode"]


class OemNode(Node):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, uris.OEM)

    def render(self) -> dict[str, Any]:
        return {
            "@odata.id": self.uri,
            "Id": "FabricDRA",
            "Name": "fabric-dra emulator administration",
            "Bindings": {"@odata.id": uris.OEM_BINDINGS},
            "Faults": {"@odata.id": uris.OEM_FAULTS},
        }

    def child(self, segment: str) -> Node | None:
        if segment == "Bindings":
            return BindingsNode(self.ctx)
        if segment == "Faults":
            return FaultsNode(self.ctx)
        return None


class BindingsNode(Node):
    cached = False  # NodeResets reads the hosts' trees: a node's reset changes no state revision

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, uris.OEM_BINDINGS)

    def render(self) -> dict[str, Any]:
        engine, index = self.ctx.engine, self.ctx.index
        bindings = []
        for target_id, b in sorted(engine.state.bindings.items()):
            target = index.targets[target_id]
            bindings.append(
                {
                    "Target": target_id,
                    "Device": target.device.id,
                    "Type": target.device.type.value,
                    "Fabric": target.fabric,
                    "Host": b.host,
                    "Style": b.style.value,
                    "Zone": b.zone,
                    "Connection": b.connection,
                    "Since": b.since.isoformat(),
                    "HostAddress": b.address.model_dump(exclude_none=True),
                    "VisibleToHost": engine.conditions.port_up(target.device.switch, b.host),
                    "Resets": b.resets,
                    "LastReset": b.last_reset.isoformat() if b.last_reset else None,
                    # the host's own function-level resets (sysfs "reset" writes) in this binding
                    "NodeResets": engine.hostview.node_resets(b.host, b.address),
                }
            )
        in_flight = []
        for target_id, task_id in sorted(engine.bindings.inflight.items()):
            task = engine.state.tasks[task_id]
            in_flight.append(
                {
                    "Target": target_id,
                    "Host": task.host,
                    "Operation": task.kind.value,
                    "Task": uris.task(task_id),
                }
            )
        pools = []
        for device in index.devices.values():
            if device.pool is None:
                continue
            carver = engine.carver
            used = carver.used_mib(device)
            pools.append(
                {
                    "Device": device.id,
                    "MemoryDomain": uris.memory_domain(device.id),
                    "SizeMiB": carver.total_mib(device),
                    "UsedMiB": used,
                    "FreeMiB": carver.total_mib(device) - used,
                    "Chunks": [
                        {"Target": r.id, "SizeMiB": r.size_mib, "Extents": [list(e) for e in r.extents]}
                        for r in carver.records(device)
                    ],
                }
            )
        return {
            "@odata.id": self.uri,
            "Id": "Bindings",
            "Name": "Bindings of the emulated fabric",
            "StateVersion": engine.state.version,
            "Bindings": bindings,
            "InFlight": in_flight,
            "Pools": pools,
        }


class FaultsNode(Node):
    allow = ("GET", "HEAD", "POST", "DELETE")

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, uris.OEM_FAULTS)

    def render(self) -> dict[str, Any]:
        faults = self.ctx.engine.conditions.faults
        return {
            "@odata.id": self.uri,
            "Id": "Faults",
            "Name": "Injected faults",
            "Members": [{"@odata.id": f"{self.uri}/{i}"} for i in faults],
            "Members@odata.count": len(faults),
            "Faults": [{"Id": i, **f.model_dump()} for i, f in faults.items()],
        }

    def child(self, segment: str) -> Node | None:
        if segment in self.ctx.engine.conditions.faults:
            return FaultNode(self.ctx, segment)
        return None

    async def post(self, request: Request) -> Reply:
        data = request.json()
        try:
            fault = fault_adapter.validate_python(data)
        except ValidationError as err:
            errors = err.errors(include_url=False)
            messages = [
                message(
                    "PropertyValueFormatError",
                    str(e.get("input"))[:80],
                    "/".join(str(p) for p in e["loc"]) or "Kind",
                    detail=f"{'/'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}",
                )
                for e in errors
            ] or [message("MalformedJSON")]
            raise RedfishError(400, messages) from None
        fault_id, outcome = await self.ctx.engine.injector.inject(fault)
        if fault_id is None:
            return Reply(200, {"Kind": fault.Kind, "Result": outcome})
        node = FaultNode(self.ctx, fault_id)
        return Reply(201, node.payload(), {"Location": node.uri})

    async def delete(self, request: Request) -> Reply:
        removed, resumed = await self.ctx.engine.injector.remove()
        return Reply(200, {"Removed": removed, "ResumedTasks": resumed})


class FaultNode(Node):
    allow = ("GET", "HEAD", "DELETE")

    def __init__(self, ctx: Context, fault_id: str) -> None:
        super().__init__(ctx, f"{uris.OEM_FAULTS}/{fault_id}")
        self.fault_id = fault_id

    def render(self) -> dict[str, Any]:
        fault = self.ctx.engine.conditions.faults[self.fault_id]
        return {"@odata.id": self.uri, "Id": self.fault_id, **fault.model_dump()}

    async def delete(self, request: Request) -> Reply:
        await self.ctx.engine.injector.remove(self.fault_id)
        return Reply(204)
