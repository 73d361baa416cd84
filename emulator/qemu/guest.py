"""Start (or attach to) the q35 guest behind a QEMU host, and talk to its agent.

The guest has one ``pcie-root-port`` per fabric port its host can receive a device on
(:func:`root_ports`), each with its own physical slot number, so the guest kernel lists it as
``/sys/bus/pci/slots/<slot>`` and its native PCIe hot-plug driver (pciehp) enumerates whatever
QEMU plugs into it (QEMU docs/pcie.txt, "Hot-plug"). Two QMP monitors: one for the emulator,
one for whoever owns the guest (a test's fixture, an operator), since a QMP socket serves one
client at a time.

TCG (software emulation) is used unless ``/dev/kvm`` can really run a guest: no KVM is assumed.
"""

from __future__ import annotations

import contextlib
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

from emulator.qemu.image import GUEST_AGENT, GUEST_INIT, GuestImage, build_image
from plumbing.logs import get_logger

__all__ = [
    "AGENT_GUEST_PORT",
    "HOST_ADDRESS_IN_GUEST",
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
        raise ValueError(f"a QEMU host takes at most {_MAX_ROOT_PORTS} fabric ports, not {len(fabric_ports)}")
    return [RootPort(port, n) for n, port in enumerate(fabric_ports, start=1)]


class AgentError(RuntimeError):
    pass


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

    def spawn(self, argv: Sequence[str], *, log: str, env: dict[str, str] | None = None) -> int:
        return int(self.request(op="spawn", argv=list(argv), env=env or {}, log=log)["pid"])

    def signal(self, pid: int, sig: int = signal.SIGTERM) -> bool:
        return bool(self.request(op="signal", pid=pid, signal=int(sig))["sent"])

    def wait(self, pid: int, timeout: float) -> int | None:
        rc = self.request(wait_for=timeout, op="wait", pid=pid, timeout=timeout)["rc"]
        return None if rc is None else int(rc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kvm_usable() -> bool:
    """Whether ``/dev/kvm`` can run a guest (a device node alone proves nothing: nested setups
    often expose one that hangs); set FABRIC_DRA_QEMU_ACCEL=kvm to use it."""
    return os.environ.get("FABRIC_DRA_QEMU_ACCEL") == "kvm" and os.access("/dev/kvm", os.R_OK | os.W_OK)


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

    def command(self, image: GuestImage, agent_port: int) -> list[str]:
        accel = "kvm" if kvm_usable() else "tcg,thread=multi"
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
        )
        args = [
            "qemu-system-x86_64",
            "-name", self.config.name,
            "-machine", "q35",
            "-accel", accel,
            "-cpu", "max",
            "-smp", str(self.config.cpus),
            "-m", str(self.config.memory_mib),
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

    def start(self, *, timeout: float = 180.0) -> QemuGuest:
        """Boot the guest and wait until its agent answers; raises RuntimeError with the console tail."""
        image = build_image()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.share.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.agent = GuestAgent(port)
        self.forwarded = {guest_port: _free_port() for guest_port in self.config.forwards}
        started = time.monotonic()
        self.proc = subprocess.Popen(  # noqa: S603 - our own command line
            self.command(image, port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.run_dir / "qemu.stderr", "wb"),  # noqa: SIM115 - the child's
            start_new_session=True,
        )
        while not self.agent.ping(timeout=2.0):
            if self.proc.poll() is not None or time.monotonic() - started > timeout:
                tail = self.tail()
                self.stop()
                raise RuntimeError(f"guest {self.config.name} did not boot within {timeout:.0f}s:\n{tail}")
            time.sleep(0.2)
        self.boot_seconds = time.monotonic() - started
        log.info("QEMU guest up", node=self.config.name, boot_seconds=round(self.boot_seconds, 1))
        return self

    def wait_agent(self, timeout: float) -> float:
        """Wait until the agent answers again (after a reboot); the seconds it took."""
        started = time.monotonic()
        while not self.agent.ping(timeout=2.0):
            if time.monotonic() - started > timeout:
                raise RuntimeError(
                    f"guest {self.config.name}: agent not back within {timeout:.0f}s:\n{self.tail()}"
                )
            time.sleep(0.2)
        return time.monotonic() - started

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
