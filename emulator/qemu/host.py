"""The emulator's side of a QEMU host: a bind becomes a QMP ``device_add``, an unbind a ``device_del``.

Each PCIe device the host can receive has its own root port in the guest (its fabric port's,
:func:`fabric_ports`), so a device always lands at the same place. The QEMU device model that
stands in for it is chosen by the PCI vendor and device ID of its topology model
(:data:`STAND_INS`): the Redfish view then tells the truth about what the guest will see, and the
node recognises the device by the same identity as on real hardware (docs/plugin.md, "On a real
host"):

* NVMe ``1b36:0010`` → QEMU ``nvme`` with ``serial=<SerialNumber>`` (the NVMe controller serial,
  at most 20 characters) and a small raw backing file whose first line names the device;
* NIC ``8086:10d3`` / ``8086:10c9`` → ``e1000e`` / ``igb``. QEMU derives their PCIe Device Serial
  Number from the MAC address as Intel NICs do (``aa-bb-cc-ff-ff-dd-ee-ff``), so the serial must be
  in that form and the MAC is taken from it;
* GPU/FPGA stand-ins ``1234:11e8`` (``edu``) and ``1b36:0005`` (``pci-testdev``): no serial at all;
  the node matches them by vendor and device ID only.

An unbind completes when QEMU reports ``DEVICE_DELETED`` (the guest let the device go); when the
guest does not within ``release_seconds`` the operation fails and the binding stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator.errors import ConfigError, GuestError
from emulator.qemu.guest import GuestConfig, QemuGuest, root_ports
from emulator.qemu.qmp import QmpClient, QmpError
from emulator.topology.index import FabricIndex, Problem
from emulator.topology.model import QemuOptions
from manager_api.models import DeviceType
from plumbing.logs import get_logger

__all__ = [
    "STAND_INS",
    "HostUnplugError",
    "QemuHost",
    "QemuHosts",
    "StandIn",
    "check_qemu_hosts",
    "fabric_ports",
    "mac_of_serial",
]

log = get_logger(__name__)

#: Size of an NVMe stand-in's backing file (sparse; the first line names the device).
NVME_BACKING_BYTES = 16 << 20
_DSN_FORM = re.compile(r"^([0-9a-f]{6})ffff([0-9a-f]{6})$")


@dataclass(frozen=True)
class StandIn:
    driver: str
    types: frozenset[DeviceType]
    #: what the guest can read back as the device's serial: "nvme", "dsn" or None
    serial: str | None


STAND_INS: dict[tuple[int, int], StandIn] = {
    (0x1B36, 0x0010): StandIn("nvme", frozenset({DeviceType.NVME}), "nvme"),
    (0x8086, 0x10D3): StandIn("e1000e", frozenset({DeviceType.NIC}), "dsn"),
    (0x8086, 0x10C9): StandIn("igb", frozenset({DeviceType.NIC}), "dsn"),
    (0x1234, 0x11E8): StandIn("edu", frozenset({DeviceType.GPU, DeviceType.FPGA}), None),
    (0x1B36, 0x0005): StandIn("pci-testdev", frozenset({DeviceType.GPU, DeviceType.FPGA}), None),
}


class HostUnplugError(GuestError):
    """The guest did not release a device (or QEMU refused the change); the binding stays."""


def _plain_serial(serial: str) -> str:
    return serial.lower().replace("-", "").replace(":", "").removeprefix("0x")


def mac_of_serial(serial: str) -> str | None:
    """The MAC whose QEMU-derived DSN is ``serial`` (``aabbccffffddeeff`` → ``aa:bb:cc:dd:ee:ff``)."""
    match = _DSN_FORM.match(_plain_serial(serial))
    if match is None:
        return None
    raw = match.group(1) + match.group(2)
    return ":".join(raw[i : i + 2] for i in range(0, 12, 2))


def qemu_hosts(index: FabricIndex) -> dict[str, QemuOptions]:
    return {h.name: h.qemu or QemuOptions() for h in index.topology.hosts if h.kind == "qemu"}


def fabric_ports(index: FabricIndex, host: str) -> list[str]:
    """``<switch>/<port>`` of every PCIe device ``host`` can receive, in topology order."""
    return [
        f"{d.switch}/{d.port}"
        for d in index.devices.values()
        if d.type != DeviceType.CXL_MEMORY and index.host_reaches(host, d)
    ]


def check_qemu_hosts(index: FabricIndex) -> list[Problem]:
    """What a topology's QEMU hosts cannot stand in for, one problem per device."""
    problems = []
    for host in qemu_hosts(index):
        for dev in index.devices.values():
            if not index.host_reaches(host, dev):
                continue
            loc = f"device {dev.id} (reachable from qemu host {host})"
            if dev.type == DeviceType.CXL_MEMORY:
                problems.append(Problem(loc, "a QEMU host takes PCIe devices only; cable CXL elsewhere"))
                continue
            stand_in = STAND_INS.get((dev.model.vendor_id, dev.model.device_id))
            if stand_in is None or dev.type not in stand_in.types:
                known = ", ".join(
                    f"{v:04x}:{d:04x} {s.driver} ({'/'.join(sorted(t.value for t in s.types))})"
                    for (v, d), s in STAND_INS.items()
                )
                problems.append(
                    Problem(
                        loc,
                        f"model {dev.model_key} ({dev.model.vendor_id:04x}:{dev.model.device_id:04x}, "
                        f"{dev.type.value}) has no QEMU stand-in; use one of: {known}",
                    )
                )
            elif stand_in.serial == "nvme" and len(dev.serial) > 20:
                problems.append(Problem(loc, f"an NVMe serial has at most 20 characters: {dev.serial!r}"))
            elif stand_in.serial == "dsn" and mac_of_serial(dev.serial) is None:
                problems.append(
                    Problem(
                        loc,
                        f"serial {dev.serial!r} must be a MAC-derived PCIe DSN like 525400ffff000001 "
                        f"({stand_in.driver} derives its DSN from its MAC)",
                    )
                )
    return problems


def _write_backing_file(path: Path, first_line: str) -> None:
    with open(path, "wb") as handle:
        handle.write(first_line.encode())
        handle.truncate(NVME_BACKING_BYTES)


def device_qom_id(target: str) -> str:
    return f"fd-{target}"


class QemuHost:
    """One guest, as the engine sees it: plug, unplug, reconcile."""

    def __init__(self, name: str, index: FabricIndex, options: QemuOptions, state_dir: Path) -> None:
        self.name = name
        self.index = index
        self.options = options
        self.dir = state_dir / "qemu" / name
        self.ports = {p.fabric_port: p for p in root_ports(fabric_ports(index, name))}
        self.guest: QemuGuest | None = None
        self.qmp: QmpClient | None = None
        self._deleted: dict[str, asyncio.Event] = {}

    @property
    def monitor(self) -> Path:
        if self.options.monitor is not None:
            return Path(self.options.monitor)
        if self.guest is None:
            raise RuntimeError(f"QEMU host {self.name}: no monitor given and no guest started")
        return self.guest.qmp_emulator

    async def start(self) -> None:
        """Attach to the configured monitor, or boot a guest of our own first."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.options.monitor is None:
            from emulator.qemu.guest import temporary_run_dir  # a short path for the sockets

            self.guest = QemuGuest(
                GuestConfig(
                    name=self.name,
                    fabric_ports=list(self.ports),
                    run_dir=temporary_run_dir(self.name),
                    memory_mib=self.options.memory_mib,
                    cpus=self.options.cpus,
                )
            )
            await asyncio.to_thread(self.guest.start)
        self.qmp = QmpClient(self.monitor)
        await self.qmp.connect()
        self.qmp.listen(self._on_event)
        log.info("QEMU host attached", node=self.name, monitor=str(self.monitor))

    def _on_event(self, event: str, data: dict[str, Any], _when: float) -> None:
        if event == "DEVICE_DELETED" and "device" in data:
            self._deleted.setdefault(data["device"], asyncio.Event()).set()

    def _qmp(self) -> QmpClient:
        if self.qmp is None:
            raise RuntimeError(f"QEMU host {self.name} is not started: no monitor connection")
        return self.qmp

    async def present(self) -> set[str]:
        """QOM ids of the fabric devices plugged into the guest now."""
        found = set()
        for item in await self._qmp().execute("qom-list", path="/machine/peripheral"):
            if item.get("name", "").startswith("fd-"):
                found.add(item["name"])
        return found

    def _target_info(self, target: str) -> tuple[Any, StandIn]:
        dev = self.index.targets[target].device
        stand_in = STAND_INS[(dev.model.vendor_id, dev.model.device_id)]
        return dev, stand_in

    async def plug(self, target: str) -> None:
        qmp = self._qmp()
        dev, stand_in = self._target_info(target)
        port = self.ports[f"{dev.switch}/{dev.port}"]
        qom = device_qom_id(target)
        args: dict[str, Any] = {"driver": stand_in.driver, "id": qom, "bus": port.id}
        if stand_in.driver == "nvme":
            node = f"blk-{target}"
            image = self.dir / f"{target}.img"
            if not image.exists():
                await asyncio.to_thread(_write_backing_file, image, f"fabric-dra {target} {dev.serial}\n")
            with contextlib.suppress(QmpError):  # left over from an unplug that did not finish
                await qmp.execute("blockdev-del", **{"node-name": node})
            await qmp.execute(
                "blockdev-add",
                **{"driver": "raw", "node-name": node, "file": {"driver": "file", "filename": str(image)}},
            )
            args |= {"drive": node, "serial": dev.serial}
        elif stand_in.serial == "dsn":
            args["mac"] = mac_of_serial(dev.serial)
        self._deleted.pop(qom, None)
        started = time.monotonic()
        await qmp.execute("device_add", **args)
        log.info(
            "device plugged into QEMU host",
            node=self.name,
            device=target,
            model=stand_in.driver,
            root_port=port.id,
            seconds=round(time.monotonic() - started, 3),
        )

    async def unplug(self, target: str) -> None:
        """``device_del`` and wait for ``DEVICE_DELETED``; raises :class:`HostUnplugError` past the limit."""
        qmp = self._qmp()
        qom = device_qom_id(target)
        event = self._deleted.setdefault(qom, asyncio.Event())
        started = time.monotonic()
        try:
            await qmp.execute("device_del", id=qom)
        except QmpError as err:
            if err.error_class != "DeviceNotFound":
                raise HostUnplugError(
                    f"QEMU refused to unplug {target} from {self.name}: {err.desc}"
                ) from err
            event.set()  # already gone (released after an earlier unbind gave up)
        try:
            await asyncio.wait_for(event.wait(), self.options.release_seconds)
        except TimeoutError:
            raise HostUnplugError(
                f"the guest {self.name} did not release {target} within {self.options.release_seconds:.0f}s "
                "(device in use, hot-plug driver not answering, or the guest is stopped); "
                f"it stays bound to {self.name}"
            ) from None
        self._deleted.pop(qom, None)
        with contextlib.suppress(QmpError):
            await qmp.execute("blockdev-del", **{"node-name": f"blk-{target}"})
        log.info(
            "device released by QEMU host",
            node=self.name,
            device=target,
            seconds=round(time.monotonic() - started, 3),
        )

    async def reconcile(self, bound: set[str]) -> None:
        """Make the guest hold exactly ``bound`` (after an emulator restart)."""
        present = await self.present()
        for qom in sorted(present - {device_qom_id(t) for t in bound}):
            target = qom.removeprefix("fd-")
            log.warning("unplugging a device the fabric no longer binds", node=self.name, device=target)
            with contextlib.suppress(HostUnplugError, QmpError):
                await self.unplug(target)
        for target in sorted(bound):
            if device_qom_id(target) not in present:
                await self.plug(target)

    async def close(self) -> None:
        if self.qmp is not None:
            await self.qmp.close()
        if self.guest is not None:
            await asyncio.to_thread(self.guest.stop)


class QemuHosts:
    """Every QEMU host of a topology, by name."""

    def __init__(self, index: FabricIndex, state_dir: Path) -> None:
        problems = check_qemu_hosts(index)
        if problems:
            raise ConfigError("topology: " + "; ".join(str(p) for p in problems))
        self.hosts = {
            name: QemuHost(name, index, options, state_dir) for name, options in qemu_hosts(index).items()
        }

    def __contains__(self, host: str) -> bool:
        return host in self.hosts

    def __getitem__(self, host: str) -> QemuHost:
        return self.hosts[host]

    async def start(self, bindings: dict[str, set[str]]) -> None:
        for name, host in self.hosts.items():
            await host.start()
            await host.reconcile(bindings.get(name, set()))

    async def close(self) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                await host.close()
