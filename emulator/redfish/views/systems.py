"""``/redfish/v1/Systems``: one ComputerSystem per host, showing what is bound to it.

A host's system lists its bound PCIe devices (``PCIeDevices``, ``PCIeFunctions``), its bound
GPUs and FPGAs as Processors, its CXL memory chunks under ``MemoryDomains/CXL``, and the
resource blocks composed into it (``Links.ResourceBlocks``) — whichever style bound them.
``#ComputerSystem.AddResourceBlock`` / ``RemoveResourceBlock`` (the expandable-system use case
of DSP2050) bind and unbind a pooled device's resource block; with ``behaviour.composition:
patch`` there are no actions, and a PATCH of ``Links.ResourceBlocks`` (ReadWrite in the
ComputerSystem CSDL) with ``If-Match`` composes and decomposes instead.
"""

from __future__ import annotations

import functools

from emulator.redfish.engine.operation import Operation
from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.resources import (
    Composition,
    ComputerSystem,
    ComputerSystemLinks,
    MemoryChunks,
    MemoryChunksLinks,
    MemoryDomain,
    Processor,
    ProcessorLinks,
    ProcessorSummary,
    Status,
    ref,
    refs,
)
from emulator.redfish.model.state import OperationKind
from emulator.redfish.tree.http import Reply, Request, parse_body
from emulator.redfish.tree.nodes import CollectionNode, Context, Node, actions, collection_of
from emulator.redfish.views.chassis import processor_model
from emulator.redfish.views.common import (
    Body,
    LinkIn,
    check_reachable,
    device_status,
    function_uri,
    logical_device_uri,
    parameter_error,
)
from emulator.redfish.views.composition import ResourceBlockNode, block_uri
from emulator.redfish.views.outcome import reply_for
from emulator.topology import Device
from manager_api.devices import BindingStyle, DeviceType

__all__ = ["systems_node"]

_MIB = 1 << 20


def systems_node(ctx: Context) -> CollectionNode:
    systems = {h: functools.partial(SystemNode, ctx, h) for h in ctx.index.hosts}
    return collection_of(
        ctx, f"{uris.ROOT}/Systems", "ComputerSystemCollection", "Computer systems (fabric hosts)", systems
    )


class _BlockLinks(Body):
    ResourceBlocks: list[LinkIn]


class _SystemPatch(Body):
    """What a PATCH of a system may change: its composed resource blocks."""

    Links: _BlockLinks


class _BlockParams(Body):
    ResourceBlock: LinkIn
    ResourceBlockETag: str | None = None
    ComputerSystemETag: str | None = None


class SystemNode(Node):
    def __init__(self, ctx: Context, host: str) -> None:
        super().__init__(ctx, uris.system(host))
        self.host = host
        if self._patched:
            self.allow = ("GET", "HEAD", "PATCH")

    @property
    def _patched(self) -> bool:
        """Composed by PATCH of Links.ResourceBlocks, not by actions (behaviour.composition)."""
        return self.ctx.index.topology.behaviour.composition == "patch"

    def block_uris(self) -> list[str]:
        """The resource blocks composed into this host: every bound PCIe device's (whichever
        style bound it), and the shared blocks that name it."""
        shared = self.ctx.index.topology.behaviour.shared_blocks
        ids = [d.id for d in self.bound_devices() if d.type != DeviceType.CXL_MEMORY]
        ids += [b for b, hosts in shared.items() if self.host in hosts and b not in ids]
        return [block_uri(self.ctx, i) for i in ids]

    def bound_devices(self) -> list[Device]:
        """Devices with anything bound to this host (a CXL device counts once per host)."""
        seen: dict[str, Device] = {}
        for binding in self.ctx.engine.bindings.host_bindings(self.host):
            device = self.ctx.index.targets[binding.target].device
            seen.setdefault(device.id, device)
        return list(seen.values())

    def render(self) -> ComputerSystem:
        info = self.ctx.index.hosts[self.host]
        devices = self.bound_devices()
        pcie = [d for d in devices if d.type != DeviceType.CXL_MEMORY]
        processors = [d for d in pcie if d.type in (DeviceType.GPU, DeviceType.FPGA)]
        endpoints = [
            uris.endpoint(f, self.host)
            for f in self.ctx.index.fabrics()
            if any(self.host in s.upstream_ports for s in self.ctx.index.fabric_switches(f))
        ]
        return ComputerSystem(
            odata_id=self.uri,
            Id=self.host,
            Name=self.host,
            Description=f"Fabric host {self.host} (Kubernetes node {self.host})",
            UUID=str(info.uuid),
            HostName=self.host,
            Status=Status(),
            Composition=Composition(UseCases=["ExpandableSystem"]),
            ProcessorSummary=ProcessorSummary(Count=1 + len(processors)),
            Processors=ref(f"{self.uri}/Processors"),
            MemoryDomains=ref(f"{self.uri}/MemoryDomains"),
            PCIeDevices=refs([uris.pcie_device(d) for d in devices]),
            PCIeFunctions=refs([function_uri(d) for d in devices]),
            Links=ComputerSystemLinks(
                ResourceBlocks=refs(self.block_uris()),
                Endpoints=refs(endpoints),
                ManagedBy=[ref(uris.MANAGER)],
            ),
            Actions=None if self._patched else actions(self.uri, *self.action_names()),
        )

    def child(self, segment: str) -> Node | None:
        ctx = self.ctx
        if segment == "Processors":

            def ids() -> list[str]:
                return ["CPU0"] + [
                    d.id for d in self.bound_devices() if d.type in (DeviceType.GPU, DeviceType.FPGA)
                ]

            return CollectionNode(
                ctx,
                f"{self.uri}/Processors",
                "ProcessorCollection",
                f"Processors of {self.host}",
                ids,
                lambda p: SystemProcessorNode(ctx, self, p) if p in ids() else None,
            )
        if segment == "MemoryDomains":
            domains = {"CXL": functools.partial(SystemMemoryDomainNode, ctx, self)}
            name = f"Memory domains of {self.host}"
            return collection_of(ctx, f"{self.uri}/MemoryDomains", "MemoryDomainCollection", name, domains)
        return self.actions_child(segment)

    def action_names(self) -> tuple[str, ...]:
        if self._patched:
            return ()
        return ("ComputerSystem.AddResourceBlock", "ComputerSystem.RemoveResourceBlock")

    def _block(self, uri: str, pointer: str, what: str) -> Device:
        """The pooled device of the resource block at ``uri``; 400 when it is none."""
        device = self.ctx.index.devices.get(uri.rstrip("/").rsplit("/", 1)[-1])
        if device is None or device.type == DeviceType.CXL_MEMORY or block_uri(self.ctx, device.id) != uri:
            raise RedfishError.of(
                400,
                "ResourceNotFound",
                "ResourceBlock",
                uri,
                related=[pointer],
                detail=f"{uri} is not a resource block of this service.",
            )
        return device

    def _composition(self, device: Device, adding: bool, what: str, pointer: str) -> Operation:
        """The bind or unbind that composes ``device`` into this host or takes it out; refused
        (400) when the device cannot go there or is not there."""
        shared = self.ctx.index.topology.behaviour.shared_blocks.get(device.id)
        if shared:
            raise RedfishError.of(
                400,
                "ResourceInUse",
                related=[pointer],
                detail=f"{device.id} is composed into {', '.join(shared)} and cannot be changed.",
            )
        if adding:
            check_reachable(self.ctx, device, self.host, "ResourceBlock", what, pointer=pointer)
        binding = self.ctx.engine.bindings.binding(device.id)
        if not adding and (binding is None or binding.host != self.host):
            detail = f"{device.id} is not composed into {self.host}."
            raise parameter_error("ResourceBlock", what, detail, pointer=pointer)
        return Operation(
            kind=OperationKind.BIND if adding else OperationKind.UNBIND,
            style=BindingStyle.COMPOSITION,
            fabric=device.fabric,
            host=self.host,
            targets=[device.id],
            method="POST",
            uri=self.uri,
            # composition binds join the host's own zone, so the zone view agrees
            zone=self.host if adding else (binding.zone if binding else None),
        )

    async def action(self, name: str, request: Request) -> Reply:
        params = parse_body(_BlockParams, request.json(), action=name)
        device = self._block(params.ResourceBlock.odata_id, "/ResourceBlock", name)
        renderer = self.ctx.renderer
        renderer.check_action_etag(self, params.ComputerSystemETag, "ComputerSystemETag")
        renderer.check_action_etag(
            ResourceBlockNode(self.ctx, device), params.ResourceBlockETag, "ResourceBlockETag"
        )
        op = self._composition(device, name == "ComputerSystem.AddResourceBlock", name, "/ResourceBlock")
        op.uri = f"{self.uri}/Actions/{name}"
        op.body = request.text
        return await reply_for(self.ctx, op, request)

    async def patch(self, request: Request) -> Reply:
        """PATCH of ``Links.ResourceBlocks`` (behaviour.composition "patch"): the blocks listed
        and not composed yet are composed, those composed and not listed are taken out. Like
        services that compose this way, it wants ``If-Match`` (the application checks its value)."""
        if request.header("if-match") is None and self.ctx.renderer.etags:
            # 428 with Base.PreconditionRequired (Base 1.22.1: "did not provide the required
            # precondition such as an If-Match header"); PreconditionFailed is the 412 of a stale one
            raise RedfishError.of(
                428,
                "PreconditionRequired",
                detail=f"A PATCH of {self.uri} needs If-Match with the system's current ETag.",
            )
        body = parse_body(_SystemPatch, request.json())
        pointer = "/Links/ResourceBlocks"
        wanted = [self._block(link.odata_id, pointer, "ResourceBlocks") for link in body.Links.ResourceBlocks]
        current = set(self.block_uris())

        wanted_uris = {block_uri(self.ctx, d.id) for d in wanted}
        adds = [d for d in wanted if block_uri(self.ctx, d.id) not in current]
        removes = [self.ctx.index.devices[u.rsplit("/", 1)[-1]] for u in sorted(current - wanted_uris)]
        if not adds and not removes:
            return Reply(200, self.payload())
        if len(adds) + len(removes) > 1:
            # One change per request keeps one operation (and one task) per PATCH, as the
            # engine runs them; a client composes one block at a time anyway.
            raise RedfishError.of(
                400,
                "PropertyValueNotInList",
                "ResourceBlocks",
                "Links/ResourceBlocks",
                related=[pointer],
                detail="Change one resource block per PATCH (add one or remove one).",
            )
        device, adding = (adds[0], True) if adds else (removes[0], False)
        op = self._composition(device, adding, "ResourceBlocks", pointer)
        op.method = "PATCH"
        op.body = request.text
        return await reply_for(self.ctx, op, request)


class SystemProcessorNode(Node):
    def __init__(self, ctx: Context, system: SystemNode, processor_id: str) -> None:
        super().__init__(ctx, f"{system.uri}/Processors/{processor_id}")
        self.system, self.processor_id = system, processor_id

    def render(self) -> Processor:
        if self.processor_id == "CPU0":
            return Processor(
                odata_id=self.uri,
                Id="CPU0",
                Name="Host CPU",
                ProcessorType="CPU",
                Manufacturer="fabric-dra",
                Model="Emulated host processor",
                Status=Status(),
                Links=ProcessorLinks(
                    Endpoints=refs(
                        [
                            uris.endpoint(f, self.system.host)
                            for f in self.ctx.index.fabrics()
                            if any(
                                self.system.host in s.upstream_ports
                                for s in self.ctx.index.fabric_switches(f)
                            )
                        ]
                    )
                ),
            )
        device = self.ctx.index.devices[self.processor_id]
        return processor_model(self.ctx, device, self.uri)


class SystemMemoryDomainNode(Node):
    def __init__(self, ctx: Context, system: SystemNode) -> None:
        super().__init__(ctx, f"{system.uri}/MemoryDomains/CXL")
        self.system = system

    def _chunks(self) -> dict[str, str]:
        """Chunk target Id → its Id in this domain (the target Id)."""
        return {
            b.target: b.target
            for b in self.ctx.engine.bindings.host_bindings(self.system.host)
            if self.ctx.index.targets[b.target].chunk is not None
        }

    def render(self) -> MemoryDomain:
        size = sum(self.ctx.index.chunks[c].size_bytes for c in self._chunks()) // _MIB
        return MemoryDomain(
            odata_id=self.uri,
            Id="CXL",
            Name="CXL memory",
            Description=f"Pooled CXL memory chunks bound to {self.system.host}",
            Status=Status(),
            MemoryChunks=ref(f"{self.uri}/MemoryChunks"),
            MemorySizeMiB=size,
        )

    def child(self, segment: str) -> Node | None:
        if segment != "MemoryChunks":
            return None
        ctx = self.ctx
        return CollectionNode(
            ctx,
            f"{self.uri}/MemoryChunks",
            "MemoryChunksCollection",
            f"CXL memory chunks of {self.system.host}",
            lambda: sorted(self._chunks()),
            lambda c: SystemChunkNode(ctx, self, c) if c in self._chunks() else None,
        )


class SystemChunkNode(Node):
    def __init__(self, ctx: Context, domain: SystemMemoryDomainNode, chunk_id: str) -> None:
        super().__init__(ctx, f"{domain.uri}/MemoryChunks/{chunk_id}")
        self.domain, self.chunk_id = domain, chunk_id

    def render(self) -> MemoryChunks:
        chunk = self.ctx.index.chunks[self.chunk_id]
        device = self.ctx.index.devices[chunk.device]
        host_chunks = sorted(self.domain._chunks())
        offset = sum(
            self.ctx.index.chunks[c].size_bytes for c in host_chunks[: host_chunks.index(self.chunk_id)]
        )
        return MemoryChunks(
            odata_id=self.uri,
            Id=self.chunk_id,
            Name=f"{self.chunk_id} of {device.id}",
            Status=device_status(self.ctx, device),
            MemoryChunkSizeMiB=chunk.size_mib,
            AddressRangeOffsetMiB=offset // _MIB,
            MediaLocation="Remote",
            Links=MemoryChunksLinks(
                CXLLogicalDevices=[ref(logical_device_uri(device))],
                Endpoints=[ref(uris.endpoint(device.fabric, device.id))],
            ),
        )
