"""The guest image of a QEMU host: the machine's own kernel, a tiny initramfs, and the machine's own
root filesystem shared read-only over 9p.

No disk image is built. The initramfs holds busybox (``busybox-static``), the few modules needed
to mount a 9p root (virtio PCI, 9pnet, 9p) and an ``/init`` that mounts the host's ``/`` and
switches to ``guest-init.sh`` beside this file — the way virtme-ng boots a kernel. The guest thus
runs this machine's Python and the work tree's virtualenv directly, and ``/lib/modules/<version>``
comes from the installed ``linux-image`` package. The initramfs is built once per machine and
cached under ``$XDG_CACHE_HOME/fabric-dra/qemu`` (keyed by kernel, busybox and init script).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GUEST_INIT",
    "GuestImage",
    "ImageError",
    "build_image",
    "find_kernel",
    "missing_tools",
]

#: Second-stage init, run from the shared root filesystem.
GUEST_INIT = Path(__file__).with_name("guest-init.sh")
#: The guest agent (stdlib only, so it starts fast over 9p).
GUEST_AGENT = Path(__file__).with_name("agent.py")
_BUSYBOX = ("/bin/busybox", "/usr/bin/busybox")
_QEMU = "qemu-system-x86_64"
#: What the initramfs needs to mount a 9p root; dependencies come from modules.dep.
_ROOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p")

_INIT = """#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot /bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod "/modules/$m" || echo "initramfs: insmod $m failed"; done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /newroot; then
    echo "initramfs: cannot mount the host root over 9p"; echo o > /proc/sysrq-trigger
fi
init=$(sed -n 's/.*fabric_dra_init=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
umount /proc
umount /dev
exec switch_root /newroot "$init"
"""


class ImageError(RuntimeError):
    """The guest image cannot be built on this machine (with what is missing)."""


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path
    kernel_version: str


def missing_tools() -> list[str]:
    """What this machine lacks to run a QEMU host, as install hints; empty when it has everything."""
    missing = []
    if shutil.which(_QEMU) is None:
        missing.append(f"{_QEMU} (apt-get install qemu-system-x86)")
    if not any(os.path.exists(p) for p in _BUSYBOX):
        missing.append("a static busybox (apt-get install busybox-static)")
    try:
        find_kernel()
    except ImageError as err:
        missing.append(str(err))
    if not os.path.exists("/lib/systemd/systemd-udevd"):
        missing.append("systemd-udevd (apt-get install udev)")
    return missing


def find_kernel() -> tuple[Path, str]:
    """The newest ``/boot/vmlinuz-<version>`` whose ``/lib/modules/<version>`` is installed."""
    candidates = []
    for path in Path("/boot").glob("vmlinuz-*"):
        version = path.name.removeprefix("vmlinuz-")
        if (Path("/lib/modules") / version / "modules.dep").exists() and os.access(path, os.R_OK):
            candidates.append((path, version))
    if not candidates:
        raise ImageError(
            "a kernel with its modules in /boot and /lib/modules (apt-get install linux-image-amd64)"
        )
    return max(candidates, key=lambda c: c[1])


def _module_order(version: str) -> list[Path]:
    """The ``.ko`` files of :data:`_ROOT_MODULES` and their dependencies, dependencies first."""
    base = Path("/lib/modules") / version
    deps: dict[str, list[str]] = {}
    for line in (base / "modules.dep").read_text().splitlines():
        name, _, rest = line.partition(":")
        deps[name] = rest.split()
    by_name = {Path(p).name.removesuffix(".ko").replace("-", "_"): p for p in deps}
    order: list[str] = []

    def visit(path: str) -> None:
        for dep in deps.get(path, []):
            visit(dep)
        if path not in order:
            order.append(path)

    for module in _ROOT_MODULES:
        if module not in by_name:
            # built into the kernel: nothing to load
            continue
        visit(by_name[module])
    return [base / p for p in order]


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A ``newc`` cpio archive (the initramfs format, Documentation/driver-api/early-userspace)."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
        out.write(b"070701" + b"".join(f"{f:08x}".encode() for f in fields))
        out.write(encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))
    return out.getvalue()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fabric-dra" / "qemu"


def build_image(cache_dir: Path | None = None) -> GuestImage:
    """The kernel and the (cached) initramfs; raises :class:`ImageError` naming what is missing."""
    missing = missing_tools()
    if missing:
        raise ImageError("cannot run a QEMU host: missing " + "; ".join(missing))
    kernel, version = find_kernel()
    busybox = Path(next(p for p in _BUSYBOX if os.path.exists(p)))
    modules = _module_order(version)
    digest = hashlib.sha256(_INIT.encode())
    for path in (busybox, *modules):
        st = path.stat()
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    cache = cache_dir or _cache_dir()
    initrd = cache / f"initramfs-{version}-{digest.hexdigest()[:16]}.cpio.gz"
    if not initrd.exists():
        entries: list[tuple[str, int, bytes]] = [
            ("bin", stat.S_IFDIR | 0o755, b""),
            ("modules", stat.S_IFDIR | 0o755, b""),
            ("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()),
            ("init", stat.S_IFREG | 0o755, _INIT.encode()),
            ("modules.order", stat.S_IFREG | 0o644, "\n".join(m.name for m in modules).encode() + b"\n"),
        ]
        entries += [(f"modules/{m.name}", stat.S_IFREG | 0o644, m.read_bytes()) for m in modules]
        cache.mkdir(parents=True, exist_ok=True)
        tmp = initrd.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(gzip.compress(_cpio(entries), compresslevel=1))
        os.replace(tmp, initrd)
    return GuestImage(kernel=kernel, initrd=initrd, kernel_version=version)
