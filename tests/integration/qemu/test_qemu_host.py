"""The plugin's real-host path against a real kernel: a QEMU guest as the node (docs/plugin.md,
"On a real host"; docs/emulator.md, "QEMU hosts").

One guest per run: the scenarios are steps of one test item (why: its docstring). On the
machine: the emulator (its ``node-q`` host is ``kind: qemu``, attached to the guest's monitor),
the fabric manager and the API test server. In the guest: ``fabric-dra plugin --host-mode real``
and a kubelet-protocol client (guest_kubelet.py), both forked from the guest agent's fork server
(emulator/qemu/agent.py) and reaching the machine through QEMU user networking.

Every scenario leaves the node as it found it (:meth:`Node.clean` unprepares what a failed one
left behind), so one failure does not fail the scenarios after it. The figures printed (``-s``)
are those of docs/plugin.md, "On a real host", and docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from emulator.qemu.guest import HOST_ADDRESS_IN_GUEST, GuestConfig, QemuGuest, temporary_run_dir
from emulator.qemu.qmp import QmpClient
from fabric_dra_testbed.stack import Role
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.emulator import RunningEmulator, run_emulator, zone_add, zone_remove
from tests.support.fabric_manager import start_manager
from tests.support.plugin import ClaimRef, PluginStack
from tests.support.waiting import wait_until

from .guest_kubelet import REPLACED
from .guests import GUEST_ENV, compile_for_guest, skip_without_tools, tail

# Generous limits: under TCG on a loaded 2-core machine the guest runs 20-30 times slower than
# the machine; a slow run must not fail. The one test item is the whole suite: a run with QEMU at
# a quarter of a core (load average 22) took 883 s. Run first (slow): 2-5 minutes on one worker.
pytestmark = [pytest.mark.qemu, pytest.mark.slow(seconds=150), pytest.mark.timeout(1200)]

# Runs wherever QEMU, a kernel, a static busybox and udev are installed.
skip_without_tools()

NODE = "node-q"
#: guest ports forwarded from this machine's loopback: the kubelet client, the plugin's metrics
KUBELET_PORT = 7001
METRICS_PORT = 7002
#: where the guest reaches the machine's loopback services
GUEST_HOST = HOST_ADDRESS_IN_GUEST
#: how long a release may take in the guest before the emulator's unbind gives up
RELEASE_SECONDS = 6
#: the plugin's --visible-timeout: a prepare still waiting then answers a retriable error and the
#: kubelet (here GuestKubelet.prepare) calls again, so it bounds only the failed-probe test's wait
VISIBLE_TIMEOUT = 8
#: What the guest's programs import, preloaded once per boot by the agent's fork server: the plugin
#: and the kubelet client then start in seconds instead of 30-60 s each.
#: Exactly what they import (``fabric-dra plugin`` imports only the plugin's role, and a plain
#: kubeconfig is read with yaml alone): each module costs some 15 times its import time on this
#: machine.
PRELOAD = [
    "fabric_dra.cli",
    "dra_driver.plugin.cli",
    "dra_driver.plugin.config",
    "dra_driver.plugin.server",
    "manager_api.client",
    "plumbing.kube",
    "pyudev",
    "yaml",
    "kube_standin.kubelet_client",
]

TOPOLOGY: dict[str, Any] = {
    "version": 1,
    "service": {"uuid": "7b0a3c52-5d8e-4b43-9a3e-3d0c3f1d5a10"},
    "hosts": [
        {
            "name": NODE,
            "uuid": "0e6f6a4e-2f4d-4c6b-8f3e-6a1b2c3d4e5f",
            "kind": "qemu",
            "qemu": {"monitor": "<set by the fixture>", "releaseSeconds": RELEASE_SECONDS},
        }
    ],
    "models": {
        "qemu-nvme": {
            "type": "nvme", "manufacturer": "QEMU", "model": "QEMU NVMe Ctrl",
            "vendorId": "0x1b36", "deviceId": "0x0010", "classCode": "0x010802", "memory": "16MiB",
        },
        "qemu-e1000e": {
            "type": "nic", "manufacturer": "Intel", "model": "82574L (QEMU e1000e)",
            "vendorId": "0x8086", "deviceId": "0x10d3", "classCode": "0x020000",
        },
        "qemu-edu": {
            "type": "gpu", "manufacturer": "QEMU", "model": "edu (GPU stand-in)",
            "vendorId": "0x1234", "deviceId": "0x11e8", "classCode": "0x00ff00",
        },
    },
    "pcie": {
        "switches": [
            {
                "id": "qsw0",
                "devices": [
                    {"id": "nvme-0", "model": "qemu-nvme", "serial": "FDQNVME0000"},
                    {"id": "nvme-1", "model": "qemu-nvme", "serial": "FDQNVME0001"},
                    {"id": "nic-0", "model": "qemu-e1000e", "serial": "525400ffff0000a1"},
                    {"id": "gpu-0", "model": "qemu-edu", "serial": "FDQEDU0000"},
                ],
            }
        ]
    },
}  # fmt: skip
FABRIC_PORTS = [f"qsw0/DP{n}" for n in range(4)]


def _unreachable(error: str) -> bool:
    """The API server's or the manager's connection dropped: QEMU's user networking under TCG
    loses an idle one at times, and the kubelet just calls again."""
    return "unreachable" in error.lower()


def _transient(error: str) -> bool:
    """A prepare error the kubelet just calls again for: a dropped connection, or the device still
    on its way (the visible timeout)."""
    return _unreachable(error) or "not usable after" in error or "did not appear" in error


class GuestKubelet:
    """The guest's kubelet-protocol client, over its forwarded port."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, request: dict[str, Any], timeout: float = 180.0) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as answers:
                line = answers.readline()
        if not line:
            raise ConnectionError("the guest kubelet closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def prepare(self, ref: ClaimRef, attempts: int = 4) -> dict[str, Any]:
        """NodePrepareResources, called again as the kubelet does while the answer is transient or
        the call failed because the plugin registered again meanwhile."""
        for _ in range(attempts):
            answer = self.call({"op": "prepare", "claims": [ref.__dict__]})
            if answer.get("_error") == REPLACED:
                continue
            assert "_error" not in answer, answer
            result = dict(answer[ref.uid])
            if not _transient(result["error"]):
                break
        return result

    def unprepare(self, ref: ClaimRef, attempts: int = 4) -> str:
        """NodeUnprepareResources, called again as the kubelet does after a dropped connection."""
        for _ in range(attempts):
            answer = self.call({"op": "unprepare", "claims": [ref.__dict__]})
            if answer.get("_error") == REPLACED:
                continue
            assert "_error" not in answer, answer
            error = str(answer[ref.uid]["error"])
            if not _unreachable(error):
                break
        return error


@dataclass
class Node:
    """Everything of the qemu test bed."""

    guest: QemuGuest
    emulator: RunningEmulator
    manager: Role
    apiserver: ApiServerProcess
    kubelet: GuestKubelet
    stack: PluginStack
    plugin_pid: int = 0
    kubelet_pid: int = 0
    #: claims made by the running test (unprepared by ``clean_node`` if the test left them)
    claims: list[ClaimRef] = field(default_factory=list)

    #: the DRA socket and the checkpoint live here: a unix socket cannot be made on the 9p share;
    #: /run is a tmpfs (image.py), so a reboot loses both, as it does the CDI specs
    plugin_dir = "/run/fabric-dra-plugin"

    @property
    def share(self) -> Path:
        return self.guest.share

    @property
    def plugin_log(self) -> Path:
        return self.share / "plugin.log"

    def checkpoint(self) -> str:
        return self.sh(f"cat {self.plugin_dir}/checkpoint.json 2>/dev/null; true")

    def preload(self) -> None:
        self.guest.agent.preload(sys.executable, PRELOAD, env=GUEST_ENV)

    def start_plugin(self, *extra: str, env: dict[str, str] | None = None) -> float:
        """Start the plugin in the guest; the seconds until it wrote its ready file."""
        started = time.monotonic()
        ready = self.share / "plugin.ready"
        ready.unlink(missing_ok=True)
        # With the kubelet client running, the plugin is started once it registered with it: a
        # call sent before would go to the old registration, whose connection the kubelet closes.
        registrations = self.registrations() if self.running(self.kubelet_pid) else None
        manager_url = self.manager.address.replace("127.0.0.1", GUEST_HOST)
        self.plugin_pid = self.guest.agent.spawn(
            [
                sys.executable, "-m", "fabric_dra", "plugin", "--node-name", NODE,
                "--kubeconfig", str(self.share / "kubeconfig"),
                "--registry-dir", "/run/kubelet/plugins_registry",
                "--plugin-dir", self.plugin_dir, "--cdi-root", "/run/cdi",
                "--sysfs-root", "/sys", "--host-mode", "real",
                "--manager-url", manager_url, "--visible-timeout", str(VISIBLE_TIMEOUT),
                "--metrics-port", str(METRICS_PORT), "--metrics-host", "0.0.0.0",
                "--report-seconds", "5", "--ready-file", str(ready), *extra,
            ],
            log=str(self.plugin_log),
            env={"POD_UID": "", **GUEST_ENV, **(env or {})},
        )  # fmt: skip
        try:
            wait_until(ready.exists, timeout=300, what="the plugin's ready file", interval=0.1)
            if registrations is not None:
                wait_until(
                    lambda: self.registrations() > registrations,
                    timeout=120,
                    what="the restarted plugin registered with the guest kubelet",
                    interval=0.1,
                )
        except AssertionError as err:
            raise AssertionError(f"{err}\n{tail(self.plugin_log)}") from None
        return time.monotonic() - started

    def registrations(self) -> int:
        """How many times the plugin registered with the guest kubelet so far (-1: no answer)."""
        with contextlib.suppress(OSError, ValueError, ConnectionError):
            return int(self.kubelet.call({"op": "ping"}, timeout=5)["registrations"])
        return -1

    def active_namespaces(self, controller: str) -> str:
        """What the plugin's scanner reads as the active namespace count of ``controller``
        (``/dev/nvmeN``) in the guest, run forked from the fork server (which imported the scanner)."""
        script, out = self.share / "namespaces.py", self.share / "namespaces.out"
        script.write_text(
            "import sys\nfrom dra_driver.plugin.hostdev import active_nvme_namespaces\n"
            "print(active_nvme_namespaces(sys.argv[1]))\n"
        )
        pid = self.guest.agent.spawn([sys.executable, str(script), controller], log=str(out), env=GUEST_ENV)
        assert self.guest.agent.wait(pid, 120) == 0, tail(out)
        return out.read_text().strip()

    def stop_plugin(self, sig: int = 15) -> None:
        if self.plugin_pid:
            self.guest.agent.signal(self.plugin_pid, sig)
            self.guest.agent.wait(self.plugin_pid, 60)
            self.plugin_pid = 0

    def start_kubelet(self) -> float:
        """Start the kubelet client in the guest; the seconds until the plugin registered with it."""
        started = time.monotonic()
        self.kubelet_pid = self.guest.agent.spawn(
            [sys.executable, str(Path(__file__).with_name("guest_kubelet.py")),
             "--registry-dir", "/run/kubelet/plugins_registry", "--port", str(KUBELET_PORT)],
            log=str(self.share / "kubelet.log"),
            env=GUEST_ENV,
        )  # fmt: skip

        def up() -> bool:
            with contextlib.suppress(OSError, ValueError, ConnectionError):
                return bool(self.kubelet.call({"op": "ping"}, timeout=5).get("plugin"))
            return False

        try:
            wait_until(up, timeout=300, what="the plugin registered with the guest kubelet", interval=0.2)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{tail(self.share / 'kubelet.log')}") from None
        return time.monotonic() - started

    def clean(self) -> None:
        """Unprepare what a failed scenario left prepared, restarting the plugin or kubelet it
        left dead."""
        if not self.running(self.plugin_pid):
            self.start_plugin()
        if not self.running(self.kubelet_pid):
            self.start_kubelet()
        for ref in self.claims:
            with contextlib.suppress(Exception):
                self.kubelet.unprepare(ref)
        self.claims.clear()

    def running(self, pid: int) -> bool:
        with contextlib.suppress(Exception):
            return pid != 0 and self.guest.agent.wait(pid, 0) is None
        return False

    def claim(self, name: str, *devices: str) -> ClaimRef:
        ref = asyncio.run(self.stack.create_claim(name, [(f"r{i}", d) for i, d in enumerate(devices)]))
        self.claims.append(ref)
        return ref

    def sh(self, script: str, check: bool = True) -> str:
        return self.guest.agent.sh(script, check=check)

    def qmp(self, command: str, **args: Any) -> Any:
        async def run() -> Any:
            client = QmpClient(self.guest.qmp_owner)
            await client.connect()
            try:
                return await client.execute(command, **args)
            finally:
                await client.close()

        return asyncio.run(run())

    def plugged(self) -> set[str]:
        """QOM ids of fabric devices in the guest's machine, as QEMU sees them."""
        return {
            i["name"] for i in self.qmp("qom-list", path="/machine/peripheral") if i["name"].startswith("fd-")
        }

    def specs(self) -> dict[str, Any]:
        out = self.sh('for f in /run/cdi/*.json; do [ -e "$f" ] && { echo "== $f"; cat "$f"; }; done; true')
        specs = {}
        for chunk in out.split("== ")[1:]:
            path, _, body = chunk.partition("\n")
            specs[path] = json.loads(body)
        return specs

    def phases(self) -> dict[str, tuple[float, float]]:
        """The plugin's ``fabric_dra_plugin_phase_seconds``: phase → (sum, count)."""
        text = httpx.get(f"http://127.0.0.1:{self.guest.forwarded[METRICS_PORT]}/metrics", timeout=60).text
        found: dict[str, tuple[float, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                phase = sample.labels.get("phase")
                if phase is None or not sample.name.startswith("fabric_dra_plugin_phase_seconds"):
                    continue
                total, count = found.get(phase, (0.0, 0.0))
                if sample.name.endswith("_sum"):
                    found[phase] = (sample.value, count)
                elif sample.name.endswith("_count"):
                    found[phase] = (total, sample.value)
        return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process of this machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime (clock ticks of 1/100 s)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    compile_for_guest()
    started = time.monotonic()
    run_dir = temporary_run_dir(NODE)
    # One vCPU: under TCG a second one costs more than it gives on a loaded machine (this test at
    # load ~4 on 2 cores: QEMU 132 CPU-s and 160 s with two, 83 CPU-s and 122 s with one; idle, 98
    # and 83 CPU-s). The plugin, udev and the kernel's hot-plug work still interleave on it.
    guest = QemuGuest(GuestConfig(NODE, FABRIC_PORTS, run_dir, cpus=1, forwards=[KUBELET_PORT, METRICS_PORT]))
    guest.launch()  # the guest boots while this machine starts the emulator, manager, API server
    try:
        topology = json.loads(json.dumps(TOPOLOGY))
        topology["hosts"][0]["qemu"]["monitor"] = str(guest.qmp_emulator)
        topo_file = run_dir / "topology.yaml"
        topo_file.write_text(yaml.safe_dump(topology))
        with contextlib.ExitStack() as stack:
            emulator = stack.enter_context(
                run_emulator(run_dir, topology=topo_file, extra_args=["--insecure-no-auth"])
            )
            manager = start_manager(
                run_dir,
                emulator.url,
                args=[
                    "--redfish-auth",
                    "none",
                    "--state-dir",
                    str(run_dir / "manager"),
                    "--insecure-no-auth",
                ],
                ready_timeout=300,
            )
            stack.callback(manager.stop)
            plugin_stack = PluginStack(run_dir / "stack", node=NODE)
            apiserver = stack.enter_context(start_apiserver(run_dir / "api"))
            plugin_stack.apiserver = apiserver
            write_kubeconfig(
                guest.share / "kubeconfig",
                apiserver.url.replace("127.0.0.1", GUEST_HOST),
                token=apiserver.admin_token,
            )
            guest.wait_booted(300)
            bed = Node(
                guest, emulator, manager, apiserver, GuestKubelet(guest.forwarded[KUBELET_PORT]), plugin_stack
            )
            bed.preload()
            preload_seconds = guest.agent.preloaded()
            plugin_seconds = bed.start_plugin()
            kubelet_seconds = bed.start_kubelet()
            print(
                f"\nqemu test bed ({guest.accel}): boot {guest.boot_seconds:.1f}s, preload in the guest "
                f"{preload_seconds:.1f}s, plugin ready {plugin_seconds:.1f}s after its start, registered "
                f"{kubelet_seconds:.1f}s after the kubelet client's; ready after "
                f"{time.monotonic() - started:.1f}s; load average {Path('/proc/loadavg').read_text()}"
            )
            yield bed
            bed.stop_plugin()
            assert guest.proc is not None
            print(
                f"\nqemu test bed: {time.monotonic() - started:.0f}s, of which QEMU ran "
                f"{cpu_seconds(guest.proc.pid):.0f} CPU-s; load average {Path('/proc/loadavg').read_text()}"
            )
    finally:
        guest.stop()
        if not (run_dir / "keep").exists():
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)


def _env_of(spec: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for device in spec["devices"]:
        env |= dict(e.split("=", 1) for e in device["containerEdits"].get("env", []))
    return env


def _nodes_of(spec: dict[str, Any]) -> list[str]:
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def _namespace_node(node: Node) -> str:
    return next(n for s in node.specs().values() for n in _nodes_of(s) if re.fullmatch(r"/dev/nvme\d+n1", n))


def scenario_nvme_and_nic_attach_visible_through_udev_and_detach(node: Node) -> None:
    ref = node.claim("attach-1", "nvme-0", "nic-0")
    started = time.monotonic()
    result = node.kubelet.prepare(ref)
    prepare_seconds = time.monotonic() - started
    assert result["error"] == "", result
    assert node.plugged() == {"fd-nvme-0", "fd-nic-0"}

    specs = node.specs()
    nvme = next(s for p, s in specs.items() if "-nvme_" in p)
    nic = next(s for p, s in specs.items() if "-nic_" in p)
    nvme_nodes = _nodes_of(nvme)
    assert any(re.fullmatch(r"/dev/nvme\d+n1", n) for n in nvme_nodes), nvme_nodes
    assert any(re.fullmatch(r"/dev/nvme\d+", n) for n in nvme_nodes), nvme_nodes
    # the drive counted as ready once its one namespace was set up: the plugin asked the
    # controller how many are active (a count it could not get would read "None")
    controller = next(n for n in nvme_nodes if re.fullmatch(r"/dev/nvme\d+", n))
    assert node.active_namespaces(controller) == "1"
    nic_env = _env_of(nic)
    interfaces = nic_env["FABRIC_DRA_NIC_0_NET_INTERFACES"].split(",")
    assert interfaces and all(node.sh(f"cat /sys/class/net/{i}/address").strip() == "52:54:00:00:00:a1"
                              for i in interfaces)  # fmt: skip
    # the drive works in the guest: its first bytes are what the emulator wrote into the backing file
    assert node.sh(f"head -c 32 {_namespace_node(node)}").startswith("fabric-dra nvme-0 FDQNVME0000")
    # visibility was event-driven: the plugin listened on udev
    log = node.plugin_log.read_text()
    assert "udev monitor unavailable" not in log and "udev events switched off" not in log

    started = time.monotonic()
    assert node.kubelet.unprepare(ref) == ""
    unprepare_seconds = time.monotonic() - started
    assert node.plugged() == set()
    assert node.specs() == {}
    released = [
        float(m) for m in re.findall(r"device released by QEMU host.*seconds=([0-9.]+)", node.emulator.log())
    ]
    assert released and max(released) < 5.0, released
    print(
        f"\nNVMe + NIC: prepare {prepare_seconds:.2f}s, unprepare {unprepare_seconds:.2f}s, "
        f"DEVICE_DELETED after {released}"
    )
    assert node.sh("ls /sys/bus/pci/drivers/nvme | grep -c '^0000:' || true").strip() == "0"


#: hot-plugs of the NIC in the rename scenario, each with the guest scanning without pause
NIC_RENAME_CYCLES = 3


def scenario_nic_is_ready_only_under_its_final_name(node: Node) -> None:
    """Issue 17's race, looked for directly. udev writes a new interface's database record, marked
    ID_RENAMING=1, and renames the interface (eth1 → enp3s0) milliseconds later: a scanner that
    took the record for "done" counted eth1 ready in that window and the CDI spec named an
    interface that was gone (docs/plugin.md, "On a real host"). The plugin's scan runs when an
    event wakes it and hit the window rarely; this one scans without pause while the fabric
    hot-plugs the NIC, and the interfaces it counted ready must be the ones the NIC still has
    seconds later."""
    client = node.emulator.client()
    serial = next(d["serial"] for d in TOPOLOGY["pcie"]["switches"][0]["devices"] if d["id"] == "nic-0")
    results = []
    try:
        for n in range(NIC_RENAME_CYCLES):
            out = node.share / f"nic-scan-{n}.out"
            out.unlink(missing_ok=True)
            pid = node.guest.agent.spawn(
                [sys.executable, str(Path(__file__).with_name("guest_nic_scan.py")), str(out), serial, "120"],
                log=str(node.share / "nic-scan.log"),
                env=GUEST_ENV,
            )
            wait_until(out.exists, timeout=120, interval=0.1, what="the guest's NIC scan started")
            uri, body = zone_add(NODE, "nic-0")
            assert client.post(uri, json=body).status_code in (200, 202, 204)
            assert node.guest.agent.wait(pid, 180) == 0, tail(node.share / "nic-scan.log")
            result = json.loads(out.read_text().splitlines()[-1])
            results.append(result)
            wait_until(lambda: node.emulator.bound_hosts().get("nic-0") == NODE, timeout=120, interval=0.2)
            uri, body = zone_remove(NODE, "nic-0")
            assert client.post(uri, json=body).status_code in (200, 202, 204)
            wait_until(lambda: "nic-0" not in node.emulator.bound_hosts(), timeout=120, interval=0.2)
            assert result["found"], result
            assert result["found"] == result["after"], result
    finally:
        if node.emulator.bound_hosts().get("nic-0") == NODE:
            uri, body = zone_remove(NODE, "nic-0")
            client.post(uri, json=body)
            wait_until(lambda: "nic-0" not in node.emulator.bound_hosts(), timeout=120, interval=0.2)
        client.close()
        print(
            "\nNIC rename: "
            + "; ".join(
                f"{r['scans']} scans, ready as {r['found']} (then {r['after']}), not ready: {r['not_ready']}"
                for r in results
            )
        )
    assert node.plugged() == set()


def _cycles(node: Node, label: str, count: int) -> tuple[list[float], dict[str, float]]:
    """``count`` prepare+unprepare cycles of one NVMe drive: their durations, and the mean of each
    phase the plugin measured (``visible``: bind done → the drive ready in the guest)."""
    durations = []
    before = node.phases()
    for n in range(count):
        ref = node.claim(f"cycle-{label}-{n}", "nvme-1")
        started = time.monotonic()
        result = node.kubelet.prepare(ref)
        assert result["error"] == "", (label, n, result)
        assert node.kubelet.unprepare(ref) == "", (label, n)
        durations.append(time.monotonic() - started)
    after = node.phases()
    means = {
        phase: (total - before.get(phase, (0.0, 0.0))[0]) / (n - before.get(phase, (0.0, 0.0))[1])
        for phase, (total, n) in after.items()
        if n > before.get(phase, (0.0, 0.0))[1]
    }
    return durations, means


def scenario_twenty_cycles_leave_nothing_behind(node: Node) -> None:
    """Ten cycles with the plugin woken by udev events, ten with its polling fallback
    (``FABRIC_DRA_UDEV=off``): the visible latency of both is docs/plugin.md's comparison."""
    events, events_phases = _cycles(node, "udev", 10)
    node.stop_plugin()
    restart_seconds = node.start_plugin(env={"FABRIC_DRA_UDEV": "off"})
    try:
        assert "udev events switched off" in node.plugin_log.read_text()
        polling, polling_phases = _cycles(node, "poll", 10)
    finally:
        node.stop_plugin()
        node.start_plugin()
    assert node.plugged() == set()
    assert node.specs() == {}
    assert "cycle-" not in node.checkpoint()
    assert node.emulator.bindings()["Bindings"] == []
    assert node.sh("ls /dev | grep -c '^nvme' || true").strip() == "0"
    durations = events + polling
    print(
        f"\n20 cycles: prepare+unprepare mean {sum(durations) / 20:.2f}s, max {max(durations):.2f}s; "
        f"a plugin restart (forked) {restart_seconds:.1f}s"
    )
    for name, phases in (("udev events", events_phases), ("polling", polling_phases)):
        print(f"  {name}: " + ", ".join(f"{p} {v:.3f}s" for p, v in sorted(phases.items())))


def scenario_in_use_device_is_not_detached_under_its_user(node: Node) -> None:
    ref = node.claim("in-use", "nvme-0")
    assert node.kubelet.prepare(ref)["error"] == ""
    holder = node.guest.agent.spawn(
        ["/bin/sh", "-c", f"exec 3<{_namespace_node(node)}; exec sleep 600"], log="/dev/null"
    )
    try:
        wait_until(
            lambda: "sleep" in node.sh(f"cat /proc/{holder}/comm 2>/dev/null; true"), timeout=30, interval=0.2
        )
        error = node.kubelet.unprepare(ref)
        assert "in use" in error and "sleep" in error, error
        assert node.plugged() == {"fd-nvme-0"}
        assert node.emulator.bound_hosts().get("nvme-0") == NODE
    finally:
        node.guest.agent.signal(holder, 9)
        node.guest.agent.wait(holder, 30)
    assert node.kubelet.unprepare(ref) == ""
    assert node.plugged() == set()


#: The NIC stand-in's driver, kept from loading: udev's module autoloading (its kmod builtin,
#: re-reading modprobe.d on ``udevadm control --reload``) then runs ``/bin/false`` instead, and the
#: kernel enumerates the NIC with no driver bound, as when a driver failed to probe.
_BLOCK_NIC_DRIVER = (
    "modprobe -r e1000e && echo 'install e1000e /bin/false' > /etc/modprobe.d/fdq-block.conf"
    " && udevadm control --reload && ! grep -q '^e1000e ' /proc/modules"
)
_LOAD_NIC_DRIVER = "rm -f /etc/modprobe.d/fdq-block.conf && udevadm control --reload && modprobe e1000e"


def scenario_slow_probe_then_failed_probe(node: Node) -> None:
    node.sh(_BLOCK_NIC_DRIVER)
    try:
        # Slow: the driver binds seconds after the device appeared; the plugin keeps waiting.
        ref = node.claim("slow-probe", "nic-0")
        results: dict[str, Any] = {}
        prepared = threading.Thread(target=lambda: results.update(node.kubelet.prepare(ref)))
        prepared.start()
        wait_until(
            lambda: "0x10d3" in node.sh("cat /sys/bus/pci/devices/*/device"), timeout=120, interval=0.2
        )
        time.sleep(3)
        assert prepared.is_alive(), results  # still waiting for the driver
        node.sh(_LOAD_NIC_DRIVER)
        prepared.join(300)
        assert results.get("error") == "", results
        assert node.kubelet.unprepare(ref) == ""

        # Failed: no driver ever binds; the prepare fails saying so, the device stays bound to the
        # node for the claim, and the claim's unprepare detaches it.
        node.sh(_BLOCK_NIC_DRIVER)
        ref = node.claim("failed-probe", "nic-0")
        answer = node.kubelet.call({"op": "prepare", "claims": [ref.__dict__]})
        error = answer[ref.uid]["error"]
        assert "no driver is bound to it" in error and "dmesg" in error, answer
        assert node.emulator.bound_hosts().get("nic-0") == NODE
        assert node.kubelet.unprepare(ref) == ""
        assert node.plugged() == set()
    finally:
        node.sh(_LOAD_NIC_DRIVER, check=False)


def scenario_guest_that_never_releases_fails_the_unbind_cleanly(node: Node) -> None:
    client = node.emulator.client()
    uri, body = zone_add(NODE, "gpu-0")
    assert client.post(uri, json=body).status_code in (200, 202, 204)
    wait_until(lambda: node.emulator.bound_hosts().get("gpu-0") == NODE, timeout=120, interval=0.2)
    node.qmp("stop")  # a guest that does not answer the hot-plug controller
    try:
        uri, body = zone_remove(NODE, "gpu-0")
        response = client.post(uri, json=body)
        assert response.status_code == 202, response.text
        monitor = response.headers["Location"]
        deadline = time.monotonic() + RELEASE_SECONDS + 60
        while (answer := client.get(monitor)).status_code == 202 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer.status_code == 504, answer.text
        assert "did not release gpu-0 within" in answer.text
        assert node.emulator.bound_hosts().get("gpu-0") == NODE
    finally:
        node.qmp("cont")
    # the guest lets go once it runs again; the next unbind finds the device gone and completes
    wait_until(lambda: "fd-gpu-0" not in node.plugged(), timeout=60, interval=0.2)
    response = client.post(uri, json=body)
    assert response.status_code in (200, 202, 204), response.text
    wait_until(lambda: "gpu-0" not in node.emulator.bound_hosts(), timeout=120, interval=0.2)
    assert node.plugged() == set()
    client.close()


def scenario_plugin_killed_between_attach_and_visible_recovers(node: Node) -> None:
    """The plugin dies (SIGKILL, at its crash point ``plugin.prepare.after-attach``) once the manager
    answered attached and before it looked at the host, while the guest enumerates the drive. A
    SIGKILL sent from outside once the drive shows up would race the plugin's own check, which on a
    fast guest finishes first; the crash point puts the death in the window every time."""
    ref = node.claim("killed", "nvme-0")
    node.stop_plugin()
    node.start_plugin(env={"FABRIC_DRA_CRASH_AT": "plugin.prepare.after-attach"})
    results = node.kubelet.call({"op": "prepare", "claims": [ref.__dict__]})
    assert "_error" in results, results  # the kubelet's call failed with the plugin
    node.guest.agent.wait(node.plugin_pid, 60)
    node.plugin_pid = 0
    assert "point=plugin.prepare.after-attach" in node.plugin_log.read_text()
    # attached: the guest enumerates it with no plugin running
    wait_until(lambda: "fd-nvme-0" in node.plugged(), timeout=120, interval=0.2)
    node.start_plugin()
    # the kubelet calls again; the plugin finds the attach in the manager's ledger
    result = node.kubelet.prepare(ref)
    assert result["error"] == "", result
    assert node.plugged() == {"fd-nvme-0"}
    assert node.kubelet.unprepare(ref) == ""
    assert node.plugged() == set() and node.specs() == {}


def scenario_guest_reboot_with_a_device_attached(node: Node) -> None:
    """The documented state after a node reboot with a device attached (docs/plugin.md, "On a real
    host"), with this guest's plugin directory on a tmpfs as its CDI root is."""
    ref = node.claim("reboot", "nvme-0")
    assert node.kubelet.prepare(ref)["error"] == ""
    node.plugin_pid = node.kubelet_pid = 0
    started = time.monotonic()
    node.qmp("system_reset")
    node.guest.wait_agent(300)
    boot_seconds = time.monotonic() - started
    node.preload()
    # The fabric still binds the drive to the node for the claim; it stayed plugged in, and the
    # guest set it up again at boot (driver bound, /dev nodes).
    assert node.emulator.bound_hosts().get("nvme-0") == NODE
    assert node.plugged() == {"fd-nvme-0"}
    wait_until(
        lambda: node.sh("ls /dev | grep -c '^nvme.n1$' || true").strip() == "1", timeout=120, interval=0.2
    )
    # What the node kept on tmpfs is gone: CDI specs, the checkpoint.
    assert node.specs() == {}
    assert node.checkpoint() == ""
    # The plugin finds the fabric's binding for a claim it has no record of and records it.
    preload_seconds = node.guest.agent.preloaded()
    plugin_seconds = node.start_plugin()
    wait_until(lambda: ref.uid in node.checkpoint(), timeout=60, interval=0.2)
    assert f"claim {ref.uid}: the fabric binds nvme-0 to this node but this plugin had no record" in (
        node.plugin_log.read_text()
    )
    assert json.loads(node.checkpoint())["data"]["claims"][ref.uid]["state"] == "PrepareStarted"
    node.start_kubelet()
    # The kubelet prepares the pod's claims again after a reboot: the spec names the nodes the
    # drive has now, without a second attach.
    result = node.kubelet.prepare(ref)
    assert result["error"] == "", result
    assert re.fullmatch(r"/dev/nvme\d+n1", _namespace_node(node))
    assert node.kubelet.unprepare(ref) == ""
    assert node.plugged() == set() and node.specs() == {}
    assert "nvme-0" not in node.emulator.bound_hosts()
    print(
        f"\nreboot: agent back after {boot_seconds:.1f}s, preload in the guest {preload_seconds:.1f}s, "
        f"plugin ready {plugin_seconds:.1f}s after its start"
    )


#: In the order they run: the reboot last, as it costs a second boot.
SCENARIOS: list[Callable[[Node], None]] = [
    scenario_nvme_and_nic_attach_visible_through_udev_and_detach,
    scenario_nic_is_ready_only_under_its_final_name,
    scenario_twenty_cycles_leave_nothing_behind,
    scenario_in_use_device_is_not_detached_under_its_user,
    scenario_slow_probe_then_failed_probe,
    scenario_guest_that_never_releases_fails_the_unbind_cleanly,
    scenario_plugin_killed_between_attach_and_visible_recovers,
    scenario_guest_reboot_with_a_device_attached,
]


def test_node_side_on_a_real_kernel(node: Node) -> None:
    """Every scenario, in one test item: pytest-xdist (``--dist worksteal``) hands the tail of a
    long worker's queue to an idle worker, and a module's tests split that way would boot a second
    guest. Every scenario runs even when one before it failed (:meth:`Node.clean` puts the node
    back), and the failures are reported together."""
    failures = []
    seconds = {}
    for scenario in SCENARIOS:
        node.claims.clear()
        started = time.monotonic()
        try:
            scenario(node)
        except Exception:  # reported below, with its traceback
            failures.append(f"{scenario.__name__}:\n{traceback.format_exc()}")
        seconds[scenario.__name__.removeprefix("scenario_")] = time.monotonic() - started
        node.clean()
    print("\nscenario seconds: " + ", ".join(f"{name} {s:.1f}" for name, s in seconds.items()))
    assert not failures, "\n".join(failures)
