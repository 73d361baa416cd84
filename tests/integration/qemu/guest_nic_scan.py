"""Scan for a hot-plugged NIC in a QEMU host's guest as fast as the plugin's scanner can, for the
qemu tests' rename scenario (test_qemu_host.py).

``python guest_nic_scan.py OUT SERIAL SECONDS`` writes ``ready`` to OUT, then calls
``HostScanner.find`` in a loop until the NIC with that serial is found (at most SECONDS). udev
renames a new interface (``eth1`` → ``enp3s0``) a few milliseconds after it has written the
interface's database record (docs/plugin.md, "On a real host"): a loop with no pause between
scans looks into that window, where the plugin's scan runs only when an event wakes it. Once
found, it waits ``SETTLE`` seconds (udev renames within milliseconds of writing the record) and writes
one JSON line: the interfaces ``find`` named, the interfaces the device has then, the scans and
each distinct reason the device was not ready.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dra_driver.plugin.hostdev import DeviceIdentity, HostScanner

#: after the scanner counted the NIC ready: how long before its interfaces are read again
SETTLE = 1.0


def main() -> None:
    out, serial, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    identity = DeviceIdentity(name="nic", type="nic", vendor_id="0x8086", device_id="0x10d3", serial=serial)
    scanner = HostScanner(Path("/sys"), real_host=True)
    out.write_text("ready\n")
    reasons: dict[str, int] = {}
    scans = 0
    deadline = time.monotonic() + seconds
    found = None
    while found is None and time.monotonic() < deadline:
        found = scanner.find(identity)
        scans += 1
        reason = scanner.not_ready.pop(identity.name, None)
        if found is None and reason is not None:
            # the interface's name varies per boot; the reason's kind is what is counted
            reasons[reason] = reasons.get(reason, 0) + 1
    result: dict[str, object] = {"scans": scans, "not_ready": reasons, "found": None, "after": None}
    if found is not None:
        time.sleep(SETTLE)
        interfaces = Path(found.sysfs_path) / "net"
        result["found"] = found.net_interfaces
        result["after"] = sorted(p.name for p in interfaces.iterdir()) if interfaces.is_dir() else []
    with out.open("a") as handle:
        handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
