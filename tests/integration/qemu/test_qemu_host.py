"""The plugin's real-host path against a real kernel: a QEMU guest as the node (docs/plugin.md,
"On a real host"; docs/emulator.md, "QEMU hosts").

One guest per module (booting under TCG costs tens of seconds). On the machine: the emulator
(its ``node-q`` host is ``kind: qemu``, attached to the guest's monitor), the fabric manager and
the API test server. In the guest: ``fabric-dra plugin --host-mode real`` and a kubelet-protocol
client (guest_kubelet.py), both reaching the machine through QEMU user networking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulator.qemu.guest import HOST_ADDRESS_IN_GUEST, GuestConfig, QemuGuest, temporary_run_dir
from emulator.qemu.image import missing_tools
from emulator.qemu.qmp import QmpClient
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from plumbing.procs import RoleProcess
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.emulator import RunningEmulator, run_emulator, zone_add, zone_remove
from tests.support.fabric_manager import start_manager
from tests.support.plugin import ClaimRef, PluginStack

pytestmark = [pytest.mark.qemu, pytest.mark.timeout(600)]

_MISSING = missing_tools()
if _MISSING:
    pytest.skip("QEMU hosts cannot run here: missing " + "; ".join(_MISSING), allow_module_level=True)

NODE = "node-q"
KUBELET_PORT = 7001
REPO = Path(__file__).resolve().parents[3]
#: where the guest reaches the machine's loopback services
GUEST_HOST = HOST_ADDRESS_IN_GUEST
#: how long a release may take in the guest before the emulator's unbind gives up
RELEASE_SECONDS = 6

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


class GuestKubelet:
    """The guest's kubelet-protocol client, over its forwarded port."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, request: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as answers:
                line = answers.readline()
        if not line:
            raise ConnectionError("the guest kubelet closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def prepare(self, ref: ClaimRef, retries: int = 3) -> dict[str, Any]:
        """NodePrepareResources, called again (as the kubelet does) while the answer is a transient
        error of the API server connection (user networking under TCG drops an idle one at times)."""
        for _ in range(retries):
            answer = self.call({"op": "prepare", "claims": [ref.__dict__]})
            assert "_error" not in answer, answer
            result = dict(answer[ref.uid])
            if "Unreachable" not in result["error"]:
                break
        return result

    def unprepare(self, ref: ClaimRef) -> str:
        answer = self.call({"op": "unprepare", "claims": [ref.__dict__]})
        assert "_error" not in answer, answer
        return str(answer[ref.uid]["error"])


@dataclass
class Node:
    """Everything of the qemu test bed."""

    guest: QemuGuest
    emulator: RunningEmulator
    manager: RoleProcess
    apiserver: ApiServerProcess
    kubelet: GuestKubelet
    stack: PluginStack
    plugin_pid: int = 0
    kubelet_pid: int = 0

    @property
    def share(self) -> Path:
        return self.guest.share

    #: the DRA socket lives here: a unix socket cannot be made on the 9p share
    plugin_dir = "/run/fabric-dra-plugin"

    def checkpoint(self) -> str:
        return self.sh(f"cat {self.plugin_dir}/checkpoint.json 2>/dev/null; true")

    @property
    def plugin_log(self) -> Path:
        return self.share / "plugin.log"

    def python(self) -> str:
        return sys.executable

    def start_plugin(self, *extra: str, env: dict[str, str] | None = None) -> None:
        ready = self.share / "plugin.ready"
        ready.unlink(missing_ok=True)
        manager_url = self.manager.address.replace("127.0.0.1", GUEST_HOST)
        self.plugin_pid = self.guest.agent.spawn(
            [
                self.python(), "-m", "fabric_dra", "plugin", "--node-name", NODE,
                "--kubeconfig", str(self.share / "kubeconfig"),
                "--registry-dir", "/run/kubelet/plugins_registry",
                "--plugin-dir", str(self.plugin_dir), "--cdi-root", "/run/cdi",
                "--sysfs-root", "/sys", "--host-mode", "real",
                "--manager-url", manager_url, "--visible-timeout", "20",
                "--report-seconds", "5", "--ready-file", str(ready), *extra,
            ],
            log=str(self.plugin_log),
            env={"POD_UID": "", "PYTHONPATH": str(REPO), **(env or {})},
        )  # fmt: skip
        wait_for(ready.exists, 120, lambda: f"plugin not ready:\n{tail(self.plugin_log)}")

    def stop_plugin(self, sig: int = 15) -> None:
        if self.plugin_pid:
            self.guest.agent.signal(self.plugin_pid, sig)
            self.guest.agent.wait(self.plugin_pid, 30)
            self.plugin_pid = 0

    def start_kubelet(self) -> None:
        self.kubelet_pid = self.guest.agent.spawn(
            [self.python(), str(Path(__file__).with_name("guest_kubelet.py")),
             "--registry-dir", "/run/kubelet/plugins_registry", "--port", str(KUBELET_PORT)],
            log=str(self.share / "kubelet.log"),
            env={"PYTHONPATH": str(REPO)},
        )  # fmt: skip

        def up() -> bool:
            with contextlib.suppress(OSError, ValueError, ConnectionError):
                return bool(self.kubelet.call({"op": "ping"}, timeout=5).get("plugin"))
            return False

        wait_for(up, 120, lambda: f"guest kubelet not up:\n{tail(self.share / 'kubelet.log')}")

    def claim(self, name: str, *devices: str) -> ClaimRef:
        return asyncio.run(self.stack.create_claim(name, [(f"r{i}", d) for i, d in enumerate(devices)]))

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


def tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no {path})"


def wait_for(check: Any, timeout: float, describe: Any = None, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(describe() if describe else f"timed out after {timeout}s")
        time.sleep(interval)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    # The guest's root is read-only: byte-code it cannot find it would compile on every start.
    import compileall

    for package in (
        "plumbing",
        "manager_api",
        "dra_driver",
        "kube_standin",
        "fabric_dra",
        "emulator",
        "fabric",
    ):
        compileall.compile_dir(str(REPO / package), quiet=1)
    run_dir = temporary_run_dir(NODE)
    guest = QemuGuest(GuestConfig(NODE, FABRIC_PORTS, run_dir, forwards=[KUBELET_PORT]))
    guest.start()
    print(f"\nguest boot: {guest.boot_seconds:.1f}s")
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
                ready_timeout=120,
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
            bed = Node(
                guest, emulator, manager, apiserver, GuestKubelet(guest.forwarded[KUBELET_PORT]), plugin_stack
            )
            bed.start_plugin()
            bed.start_kubelet()
            yield bed
            bed.stop_plugin()
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


def test_nvme_and_nic_attach_visible_through_udev_and_detach(node: Node) -> None:
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
    nic_env = _env_of(nic)
    interfaces = nic_env["FABRIC_DRA_NIC_0_NET_INTERFACES"].split(",")
    assert interfaces and all(node.sh(f"cat /sys/class/net/{i}/address").strip() == "52:54:00:00:00:a1"
                              for i in interfaces)  # fmt: skip
    # the drive works in the guest: its first bytes are what the emulator wrote into the backing file
    namespace = next(n for n in nvme_nodes if re.fullmatch(r"/dev/nvme\d+n1", n))
    assert node.sh(f"head -c 32 {namespace}").startswith("fabric-dra nvme-0 FDQNVME0000")
    # visibility was event-driven: the plugin listened on udev
    log = node.plugin_log.read_text()
    assert "udev monitor unavailable" not in log

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
        f"\nprepare {prepare_seconds:.2f}s, unprepare {unprepare_seconds:.2f}s, "
        f"DEVICE_DELETED after {released}"
    )
    assert node.sh("ls /sys/bus/pci/drivers/nvme | grep -c '^0000:' || true").strip() == "0"


def test_twenty_cycles_leave_nothing_behind(node: Node) -> None:
    durations = []
    for n in range(20):
        ref = node.claim(f"cycle-{n}", "nvme-1")
        started = time.monotonic()
        result = node.kubelet.prepare(ref)
        assert result["error"] == "", (n, result)
        assert node.kubelet.unprepare(ref) == "", n
        durations.append(time.monotonic() - started)
    assert node.plugged() == set()
    assert node.specs() == {}
    assert "cycle-" not in node.checkpoint()
    assert node.emulator.bindings()["Bindings"] == []
    assert node.sh("ls /dev | grep -c '^nvme' || true").strip() == "0"
    print(f"\n20 cycles: mean {sum(durations) / 20:.2f}s, max {max(durations):.2f}s per prepare+unprepare")


def test_in_use_device_is_not_detached_under_its_user(node: Node) -> None:
    ref = node.claim("in-use", "nvme-0")
    assert node.kubelet.prepare(ref)["error"] == ""
    namespace = next(
        n for s in node.specs().values() for n in _nodes_of(s) if re.fullmatch(r"/dev/nvme\d+n1", n)
    )
    holder = node.guest.agent.spawn(["/bin/sh", "-c", f"exec 3<{namespace}; exec sleep 600"], log="/dev/null")
    time.sleep(0.5)
    error = node.kubelet.unprepare(ref)
    assert "in use" in error and "sleep" in error, error
    assert node.plugged() == {"fd-nvme-0"}
    assert node.emulator.bound_hosts().get("nvme-0") == NODE
    node.guest.agent.signal(holder, 9)
    node.guest.agent.wait(holder, 10)
    assert node.kubelet.unprepare(ref) == ""
    assert node.plugged() == set()


def test_slow_probe_then_failed_probe(node: Node) -> None:
    # No driver may load for the NIC: the guest enumerates it, but nothing probes it.
    node.sh("modprobe -r e1000e; echo 'install e1000e /bin/false' > /etc/modprobe.d/fdq-block.conf")
    ref = node.claim("slow-probe", "nic-0")
    import threading

    results: dict[str, Any] = {}
    prepared = threading.Thread(target=lambda: results.update(node.kubelet.prepare(ref)))
    prepared.start()
    wait_for(lambda: "fd-nic-0" in node.plugged(), 60)
    time.sleep(4)  # the driver arrives seconds after the device: the plugin keeps waiting
    node.sh("rm /etc/modprobe.d/fdq-block.conf; modprobe e1000e")
    prepared.join(120)
    assert results.get("error") == "", results
    assert node.kubelet.unprepare(ref) == ""

    node.sh("modprobe -r e1000e; echo 'install e1000e /bin/false' > /etc/modprobe.d/fdq-block.conf")
    try:
        ref = node.claim("failed-probe", "nic-0")
        result = node.kubelet.prepare(ref)
        assert "no driver is bound to it" in result["error"] and "dmesg" in result["error"], result
        # the device stays bound to the node for the claim; the pod's end detaches it
        assert node.emulator.bound_hosts().get("nic-0") == NODE
        assert node.kubelet.unprepare(ref) == ""
        assert node.plugged() == set()
    finally:
        node.sh("rm -f /etc/modprobe.d/fdq-block.conf; modprobe e1000e", check=False)


def test_guest_that_never_releases_fails_the_unbind_cleanly(node: Node) -> None:
    client = node.emulator.client()
    uri, body = zone_add(NODE, "gpu-0")
    assert client.post(uri, json=body).status_code in (200, 202, 204)
    wait_for(lambda: node.emulator.bound_hosts().get("gpu-0") == NODE, 60)
    node.qmp("stop")  # a guest that does not answer the hot-plug controller
    try:
        uri, body = zone_remove(NODE, "gpu-0")
        response = client.post(uri, json=body)
        assert response.status_code == 202, response.text
        monitor = response.headers["Location"]
        deadline = time.monotonic() + RELEASE_SECONDS + 30
        while (answer := client.get(monitor)).status_code == 202 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer.status_code == 504, answer.text
        assert "did not release gpu-0 within" in answer.text
        assert node.emulator.bound_hosts().get("gpu-0") == NODE
    finally:
        node.qmp("cont")
    # the guest lets go once it runs again; the next unbind finds the device gone and completes
    response = client.post(uri, json=body)
    monitor = response.headers.get("Location", "")
    wait_for(lambda: "gpu-0" not in node.emulator.bound_hosts(), 60)
    assert node.plugged() == set()
    client.close()


def test_plugin_killed_between_attach_and_visible_recovers(node: Node) -> None:
    ref = node.claim("killed", "nvme-0")
    import threading

    results: dict[str, Any] = {}
    call = threading.Thread(target=lambda: results.update(node.kubelet.call(
        {"op": "prepare", "claims": [ref.__dict__]}, timeout=120)))  # fmt: skip
    call.start()
    wait_for(lambda: "fd-nvme-0" in node.plugged(), 60)  # attached: the guest is enumerating it
    node.stop_plugin(sig=9)
    call.join(60)
    node.start_plugin()
    result = node.kubelet.prepare(ref)
    assert result["error"] == "", result
    assert node.plugged() == {"fd-nvme-0"}
    assert node.kubelet.unprepare(ref) == ""
    assert node.plugged() == set() and node.specs() == {}


def test_guest_reboot_with_a_device_attached(node: Node) -> None:
    ref = node.claim("reboot", "nvme-0")
    assert node.kubelet.prepare(ref)["error"] == ""
    node.plugin_pid = node.kubelet_pid = 0
    node.qmp("system_reset")
    node.guest.wait_agent(240)
    # The device stayed plugged: the guest finds it at boot. /run (CDI specs, and in this guest
    # also the plugin's checkpoint) is gone; the manager still records the claim's attach.
    assert node.plugged() == {"fd-nvme-0"}
    node.start_plugin()
    node.start_kubelet()
    result = node.kubelet.prepare(ref)  # the kubelet prepares the pod's claims again after a reboot
    assert result["error"] == "", result
    assert any(re.fullmatch(r"/dev/nvme\d+n1", n) for s in node.specs().values() for n in _nodes_of(s))
    assert node.kubelet.unprepare(ref) == ""
    assert node.plugged() == set() and node.specs() == {}
