"""Start (or attach to) the q35 guest behind a QEMU host, and talk to its agent.

The guest has one ``pcie-root-port`` per fabric port its host can receive a device on
(:func:`root_ports`), each with its own physical slot number, so the guest kernel lists it as
``/sys/bus/pci/slots/<slot>`` and its native PCIe hot-plug driver (pciehp) enumerates whatever
QEMU plugs into it (QEMU docs/pcie.txt, "Hot-plug"). Two QMP monitors: one for the emulator,
one for whoever owns the guest (a test's fixture, an operator), since a QMP socket serves one
client at a time.

KVM is used where ``/dev/kvm`` really runs this kernel (:func:`accelerator` probes once per
machine and caches the answer), TCG (software emulation) otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.errors import ConfigError, GuestError
from emulator.qemu.image import GUEST_AGENT, GUEST_INIT, GUEST_TMPFS, GuestImage, build_image, cache_dir
from plumbing.logs import get_logger

__all__ = [
    "AGENT_GUEST_PORT",
    "HOST_ADDRESS_IN_GUEST",
    "MEMORY_NODE",
    "AgentError",
    "GuestAgent",
    "GuestConfig",
    "QemuGuest",
    "RootPort",
    "root_ports",
]

log = get_logger(__name__)

#: Where the guest reaches this machine's loopback through QEMU user networking (slirp's gateway).
HOST_ADDRESS_IN_GUEST = "10.0.2.2"
#: The guest agent's port inside the guest; QEMU forwards a free loopback port of the machine to it.
AGENT_GUEST_PORT = 7000
#: Root ports start at this device number of pcie.0, eight functions each (multifunction).
_FIRST_ROOT_SLOT = 0x10
_MAX_ROOT_PORTS = 8 * (0x1F - _FIRST_ROOT_SLOT)
#: The guest's NUMA node of hot-added memory, when it has DIMM slots (:meth:`GuestConfig.memory_args`).
MEMORY_NODE = 1


@dataclass(frozen=True)
class RootPort:
    """One ``pcie-root-port`` of the guest, for one fabric port (``<switch>/<port>``)."""

    fabric_port: str
    #: physical slot number: the guest's ``/sys/bus/pci/slots/<slot>``; also the chassis number
    slot: int

    @property
    def id(self) -> str:
        return f"rp{self.slot}"

    @property
    def addr(self) -> str:
        n = self.slot - 1
        return f"{_FIRST_ROOT_SLOT + n // 8:#x}.{n % 8}"

    def device_arg(self) -> str:
        return (
            f"pcie-root-port,id={self.id},bus=pcie.0,addr={self.addr},chassis={self.slot},"
            f"slot={self.slot}" + (",multifunction=on" if (self.slot - 1) % 8 == 0 else "")
        )


def root_ports(fabric_ports: Sequence[str]) -> list[RootPort]:
    """Slots 1, 2, ... in the order given (the topology's order: stable across restarts)."""
    if len(fabric_ports) > _MAX_ROOT_PORTS:
        raise ConfigError(
            f"a QEMU host takes at most {_MAX_ROOT_PORTS} fabric ports, not {len(fabric_ports)}"
        )
    return [RootPort(port, n) for n, port in enumerate(fabric_ports, start=1)]


class AgentError(GuestError):
    """The guest agent did not answer, or answered with an error."""


@dataclass
class GuestAgent:
    """Client of ``agent.py`` in the guest (blocking; one connection per request)."""

    port: int
    host: str = "127.0.0.1"

    def request(self, wait_for: float = 60.0, **request: Any) -> dict[str, Any]:
        with socket.create_connection((self.host, self.port), timeout=wait_for + 10) as sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as answer_file:
                line = answer_file.readline()
        if not line:
            raise AgentError(f"the guest agent closed the connection ({request.get('op')})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise AgentError(answer["error"])
        return answer

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            self.request(wait_for=timeout, op="ping")
        except (OSError, AgentError, ValueError):
            return False
        return True

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        check: bool = True,
    ) -> dict[str, Any]:
        answer = self.request(wait_for=timeout, op="run", argv=list(argv), env=env or {}, timeout=timeout)
        if check and answer["rc"] != 0:
            raise AgentError(f"{' '.join(argv)} exited {answer['rc']}: {answer['stderr'].strip()[-2000:]}")
        return answer

    def sh(self, script: str, *, timeout: float = 60.0, check: bool = True) -> str:
        return str(self.run(["/bin/sh", "-c", script], timeout=timeout, check=check)["stdout"])

    def spawn(
        self, argv: Sequence[str], *, log: str, env: dict[str, str] | None = None, timeout: float = 600.0
    ) -> int:
        """Start ``argv`` in the background (forked from the preloaded fork server when it serves
        it, waiting up to ``timeout`` for its imports); its pid in the guest."""
        answer = self.request(
            wait_for=timeout, op="spawn", argv=list(argv), env=env or {}, log=log, timeout=timeout
        )
        return int(answer["pid"])

    def preload(self, python: str, modules: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        """Start a fork server in the guest (agent.py, :mod:`plumbing.forkserver`): ``python``
        imports ``modules`` once, in the background; later :meth:`spawn` calls of ``python -m ...``
        or ``python script.py`` with the same ``PYTHON*`` variables fork from it instead of
        starting a new interpreter."""
        self.request(op="preload", python=python, modules=list(modules), env=env or {})

    def preloaded(self, timeout: float = 600.0) -> float:
        """Wait for :meth:`preload` to finish; the seconds its imports took in the guest."""
        return float(self.request(wait_for=timeout, op="preloaded", timeout=timeout)["seconds"])

    def signal(self, pid: int, sig: int = signal.SIGTERM) -> bool:
        return bool(self.request(op="signal", pid=pid, signal=int(sig))["sent"])

    def wait(self, pid: int, timeout: float) -> int | None:
        rc = self.request(wait_for=timeout, op="wait", pid=pid, timeout=timeout)["rc"]
        return None if rc is None else int(rc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: What a kernel prints once it has run its whole init without a root (the probe has none).
_PROBE_DONE = ("Kernel panic", "VFS: Unable to mount root")
#: A kernel under a working KVM gets there in 1-3 s; a /dev/kvm that cannot run it (a nested or
#: paravirtual host: some expose one that runs firmware but hangs in the kernel) never does.
PROBE_SECONDS = 15.0


def _probe_kvm(image: GuestImage, run_dir: Path) -> bool:
    """Boot ``image``'s kernel under KVM without a root; True when it ran its init to the panic."""
    console = run_dir / "kvm-probe.log"
    console.unlink(missing_ok=True)
    qemu = shutil.which("qemu-system-x86_64") or "qemu-system-x86_64"
    argv = [
        qemu, "-machine", "q35", "-accel", "kvm", "-cpu", "host", "-smp", "2", "-m", "256",
        "-nodefaults", "-nographic", "-no-user-config", "-no-reboot",
        "-serial", f"file:{console}", "-kernel", str(image.kernel),
        "-append", "console=ttyS0 panic=-1 mitigations=off",
    ]  # fmt: skip
    with subprocess.Popen(  # noqa: S603 - our own command line
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as proc:
        deadline = time.monotonic() + PROBE_SECONDS
        while time.monotonic() < deadline:
            text = console.read_text(errors="replace") if console.exists() else ""
            if any(marker in text for marker in _PROBE_DONE):
                break
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        text = console.read_text(errors="replace") if console.exists() else ""
    return any(marker in text for marker in _PROBE_DONE)


def accelerator(image: GuestImage) -> str:
    """``kvm`` or ``tcg``. ``FABRIC_DRA_QEMU_ACCEL`` decides when set; else KVM when ``/dev/kvm``
    is usable and boots this kernel (probed once per machine, kernel and QEMU, then cached)."""
    forced = os.environ.get("FABRIC_DRA_QEMU_ACCEL", "")
    if forced in ("kvm", "tcg"):
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    qemu = Path(shutil.which("qemu-system-x86_64") or "qemu-system-x86_64")
    stamp = f"{os.uname().release}:{image.kernel}:{qemu.stat().st_size}:{qemu.stat().st_mtime_ns}"
    answer = cache_dir() / f"accel-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"
    with contextlib.suppress(OSError):
        return answer.read_text().strip()
    started = time.monotonic()
    answer.parent.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="fdq-probe-", dir="/tmp"))
    try:
        chosen = "kvm" if _probe_kvm(image, run_dir) else "tcg"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    log.info(
        "QEMU accelerator probed",
        accel=chosen,
        seconds=round(time.monotonic() - started, 1),
        why="" if chosen == "kvm" else f"/dev/kvm did not boot {image.kernel} within {PROBE_SECONDS:.0f}s",
    )
    answer.write_text(chosen + "\n")
    return chosen


#: The work tree (the guest runs its packages and scripts) and the Python whose virtualenv it runs.
_PROJECT = Path(__file__).resolve().parents[2]


def kept_paths(python: str, project: Path = _PROJECT) -> list[str]:
    """What the guest runs from this machine that lies under a directory the guest covers with a
    tmpfs (a checkout under ``/tmp``, a CI workspace under ``/var/lib``): the initramfs mounts
    each back on top (image.py ``_INIT``). Raises ConfigError for a path the kernel command line
    cannot carry."""
    prefix = Path(python).parent.parent  # <venv>/bin/python: the symlink, not what it points to
    wanted = sorted({str(project), os.path.abspath(prefix)})
    kept: list[str] = []
    for path in wanted:
        if not any(path == f"/{d}" or path.startswith(f"/{d}/") for d in GUEST_TMPFS):
            continue
        if any(path.startswith(k + "/") for k in kept):
            continue
        if any(c.isspace() or c in ',"' for c in path):
            raise ConfigError(
                f"the guest cannot reach {path}: a path on its kernel command line "
                "has no spaces, commas or quotes"
            )
        kept.append(path)
    return kept


@dataclass
class GuestConfig:
    name: str
    fabric_ports: Sequence[str]
    #: directory for the monitors, the console log and the guest's read-write share
    run_dir: Path
    memory_mib: int = 1024
    cpus: int = 2
    #: the Python the guest runs (the work tree's virtualenv, seen through the 9p root)
    python: str = field(default_factory=lambda: sys.executable)
    #: more guest TCP ports to forward from this machine's loopback (see ``QemuGuest.forwarded``)
    forwards: Sequence[int] = ()
    #: memory hot-add (:mod:`emulator.qemu.memory`): this many DIMM slots, room for this much
    #: more memory than ``memory_mib``, and a second NUMA node without CPUs or boot memory for
    #: the DIMMs (0: none of it)
    dimm_slots: int = 0
    hotplug_mib: int = 0

    def memory_args(self) -> list[str]:
        """``-m`` and, with DIMM slots, the two NUMA nodes: node 0 has the CPUs and the boot
        memory, :data:`MEMORY_NODE` only what is hot-added to it, as the
        CPU-less node a CXL memory region becomes (QEMU docs/memory-hotplug.txt; ``mem=`` is
        refused for node memory on current machine types, so the boot memory is a backend)."""
        if not self.dimm_slots:
            return ["-m", str(self.memory_mib)]
        if self.hotplug_mib <= 0:
            raise ConfigError(f"guest {self.name}: {self.dimm_slots} DIMM slots need hotplug_mib > 0")
        last_cpu = self.cpus - 1
        return [
            "-m", f"{self.memory_mib}M,slots={self.dimm_slots},maxmem={self.memory_mib + self.hotplug_mib}M",
            "-object", f"memory-backend-ram,id=boot-mem,size={self.memory_mib}M",
            "-numa", f"node,nodeid=0,cpus=0-{last_cpu},memdev=boot-mem",
            "-numa", f"node,nodeid={MEMORY_NODE}",
        ]  # fmt: skip


class QemuGuest:
    """A running guest: its process (when this object started it), monitors and agent.

    ``run_dir/share`` is mounted read-write at the same path inside the guest (logs, the plugin's
    checkpoint), so both sides name its files alike.
    """

    def __init__(self, config: GuestConfig) -> None:
        self.config = config
        self.ports = root_ports(config.fabric_ports)
        self.proc: subprocess.Popen[bytes] | None = None
        self.agent = GuestAgent(0)
        self.boot_seconds: float | None = None
        #: ``kvm`` or ``tcg`` (set by :meth:`launch`)
        self.accel = "tcg"
        self._launched = 0.0
        #: guest port → the loopback port of this machine that QEMU forwards to it
        self.forwarded: dict[int, int] = {}

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir

    @property
    def qmp_emulator(self) -> Path:
        """The monitor the emulator's QEMU host connects to."""
        return self.run_dir / "qmp-emulator.sock"

    @property
    def qmp_owner(self) -> Path:
        return self.run_dir / "qmp-owner.sock"

    @property
    def share(self) -> Path:
        return self.run_dir / "share"

    @property
    def console_log(self) -> Path:
        return self.run_dir / "console.log"

    def command(self, image: GuestImage, agent_port: int, accel: str = "tcg") -> list[str]:
        append = " ".join(
            [
                "console=ttyS0 quiet panic=-1",
                # boot faster under TCG: no mitigations, no randomisation, no TSC calibration
                "mitigations=off nokaslr tsc=reliable no_timer_check cryptomgr.notests 8250.nr_uarts=1",
                f"fabric_dra_init={GUEST_INIT}",
                f"fabric_dra_agent={GUEST_AGENT}",
                f"fabric_dra_python={self.config.python}",
                f"fabric_dra_hostname={self.config.name}",
                f"fabric_dra_share={self.share}",
            ]
            + [f"fabric_dra_keep={','.join(kept)}" for kept in [kept_paths(self.config.python)] if kept]
        )
        args = [
            "qemu-system-x86_64",
            "-name", self.config.name,
            # no SATA or SMBus controller: nothing of the node needs them, and their drivers
            # would load at boot
            "-machine", "q35,sata=off,smbus=off",
            "-accel", "kvm" if accel == "kvm" else "tcg,thread=multi",
            # TCG: the baseline x86-64 CPU. With "max" the guest's libc picks AVX2 and friends,
            # which TCG emulates more slowly: the guest's Python ran a third slower.
            # rdrand: the kernel's random pool is ready at once, so nothing blocks on getrandom().
            "-cpu", "host" if accel == "kvm" else "qemu64,+rdrand",
            "-smp", str(self.config.cpus),
            *self.config.memory_args(),
            "-nodefaults", "-nographic", "-no-user-config",
            "-serial", f"file:{self.console_log}",
            "-kernel", str(image.kernel),
            "-initrd", str(image.initrd),
            "-append", append,
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={self.share},mount_tag=fdshare,security_model=none,multidevs=remap",
            "-netdev",
            ",".join(
                [f"user,id=net0,hostfwd=tcp:127.0.0.1:{agent_port}-:{AGENT_GUEST_PORT}"]
                + [f"hostfwd=tcp:127.0.0.1:{h}-:{g}" for g, h in self.forwarded.items()]
            ),
            "-device", "virtio-net-pci,netdev=net0,romfile=",
            "-qmp", f"unix:{self.qmp_emulator},server=on,wait=off",
            "-qmp", f"unix:{self.qmp_owner},server=on,wait=off",
        ]  # fmt: skip
        for port in self.ports:
            args += ["-device", port.device_arg()]
        return args

    def launch(self) -> QemuGuest:
        """Start QEMU (the guest boots in the background; see :meth:`wait_booted`). Its monitors
        answer at once, so an emulator can attach while the guest boots."""
        image = build_image()
        self.accel = accelerator(image)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.share.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.agent = GuestAgent(port)
        self.forwarded = {guest_port: _free_port() for guest_port in self.config.forwards}
        self._launched = time.monotonic()
        self.proc = subprocess.Popen(  # noqa: S603 - our own command line
            self.command(image, port, self.accel),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.run_dir / "qemu.stderr", "wb"),  # noqa: SIM115 - the child's
            start_new_session=True,
        )
        while not (self.qmp_emulator.exists() and self.qmp_owner.exists()):
            if self.proc.poll() is not None:
                tail = self.tail()
                self.stop()
                raise RuntimeError(f"QEMU of guest {self.config.name} exited at start:\n{tail}")
            time.sleep(0.05)
        return self

    def wait_booted(self, timeout: float = 180.0) -> float:
        """Wait until the launched guest's agent answers; the seconds since :meth:`launch`."""
        self.boot_seconds = self.wait_agent(timeout, started=self._launched)
        log.info(
            "QEMU guest up", node=self.config.name, accel=self.accel, boot_seconds=round(self.boot_seconds, 1)
        )
        return self.boot_seconds

    def start(self, *, timeout: float = 180.0) -> QemuGuest:
        """Boot the guest and wait until its agent answers; raises RuntimeError with the console tail."""
        self.launch()
        self.wait_booted(timeout)
        return self

    def wait_agent(self, timeout: float, *, started: float | None = None) -> float:
        """Wait until the agent answers (after a start or a reboot); the seconds it took. Raises
        RuntimeError with the console's tail when QEMU exits, the guest's kernel panics (it would
        reboot into the same panic: ``panic=-1``) or ``timeout`` passes."""
        started = time.monotonic() if started is None else started
        panicked_at = self._console_size()
        while not self.agent.ping(timeout=2.0):
            failure = None
            if self.proc is not None and self.proc.poll() is not None:
                failure = f"QEMU exited with {self.proc.returncode}"
            elif self._panicked(panicked_at):
                failure = "the guest's kernel panicked"
            elif time.monotonic() - started > timeout:
                failure = f"its agent did not answer within {timeout:.0f}s"
            if failure is not None:
                tail = self.tail()
                self.stop()
                raise RuntimeError(f"guest {self.config.name} did not boot: {failure}:\n{tail}")
            time.sleep(0.2)
        return time.monotonic() - started

    def _console_size(self) -> int:
        try:
            return self.console_log.stat().st_size
        except OSError:
            return 0

    def _panicked(self, since: int) -> bool:
        try:
            with open(self.console_log, "rb") as console:
                console.seek(since)
                return b"Kernel panic - not syncing" in console.read()
        except OSError:
            return False

    def tail(self, lines: int = 30) -> str:
        parts = []
        for path in (self.console_log, self.run_dir / "qemu.stderr"):
            with contextlib.suppress(OSError):
                parts += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(parts)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def temporary_run_dir(name: str) -> Path:
    """A short directory for a guest's sockets (unix socket paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=f"fdq-{name}-", dir="/tmp"))


def remove_run_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
