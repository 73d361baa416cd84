"""The guest image of a QEMU host: the machine's own kernel, a tiny initramfs, and the machine's own
root filesystem shared read-only over 9p.

No disk image is built. The initramfs holds busybox (``busybox-static``), the few modules the
guest needs before its root is usable (virtio PCI, 9p, overlay, virtio-net) and an ``/init`` that
mounts the host's ``/`` read-only, mounts everything a node writes (tmpfs, an overlay on ``/etc``,
the read-write share), configures the network and switches to ``guest-init.sh`` beside this file
— the way virtme-ng boots a kernel. The guest thus runs this machine's Python and the work tree's
virtualenv directly, and ``/lib/modules/<version>`` comes from the installed ``linux-image``
package.

Under TCG every instruction is emulated, so the image is shaped to run as little as possible:

* the kernel is booted as its uncompressed ELF ``vmlinux`` through its PVH entry, extracted once
  from ``/boot/vmlinuz-<version>``: decompressing an xz bzImage in the guest costs 10-20 s;
* the early setup runs in the initramfs with the static busybox: each start of a dynamically
  linked program of the 9p root costs 0.1-1 s (the loader maps its libraries over 9p), and the
  setup is some 30 commands.

Both files are built once per machine and cached under ``$XDG_CACHE_HOME/fabric-dra/qemu`` (keyed
by kernel, busybox, modules and init script).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import shutil
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from emulator.errors import GuestError

__all__ = [
    "GUEST_INIT",
    "GUEST_TMPFS",
    "GuestImage",
    "ImageError",
    "build_image",
    "cache_dir",
    "find_kernel",
    "missing_tools",
]

#: The directories of this machine's root the guest covers with a tmpfs of its own (``/tmp``, ``/run``:
#: nothing a node writes there survives a reboot). What the guest must run from under one of them
#: is passed as ``fabric_dra_keep`` (:func:`emulator.qemu.guest.kept_paths`).
GUEST_TMPFS = ("tmp", "run", "var/tmp", "var/log", "var/lib", "var/cache")
#: Second-stage init, run from the shared root filesystem.
GUEST_INIT = Path(__file__).with_name("guest-init.sh")
#: The guest agent (stdlib only, so it starts fast over 9p).
GUEST_AGENT = Path(__file__).with_name("agent.py")
_BUSYBOX = ("/bin/busybox", "/usr/bin/busybox")
_QEMU = "qemu-system-x86_64"
#: What the guest needs before its root is usable (9p root, the /etc overlay, user networking);
#: dependencies come from modules.dep.
_EARLY_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_net")

#: The initramfs's /init: the whole node setup with the static busybox (module docstring), then
#: the second stage (guest-init.sh) from the shared root. Parameters come from the kernel command
#: line (``fabric_dra_<name>=``, set by guest.py). /run and /tmp are tmpfs: nothing a node
#: writes there survives a reboot, as on a real node.
_INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot /bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod "/modules/$m" || echo "initramfs: insmod $m failed"; done
param() { sed -n "s/.*fabric_dra_$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /newroot; then
    echo "initramfs: cannot mount the host root over 9p"; echo o > /proc/sysrq-trigger
fi
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
# What the guest runs from this machine (the work tree, its virtualenv: guest.py passes those under
# a directory that gets a tmpfs) would be hidden by the tmpfs: hold each aside, put it back on top.
n=0; for path in $(param keep | tr , ' '); do
    mkdir -p /keep/$n; mount --bind "$R$path" /keep/$n || echo "initramfs: cannot keep $path"; n=$((n+1))
done
for dir in @TMPFS@; do mount -t tmpfs -o mode=0755 tmpfs $R/$dir; done
n=0; for path in $(param keep | tr , ' '); do
    mkdir -p "$R$path"; mount --move /keep/$n "$R$path" || echo "initramfs: cannot keep $path"; n=$((n+1))
done
chmod 1777 $R/tmp $R/var/tmp
# /etc stays the host's, but writable (modprobe.d, hostname): an overlay with a tmpfs upper
mkdir -p $R/run/etc-upper $R/run/etc-work
mount -t overlay overlay -o lowerdir=$R/etc,upperdir=$R/run/etc-upper,workdir=$R/run/etc-work $R/etc
share=$(param share)
if [ -n "$share" ]; then
    # under /tmp the mount point lives on the guest's tmpfs: make it, so the share keeps its path
    mkdir -p $R$share
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 fdshare $R$share
fi
hostname "$(param hostname)"
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
init=$(param init)
echo "fabric-dra guest: root ready at $(cut -d' ' -f1 /proc/uptime)s" > /dev/console
umount /proc
umount /dev
exec switch_root $R "$init"
""".replace("@TMPFS@", " ".join(GUEST_TMPFS))


class ImageError(GuestError):
    """The guest image cannot be built on this machine (with what is missing)."""


@dataclass(frozen=True)
class GuestImage:
    #: what QEMU's ``-kernel`` boots: the PVH ``vmlinux`` when there is one, else the bzImage
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
    """The ``.ko`` files of :data:`_EARLY_MODULES` and their dependencies, dependencies first."""
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

    for module in _EARLY_MODULES:
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


#: ELF note of a kernel that can be entered in 32-bit protected mode with paging off (PVH boot,
#: Xen's public/elfnote.h XEN_ELFNOTE_PHYS32_ENTRY); QEMU's ``-kernel`` boots such an ELF directly.
_PVH_NOTE_TYPE = 18


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF image carries the PVH entry note (``Xen`` type 18)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for n in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + n * phentsize
        )
        if p_type != 4:  # PT_NOTE
            continue
        at, end = p_offset, p_offset + p_filesz
        while at + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, at)
            name = elf[at + 12 : at + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and note_type == _PVH_NOTE_TYPE:
                return True
            at += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF kernel inside a bzImage (xz or gzip payload, as Linux's scripts/extract-vmlinux
    finds it), or None when there is none this can unpack."""
    for magic, opener in ((b"\xfd7zXZ\x00", lzma.LZMADecompressor), (b"\x1f\x8b\x08", None)):
        at = bzimage.find(magic)
        while at >= 0:
            try:
                if opener is None:
                    data = gzip.GzipFile(fileobj=io.BytesIO(bzimage[at:])).read()
                else:
                    data = opener().decompress(bzimage[at:])
            except (lzma.LZMAError, OSError, EOFError):
                data = b""
            if data[:4] == b"\x7fELF":
                return data
            at = bzimage.find(magic, at + 1)
    return None


def _pvh_kernel(kernel: Path, cache: Path) -> Path:
    """``vmlinux`` of ``kernel`` when it has a PVH entry (cached), else ``kernel`` itself."""
    st = kernel.stat()
    key = hashlib.sha256(f"{kernel}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    elf = cache / f"vmlinux-{kernel.name.removeprefix('vmlinuz-')}-{key}"
    marker = elf.with_name(elf.name + ".none")
    if elf.exists():
        return elf
    if marker.exists():
        return kernel
    data = extract_vmlinux(kernel.read_bytes())
    cache.mkdir(parents=True, exist_ok=True)
    if data is None or not has_pvh_entry(data):
        marker.touch()
        return kernel
    tmp = elf.with_name(f"{elf.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, elf)
    return elf


def cache_dir() -> Path:
    """Where the guest image (and what is probed about this machine) is cached."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fabric-dra" / "qemu"


def build_image(cache: Path | None = None) -> GuestImage:
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
    cache = cache or cache_dir()
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
    return GuestImage(kernel=_pvh_kernel(kernel, cache), initrd=initrd, kernel_version=version)
