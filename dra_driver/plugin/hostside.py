"""What the plugin does to a device on the host itself: tell who still uses it, reset it between
tenants (a PCIe function-level reset), and unbind and remove it before the fabric detaches it.
Only files the kernel provides are written: an emulated tree has none of them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dra_driver.plugin.hostview import DeviceInUse, HostDevice, listdir, read_attr
from plumbing.logs import get_logger

__all__ = ["HostSide"]

log = get_logger(__name__)


class HostSide:
    """Acts on devices of one sysfs tree (``real_host``: a real kernel's, with ``/dev`` and ``/proc``)."""

    def __init__(self, sysfs_root: Path, *, real_host: bool) -> None:
        self.root = sysfs_root
        self.real_host = real_host

    def users(self, device: HostDevice) -> str | None:
        """Who still uses ``device`` on this host (mounted, held open), or None. Real hosts only.

        A block device that the kernel will not open exclusively (``O_EXCL``) is mounted or held
        by a filesystem, RAID or LVM; a process with one of the device nodes open is found in
        ``/proc/<pid>/fd`` as ``fuser`` does.
        """
        if not self.real_host:
            return None
        for node in device.device_nodes:
            if not os.path.basename(node).startswith("nvme") or "n" not in os.path.basename(node)[4:]:
                continue
            try:
                fd = os.open(node, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
            except OSError as err:
                if err.errno == errno.EBUSY:
                    return f"{node} is mounted or held exclusively"
                continue
            os.close(fd)
        holders = _open_by(set(device.device_nodes))
        if holders:
            return "opened by " + ", ".join(holders)
        return None

    def reset(self, device: HostDevice) -> str | None:
        """Function-level reset of a PCIe device: ``1`` written to its sysfs ``reset`` file
        (Documentation/ABI/testing/sysfs-bus-pci; the kernel picks the method: FLR, AF FLR, PM,
        bus). Blocking. None when done, else why not (one line): no PCIe function, no ``reset``
        file (the device supports no reset method), or the write refused. The file is opened
        without ``O_CREAT`` (a missing one is a failure, never created) and appended to: sysfs
        ignores the offset, and an emulated host's file keeps one line per reset."""
        if device.pci_address is None:
            return "it has no PCIe function on this host to reset"
        path = self.root / "bus" / "pci" / "devices" / device.pci_address / "reset"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            return f"{path} does not exist: the device supports no reset method"
        except OSError as err:
            return f"cannot open {path}: {err.strerror}"
        try:
            os.write(fd, b"1\n")
        except OSError as err:
            return f"writing 1 to {path} failed: {err.strerror}"
        finally:
            os.close(fd)
        log.info("device reset (function-level)", device_path=str(path.parent))
        return None

    def remove(self, device: HostDevice) -> None:
        """Unbind the driver and remove a PCIe device the kernel way (blocking: the driver may take
        seconds). Only files the kernel provides are written: an emulated tree has none of them."""
        if device.pci_address is None:
            return  # CXL regions are torn down by the fabric; nothing for the host to do here
        dev = Path(device.sysfs_path)
        if self.real_host:
            reason = self.users(device)
            if reason is not None:
                raise DeviceInUse(
                    f"it is still in use on this node ({device.pci_address}: {reason}); it was neither "
                    "removed nor detached"
                )
        unbind = dev / "driver" / "unbind"
        if unbind.exists():
            unbind.write_text(device.pci_address)
            log.info("driver unbound", device_path=str(dev), driver=device.driver)
        remove = dev / "remove"
        if remove.exists():
            remove.write_text("1")
            log.info("device removed from the host", device_path=str(dev))


#: What udev's processes are called (the daemon, and its workers since systemd 247).
_UDEV_PROCESSES = frozenset({"systemd-udevd", "(udev-worker)", "udevd"})


def _open_by(nodes: set[str]) -> list[str]:
    """``<comm>[<pid>]`` of every process with one of ``nodes`` open (like ``fuser``)."""
    if not nodes:
        return []
    found = []
    me = os.getpid()
    for pid in listdir(Path("/proc")):
        if not pid.isdigit() or int(pid) == me:
            continue
        for fd in listdir(Path("/proc") / pid / "fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target in nodes:
                comm = read_attr(Path("/proc") / pid / "comm") or "?"
                # udev opens a disk briefly to probe it after a change (its inotify watch): that
                # is no user, and the kernel ends the probe when the device goes
                if comm not in _UDEV_PROCESSES:
                    found.append(f"{comm}[{pid}]")
                break
    return found
