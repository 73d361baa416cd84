"""A checked, indexed view of a :class:`~emulator.topology.model.Topology`.

Everything the Redfish service needs to look up per request — a host by name, a device or a
CXL memory chunk by Id, the switch port a device hangs off — is computed here once, after the
cross references of the file were checked.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from emulator.topology.model import (
    PCIE_DEVICE_TYPES,
    CxlDevice,
    DeviceModel,
    MemoryPool,
    PcieDevice,
    Topology,
    _DeviceBase,
)
from manager_api.devices import DeviceType
from manager_api.partitions import fit_problem

__all__ = [
    "FABRIC_CXL",
    "FABRIC_PCIE",
    "Chunk",
    "Device",
    "FabricIndex",
    "HostInfo",
    "Problem",
    "SwitchInfo",
    "Target",
    "check_references",
    "chunk_id",
    "linked_hosts",
]

#: Redfish Fabric Ids; pools are named after them (``fabric-pcie``, ``fabric-cxl``).
FABRIC_PCIE = "PCIe"
FABRIC_CXL = "CXL"

_MIB = 1 << 20
_FABRIC_OF_SECTION = {"pcie": FABRIC_PCIE, "cxl": FABRIC_CXL}


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a topology file: where (dotted path) and what."""

    loc: str
    message: str

    def __str__(self) -> str:
        # A file can hold anything: keys and values with line breaks, values of 100,000 digits.
        loc, message = _one_line(self.loc, 160), _one_line(self.message, 300)
        return f"{loc}: {message}" if loc else message


def _one_line(text: str, limit: int) -> str:
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


@dataclass(frozen=True)
class HostInfo:
    name: str
    uuid: uuid.UUID
    numa_node: int
    index: int


@dataclass(frozen=True)
class SwitchInfo:
    id: str
    fabric: str
    manufacturer: str
    model: str
    #: host name → upstream port Id, in host order
    upstream_ports: dict[str, str]
    #: device Ids in the order of the file
    devices: tuple[str, ...]
    #: inter-switch port Id (``ISL<n>``) → (the switch, the port) at the cable's other end
    interswitch_ports: dict[str, tuple[str, str]] = field(default_factory=dict)


def chunk_id(device: str, index: int) -> str:
    """The target Id of memory chunk ``index`` of CXL device ``device``: ``cxlmem0-chunk2``."""
    return f"{device}-chunk{index}"


@dataclass(frozen=True)
class Chunk:
    """One allocatable slice of a CXL Type-3 device's memory: pre-made (from the topology), or
    carved at run time from a device's pool (``carved``)."""

    id: str
    device: str
    index: int
    size_bytes: int
    offset_bytes: int
    carved: bool = False

    @property
    def size_mib(self) -> int:
        return self.size_bytes // _MIB


@dataclass(frozen=True)
class Device:
    id: str
    fabric: str
    type: DeviceType
    switch: str
    port: str
    model_key: str
    model: DeviceModel
    serial: str
    uuid: uuid.UUID | None
    #: the pre-made chunks; a pool's carved ones are :meth:`FabricIndex.chunks_of`
    chunks: tuple[Chunk, ...] = ()
    #: clients carve this CXL device's chunks (behaviour.memoryChunks "creatable")
    pool: MemoryPool | None = None

    @property
    def subsystem_vendor_id(self) -> int:
        return (
            self.model.subsystem_vendor_id
            if self.model.subsystem_vendor_id is not None
            else self.model.vendor_id
        )


@dataclass(frozen=True)
class Target:
    """What one bind request moves: a whole PCIe device, or one CXL memory chunk."""

    id: str
    device: Device
    chunk: Chunk | None = None

    @property
    def fabric(self) -> str:
        return self.device.fabric


@dataclass
class FabricIndex:
    topology: Topology
    hosts: dict[str, HostInfo] = field(default_factory=dict)
    switches: dict[str, SwitchInfo] = field(default_factory=dict)
    devices: dict[str, Device] = field(default_factory=dict)
    chunks: dict[str, Chunk] = field(default_factory=dict)
    targets: dict[str, Target] = field(default_factory=dict)
    #: fabric → the hosts cabled to any of its switches, in host order (the index does not change
    #: once built; every request of the emulator asks, so it is computed once per fabric)
    _cabled: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)
    #: pool device → its carved chunks by Id, in order of creation: the durable state's chunks,
    #: entered by :meth:`carve` and left by :meth:`uncarve` as they come and go
    _carved: dict[str, dict[str, Chunk]] = field(default_factory=dict, repr=False, compare=False)
    #: the cut link ends this was last computed for → switch → the hosts that reach it through
    #: inter-switch links (every bind asks; the links change only with a LinkRemoved fault)
    _linked: tuple[frozenset[tuple[str, str]], dict[str, frozenset[str]]] | None = field(
        default=None, repr=False, compare=False
    )

    def chunks_of(self, device: Device) -> tuple[Chunk, ...]:
        """``device``'s memory chunks: the pre-made ones, then those carved from its pool."""
        carved = self._carved.get(device.id)
        return device.chunks + tuple(carved.values()) if carved else device.chunks

    def carve(self, chunk: Chunk) -> None:
        """``chunk``, carved from its device's pool, is a target (and a chunk) from now on."""
        device = self.devices[chunk.device]
        self._carved.setdefault(device.id, {})[chunk.id] = chunk
        self.chunks[chunk.id] = chunk
        self.targets[chunk.id] = Target(chunk.id, device, chunk)

    def uncarve(self, ident: str) -> None:
        """The carved chunk ``ident`` is gone (deleted)."""
        chunk = self.chunks.pop(ident, None)
        self.targets.pop(ident, None)
        if chunk is not None:
            self._carved.get(chunk.device, {}).pop(ident, None)

    def fabric_switches(self, fabric: str) -> Iterator[SwitchInfo]:
        return (s for s in self.switches.values() if s.fabric == fabric)

    def fabric_hosts(self, fabric: str) -> tuple[str, ...]:
        """The hosts cabled to a switch of ``fabric``, in host order."""
        found = self._cabled.get(fabric)
        if found is None:
            cabled = {h for s in self.fabric_switches(fabric) for h in s.upstream_ports}
            found = self._cabled[fabric] = tuple(h for h in self.hosts if h in cabled)
        return found

    def fabric_devices(self, fabric: str) -> Iterator[Device]:
        return (d for d in self.devices.values() if d.fabric == fabric)

    def fabrics(self) -> list[str]:
        found = self._cabled.get("")  # "" is no fabric's Id: the fabrics themselves
        if found is None:
            present = {s.fabric for s in self.switches.values()}
            found = self._cabled[""] = tuple(f for f in (FABRIC_PCIE, FABRIC_CXL) if f in present)
        return list(found)

    def host_reaches(self, host: str, device: Device, cut: frozenset[tuple[str, str]] = frozenset()) -> bool:
        """Whether ``host`` is cabled to ``device``'s switch, or to a switch joined to it by a chain
        of inter-switch links none of whose ends (switch, port) is in ``cut``."""
        switch = self.switches[device.switch]
        if host in switch.upstream_ports:
            return True
        if not any(s.interswitch_ports for s in self.switches.values()):
            return False
        return host in self._reaching(cut).get(switch.id, frozenset())

    def _reaching(self, cut: frozenset[tuple[str, str]]) -> Mapping[str, frozenset[str]]:
        if self._linked is None or self._linked[0] != cut:
            self._linked = (cut, linked_hosts(self.switches, cut))
        return self._linked[1]

    def peer_of(self, switch: str, port: str) -> tuple[str, str] | None:
        """The (switch, port) at the other end of the inter-switch link at ``port`` of ``switch``."""
        info = self.switches.get(switch)
        return info.interswitch_ports.get(port) if info is not None else None

    @classmethod
    def build(cls, topology: Topology) -> FabricIndex:
        """Index a topology whose references :func:`check_references` found sound."""
        index = cls(topology=topology)
        creatable = topology.behaviour.memory_chunks == "creatable"
        for i, host in enumerate(topology.hosts):
            index.hosts[host.name] = HostInfo(host.name, host.uuid, host.numa_node, i)
        all_hosts = [h.name for h in topology.hosts]
        link_ports = _link_ports(topology)
        for section, switches in topology.switch_sections():
            fabric = _FABRIC_OF_SECTION[section]
            for sw in switches:
                cabled = sw.hosts if sw.hosts is not None else all_hosts
                ids = []
                for n, dev in enumerate(sw.device_list()):
                    model = topology.models[dev.model]
                    chunks: tuple[Chunk, ...] = ()
                    pool = dev.pool if isinstance(dev, CxlDevice) and creatable else None
                    if isinstance(dev, CxlDevice) and pool is None:
                        # a pool on a service without chunk creation: one chunk of the whole memory
                        count = dev.chunks or 1
                        size = int(model.memory or 0) // count
                        chunks = tuple(
                            Chunk(chunk_id(dev.id, c), dev.id, c, size, c * size) for c in range(count)
                        )
                    device = Device(
                        id=dev.id,
                        fabric=fabric,
                        type=model.type,
                        switch=sw.id,
                        port=dev.port or f"DP{n}",
                        model_key=dev.model,
                        model=model,
                        serial=dev.serial,
                        uuid=dev.uuid if isinstance(dev, PcieDevice) else None,
                        chunks=chunks,
                        pool=pool,
                    )
                    index.devices[dev.id] = device
                    ids.append(dev.id)
                    for chunk in chunks:
                        index.chunks[chunk.id] = chunk
                        index.targets[chunk.id] = Target(chunk.id, device, chunk)
                    if isinstance(dev, PcieDevice):
                        index.targets[dev.id] = Target(dev.id, device)
                index.switches[sw.id] = SwitchInfo(
                    id=sw.id,
                    fabric=fabric,
                    manufacturer=sw.manufacturer,
                    model=sw.model,
                    upstream_ports={h: f"UP{n}" for n, h in enumerate(cabled)},
                    devices=tuple(ids),
                    interswitch_ports=link_ports.get(sw.id, {}),
                )
        return index


def _link_ports(topology: Topology) -> dict[str, dict[str, tuple[str, str]]]:
    """Switch → its inter-switch ports (``ISL<n>``, numbered per switch in the order of the links)
    → the (switch, port) at the other end."""
    ports: dict[str, dict[str, tuple[str, str]]] = {}
    for _, links in topology.link_sections():
        for link in links:
            a, b = link.switches
            a_port, b_port = f"ISL{len(ports.get(a, {}))}", f"ISL{len(ports.get(b, {}))}"
            ports.setdefault(a, {})[a_port] = (b, b_port)
            ports.setdefault(b, {})[b_port] = (a, a_port)
    return ports


def linked_hosts(
    switches: Mapping[str, SwitchInfo], cut: frozenset[tuple[str, str]] = frozenset()
) -> dict[str, frozenset[str]]:
    """Switch → the hosts cabled to any switch joined to it through inter-switch links (itself
    included), leaving out every link one of whose ends (switch, port) is in ``cut``: the switches
    a chain of links joins form one component, and every host of the component reaches all of it."""
    component: dict[str, str] = {}
    for start in switches:
        if start in component:
            continue
        component[start] = start
        pending = [start]
        while pending:
            here = pending.pop()
            for port, (peer, peer_port) in switches[here].interswitch_ports.items():
                if (here, port) in cut or (peer, peer_port) in cut or peer in component:
                    continue
                component[peer] = start
                pending.append(peer)
    hosts: dict[str, set[str]] = {}
    for switch, root in component.items():
        hosts.setdefault(root, set()).update(switches[switch].upstream_ports)
    return {switch: frozenset(hosts[root]) for switch, root in component.items()}


def check_references(topology: Topology) -> list[Problem]:
    """Everything pydantic cannot see: references between sections, uniqueness, sizes."""
    problems, host_names = _check_hosts(topology)
    problems += _check_models(topology)
    problems += _check_shared_blocks(topology, host_names)
    problems += _SwitchChecks(topology, host_names).run()
    problems += _check_links(topology)
    return problems


def _check_links(topology: Topology) -> list[Problem]:
    """Each inter-switch link joins two different switches of its own fabric's section."""
    problems = []
    for (section, switches), (_, links) in zip(
        topology.switch_sections(), topology.link_sections(), strict=True
    ):
        known = {sw.id for sw in switches}
        for n, link in enumerate(links):
            loc = f"{section}.links[{n}].switches"
            a, b = link.switches
            if a == b:
                problems.append(Problem(loc, f"a link joins two different switches, not {a!r} to itself"))
            problems += [
                Problem(
                    f"{loc}[{i}]",
                    f"unknown switch {s!r} (the {section} section has: {', '.join(sorted(known)) or 'none'})",
                )
                for i, s in enumerate(link.switches)
                if s not in known
            ]
    return problems


def _check_hosts(topology: Topology) -> tuple[list[Problem], dict[str, int]]:
    """Unique host names and UUIDs; also each name's index, for the checks that refer to hosts."""
    problems: list[Problem] = []
    host_names: dict[str, int] = {}
    host_uuids: set[uuid.UUID] = set()
    for i, host in enumerate(topology.hosts):
        if host.name in host_names:
            problems.append(Problem(f"hosts[{i}].name", f"duplicate host {host.name!r}"))
        host_names.setdefault(host.name, i)
        if host.uuid in host_uuids:
            problems.append(Problem(f"hosts[{i}].uuid", f"UUID {host.uuid} is used by another host"))
        host_uuids.add(host.uuid)
    return problems, host_names


def _check_models(topology: Topology) -> list[Problem]:
    problems = []
    for key, model in topology.models.items():
        if model.type in (DeviceType.OTHER, DeviceType.STORAGE):
            problems.append(Problem(f"models.{key}.type", "must be one of gpu, nvme, nic, fpga, cxl-memory"))
        if model.type == DeviceType.CXL_MEMORY and not model.memory:
            problems.append(Problem(f"models.{key}.memory", "a cxl-memory model needs its capacity"))
        if model.partitions is not None:
            loc = f"models.{key}.partitions"
            if model.type != DeviceType.GPU:
                problems.append(Problem(loc, f"only a gpu model is partitioned; this one is {model.type}"))
            elif not model.memory:
                problems.append(Problem(f"models.{key}.memory", "a partitioned gpu model needs its memory"))
            else:
                misfit = fit_problem(model.partitions, int(model.memory))
                if misfit is not None:
                    problems.append(Problem(loc, misfit))
    return problems


def _check_shared_blocks(topology: Topology, host_names: dict[str, int]) -> list[Problem]:
    """``behaviour.sharedBlocks``: each a pooled PCIe device shared by two or more known hosts."""
    problems = []
    for block, holders in topology.behaviour.shared_blocks.items():
        loc = f"behaviour.sharedBlocks.{block}"
        if len(set(holders)) < 2:
            problems.append(Problem(loc, "a shared block names two or more different hosts"))
        problems += [Problem(loc, f"unknown host {h!r}") for h in holders if h not in host_names]
        found = next(
            (
                d
                for _, sws in topology.switch_sections()
                for sw in sws
                for d in sw.device_list()
                if d.id == block
            ),
            None,
        )
        if (
            found is None
            or topology.models.get(found.model, None) is None
            or (topology.models[found.model].type == DeviceType.CXL_MEMORY)
        ):
            problems.append(Problem(loc, f"{block!r} is no pooled PCIe device (no resource block)"))
    return problems


class _SwitchChecks:
    """The switches and the devices behind them: unique switch, device and chunk Ids, ports and
    serials; hosts and models that exist; CXL memory that splits into whole-MiB chunks."""

    def __init__(self, topology: Topology, host_names: dict[str, int]) -> None:
        self.topology = topology
        self.host_names = host_names
        self.problems: list[Problem] = []
        # Host names and device/chunk Ids share one namespace: both are Endpoint Ids in a fabric.
        self.seen_ids: dict[str, str] = {name: f"hosts[{i}].name" for name, i in host_names.items()}
        self.serials: dict[str, str] = {}
        #: pool devices (their chunks are carved as "<id>-chunk<n>"), by Id, with where they are
        self.pools: dict[str, str] = {}

    def run(self) -> list[Problem]:
        for section, switches in self.topology.switch_sections():
            switch_ids: set[str] = set()
            for s, sw in enumerate(switches):
                sw_loc = f"{section}.switches[{s}]"
                if sw.id in switch_ids:
                    self.problems.append(Problem(f"{sw_loc}.id", f"duplicate switch {sw.id!r}"))
                switch_ids.add(sw.id)
                for h, name in enumerate(sw.hosts or []):
                    if name not in self.host_names:
                        self.problems.append(Problem(f"{sw_loc}.hosts[{h}]", f"unknown host {name!r}"))
                ports: set[str] = set()
                for d, dev in enumerate(sw.device_list()):
                    self._device(dev, f"{sw_loc}.devices[{d}]", ports)
        for pool, where in self.pools.items():
            carved = re.compile(rf"{re.escape(pool)}-chunk[0-9]+")
            for ident, loc in self.seen_ids.items():
                if carved.fullmatch(ident):
                    what = f"Id {ident!r} is taken by the chunks clients carve from {where}"
                    self.problems.append(Problem(loc, what))
        return self.problems

    def _claim_id(self, ident: str, loc: str) -> None:
        if ident in self.seen_ids:
            self.problems.append(Problem(loc, f"Id {ident!r} is already used at {self.seen_ids[ident]}"))
        else:
            self.seen_ids[ident] = loc

    def _device(self, dev: _DeviceBase, loc: str, ports: set[str]) -> None:
        self._claim_id(dev.id, f"{loc}.id")
        if dev.port:
            if dev.port in ports or dev.port.startswith(("UP", "ISL")):
                self.problems.append(
                    Problem(
                        f"{loc}.port",
                        f"port {dev.port!r} is taken (UP* are host ports, ISL* inter-switch ports)",
                    )
                )
            ports.add(dev.port)
        if dev.serial in self.serials:
            used = self.serials[dev.serial]
            self.problems.append(Problem(f"{loc}.serial", f"serial {dev.serial!r} is already used at {used}"))
        self.serials.setdefault(dev.serial, f"{loc}.serial")
        device_model = self.topology.models.get(dev.model)
        if device_model is None:
            known = ", ".join(sorted(self.topology.models)) or "none defined"
            self.problems.append(Problem(f"{loc}.model", f"unknown model {dev.model!r} (known: {known})"))
            return
        if isinstance(dev, PcieDevice) and device_model.type not in PCIE_DEVICE_TYPES:
            what = f"model {dev.model!r} is {device_model.type}, not a PCIe device type"
            self.problems.append(Problem(f"{loc}.model", what))
        if isinstance(dev, CxlDevice):
            self._memory(dev, device_model, loc)

    def _memory(self, dev: CxlDevice, device_model: DeviceModel, loc: str) -> None:
        """A CXL memory device: its model's capacity splits into its chunks, whose Ids are its own."""
        if device_model.type != DeviceType.CXL_MEMORY:
            what = f"model {dev.model!r} is {device_model.type}, not cxl-memory"
            self.problems.append(Problem(f"{loc}.model", what))
            return
        total = int(device_model.memory or 0)
        if dev.pool is not None:
            self._pool(dev, dev.pool, total, loc)
        count = 1 if dev.pool is not None else dev.chunks or 1
        if total % count or (total // count) % _MIB:
            what = f"{total} bytes do not split into {count} chunks of whole MiB"
            self.problems.append(Problem(f"{loc}.chunks" if count > 1 else f"{loc}.model", what))
        if dev.pool is None:
            for c in range(count):
                self._claim_id(chunk_id(dev.id, c), f"{loc} (chunk {c})")

    def _pool(self, dev: CxlDevice, pool: MemoryPool, total: int, loc: str) -> None:
        self.pools[dev.id] = f"{loc}.pool"
        if dev.chunks is not None:
            what = "a pool's chunks are carved by clients; leave chunks out"
            self.problems.append(Problem(f"{loc}.chunks", what))
        if pool.min_chunk_mib * _MIB > total:
            what = f"a chunk of {pool.min_chunk_mib} MiB does not fit in the device's {total // _MIB} MiB"
            self.problems.append(Problem(f"{loc}.pool.minChunkMiB", what))
