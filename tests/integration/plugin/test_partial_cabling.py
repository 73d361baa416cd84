"""A prepare the fabric refuses for good (issue 15, items 3 and 4), with real processes: emulator
(instant) → fabric manager → plugin → API test server, driven over the DRA socket.

The emulator's switch1 is cabled to kind-worker and kind-worker2 only, and its endpoints do not
say where they are cabled (``behaviour.portLinks: omitted``), so the manager cannot know and the
refusal comes from the fabric itself: 400 ``ActionParameterValueError``, as a real switch answers.
The plugin runs on kind-worker3.

- item 3: the claim's error says the allocation cannot work on this node and to delete the pod;
  the manager counts the refusal;
- item 4: a claim of a reachable GPU and an unreachable one leaves nothing bound: the GPU it did
  attach is detached again, and the message says so — never "left bound" while the fabric holds it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from emulator.topology import default_topology_path
from manager_api.client import ManagerClient
from manager_api.models import BindingState
from tests.support.plugin import FabricProcesses, PluginStack, short_dir, start_fabric
from tests.support.uids import claim_uid

NODE = "kind-worker3"
CABLED = ["kind-worker", "kind-worker2"]


@dataclass
class Setup:
    processes: FabricProcesses
    stack: PluginStack

    async def state(self, device: str) -> tuple[BindingState, str | None]:
        async with ManagerClient(self.processes.manager.address) as client:
            found = await client.device(device)
        return found.state, found.node

    def bound_in_fabric(self) -> dict[str, str]:
        """Target → host, from the emulator's own binding table (the ground truth)."""
        response = httpx.get(f"{self.processes.emulator.address}/redfish/v1/Oem/FabricDRA/Bindings")
        response.raise_for_status()
        return {b["Target"]: b["Host"] for b in response.json()["Bindings"]}

    def refusals(self) -> float:
        response = httpx.get(f"{self.processes.manager.address}/metrics")
        response.raise_for_status()
        for line in response.text.splitlines():
            if line.startswith('fabric_dra_attach_refused_total{refused_by="fabric"}'):
                return float(line.split()[-1])
        return 0.0


def _topology(root: Path) -> Path:
    data = yaml.safe_load(default_topology_path().read_text())
    for switch in data["pcie"]["switches"]:
        if switch["id"] == "switch1":
            switch["hosts"] = CABLED
    data["behaviour"] = {"portLinks": "omitted"}
    path = root / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    root = short_dir("fdc-")
    processes = start_fabric(root, topology=_topology(root))
    try:
        (root / "k").mkdir()
        stack = PluginStack(
            root / "k",
            node=NODE,
            backend="fabric",
            manager_url=processes.manager.address,
            sysfs_root=processes.sysfs_root(NODE),
        )
        with stack:
            yield Setup(processes, stack)
    finally:
        processes.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_device_behind_an_uncabled_switch_is_refused_for_good(setup: Setup) -> None:
    async def scenario() -> None:
        before = setup.refusals()
        ref = await setup.stack.create_claim("uncabled", [("gpu", "gpu4")])
        error = (await setup.stack.prepare([ref])).claims[ref.uid].error
        assert "device gpu4 could not be attached to node kind-worker3" in error, error
        assert "ActionParameterValueError" in error, error  # the fabric's own words
        assert "this allocation cannot work on node kind-worker3" in error, error
        assert "retrying does not change that: delete the pod so the scheduler picks again" in error
        assert "kubelet retries" not in error, error
        assert await setup.state("gpu4") == (BindingState.FREE, None)
        assert "gpu4" not in setup.bound_in_fabric()
        assert setup.refusals() == before + 1
        assert (await setup.stack.unprepare([ref])).claims[ref.uid].error == ""

    asyncio.run(scenario())


def test_a_claim_failing_part_way_for_good_leaves_nothing_bound(setup: Setup) -> None:
    async def scenario() -> None:
        ref = await setup.stack.create_claim("part-way", [("a", "gpu0"), ("b", "gpu4")])
        error = (await setup.stack.prepare([ref])).claims[ref.uid].error
        assert "device gpu4 could not be attached to node kind-worker3" in error, error
        assert "device gpu0 of this claim was detached from node kind-worker3 again" in error, error
        assert "nothing of this claim is left attached to node kind-worker3" in error, error
        # The fabric agrees with the message: neither GPU is bound anywhere.
        bound = setup.bound_in_fabric()
        assert "gpu0" not in bound and "gpu4" not in bound, bound
        assert await setup.state("gpu0") == (BindingState.FREE, None)
        assert (await setup.stack.unprepare([ref])).claims[ref.uid].error == ""
        assert "gpu0" not in setup.bound_in_fabric()

    asyncio.run(scenario())


def test_a_claim_failing_part_way_for_now_keeps_and_names_what_stays_bound(setup: Setup) -> None:
    """A retriable failure (another claim holds one device): the device this claim did attach stays
    for the kubelet's retry, and the message names it — as the fabric shows it."""

    async def scenario() -> None:
        other = claim_uid("holds-gpu1")
        async with ManagerClient(setup.processes.manager.address) as client:
            await client.attach("gpu1", NODE, other, wait_seconds=10.0)
            try:
                ref = await setup.stack.create_claim("for-now", [("a", "gpu0"), ("b", "gpu1")])
                error = (await setup.stack.prepare([ref])).claims[ref.uid].error
                assert "device gpu1 is in use" in error, error
                assert "device gpu0 of this claim stays attached to node kind-worker3" in error, error
                assert "kept so that the kubelet's retry finishes the claim" in error, error
                assert setup.bound_in_fabric().get("gpu0") == NODE
                assert await setup.state("gpu0") == (BindingState.BOUND, NODE)
                assert (await setup.stack.unprepare([ref])).claims[ref.uid].error == ""
                assert "gpu0" not in setup.bound_in_fabric()
            finally:
                await client.detach("gpu1", NODE, other, wait_seconds=10.0)

    asyncio.run(scenario())
