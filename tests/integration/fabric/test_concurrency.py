"""200 concurrent attach requests over 20 devices and 10 nodes: never one device on two hosts.

A watcher thread reads the emulator's own state the whole time — its binding table and every
host's sysfs tree — and records any moment a device is bound to (or visible on) two hosts. Every
request must end attached, or with a clear 409 that names the holder. A second round detaches
the winners while 200 new claims race for the same devices.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from manager_api.client import ManagerClient
from manager_api.errors import DeviceBusy
from manager_api.models import AttachmentState
from plumbing import procs
from tests.integration.fabric.conftest import FabricAdmin, Tls, manager_for, plugin_token, tls_emulator
from tests.support.uids import claim_uid

HOSTS = 10
DEVICES = 20
REQUESTS = 200
NODES = ["kind-worker", *(f"kind-worker{i}" for i in range(2, HOSTS + 1))]


@pytest.fixture(scope="module")
def big_fabric(tmp_path_factory: pytest.TempPathFactory, tls: Tls) -> Iterator[FabricAdmin]:
    root = tmp_path_factory.mktemp("big-fabric")
    topology = root / "topology.yaml"
    generated = procs.run(
        [
            *("emulator", "topology", "generate", "--hosts", str(HOSTS)),
            *("--gpus", str(DEVICES), "--nvme", "0", "--nics", "0", "--fpgas", "0", "--cxl-devices", "0"),
            *("--output-file", str(topology)),
        ]
    )
    assert generated.returncode == 0, generated.stderr
    with tls_emulator(root, tls, topology=topology) as admin:
        yield admin


class Watcher(threading.Thread):
    """Samples the emulator's binding table and host views until stopped."""

    def __init__(self, fabric: FabricAdmin) -> None:
        super().__init__(daemon=True)
        self.fabric = fabric
        self.stop_event = threading.Event()
        self.samples = 0
        self.violations: list[str] = []

    def run(self) -> None:
        hosts_dir = self.fabric.emulator.state_dir / "hosts"
        while not self.stop_event.is_set():
            table = self.fabric.get("/redfish/v1/Oem/FabricDRA/Bindings")["Bindings"]
            targets = Counter(b["Target"] for b in table)
            self.violations += [f"{t} bound {n} times" for t, n in targets.items() if n > 1]
            serials: dict[str, str] = {}
            for serial_file in hosts_dir.glob("*/sys/bus/pci/devices/*/serial"):
                host = serial_file.relative_to(hosts_dir).parts[0]
                try:
                    serial = serial_file.read_text().strip()
                except FileNotFoundError:
                    continue  # removed between listing and reading: an unbind in progress
                if serial in serials and serials[serial] != host:
                    self.violations.append(f"device {serial} visible on {serials[serial]} and {host}")
                serials[serial] = host
            self.samples += 1
            self.stop_event.wait(0.01)


async def race(url: str, rng: random.Random, round_name: str) -> tuple[dict[str, str], list[str]]:
    """REQUESTS concurrent attaches, each from its node's plugin; (winners, errors)."""
    clients = {node: ManagerClient(url, token=plugin_token(node), timeout=60) for node in NODES}
    requests = [
        (f"gpu{rng.randrange(DEVICES)}", rng.choice(NODES), claim_uid(f"{round_name}-claim-{i}"))
        for i in range(REQUESTS)
    ]
    try:
        results = await asyncio.gather(
            *(clients[node].attach(device, node, claim, wait_seconds=30) for device, node, claim in requests),
            return_exceptions=True,
        )
    finally:
        for client in clients.values():
            await client.aclose()
    winners: dict[str, str] = {}
    refused: list[str] = []
    for (device, node, claim), result in zip(requests, results, strict=True):
        if isinstance(result, DeviceBusy):
            assert result.held_by and result.message, result  # says who holds it
            refused.append(device)
            continue
        assert not isinstance(result, BaseException), f"{device}/{node}/{claim}: {result!r}"
        assert result.state == AttachmentState.ATTACHED
        assert device not in winners, f"{device} attached twice: {winners[device]} and {node}"
        winners[device] = node
    return winners, refused


async def test_concurrent_attaches_never_bind_a_device_twice(big_fabric: FabricAdmin, tmp_path: Path) -> None:
    rng = random.Random(20261130)
    watcher = Watcher(big_fabric)
    with manager_for(big_fabric, tmp_path, nodes=NODES) as manager:
        watcher.start()
        try:
            winners, refused = await race(manager.address, rng, "first")
            assert len(winners) + len(refused) == REQUESTS
            assert big_fabric.bound_hosts() == winners

            # Round two: every winner detaches while 200 new claims race for the same devices.
            async def detach_all() -> None:
                for device, node in winners.items():
                    async with ManagerClient(manager.address, token=plugin_token(node), timeout=60) as client:
                        claim = (await client.device(device)).claim_uid or ""
                        await client.detach(device, node, claim, wait_seconds=30)

            (second, refused_again), _ = await asyncio.gather(
                race(manager.address, rng, "second"), detach_all()
            )
            assert len(second) + len(refused_again) == REQUESTS
            assert big_fabric.bound_hosts() == second
        finally:
            watcher.stop_event.set()
            watcher.join(timeout=10)
    assert watcher.samples > 10, "the watcher did not get to look"
    assert watcher.violations == []
