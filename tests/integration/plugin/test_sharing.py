"""GPU partitions and CXL memory shares on a node, with real processes: the plugin (``fabric-dra
plugin``), the kubelet's side of the DRA protocol, the API test server, and the manager stand-in
(:class:`fabric_dra_testbed.standins.InventoryServer`), whose bindings appear in the node's emulated
host view as the emulator's do (:mod:`fabric_dra_testbed.standin_hosts`). The real manager learns
partitions and shares separately; these run on the stand-in's contract (design 35-36, A4 and B4).

- a partition claim: the GPU bound, the partition made under its PCI directory, the CDI spec names
  only the partition; unprepare: the partition gone, then the GPU;
- two partitions of one GPU on one node, prepared in one call: one GPU, two partitions, the GPU
  unbound only with the last;
- a partition that cannot be made leaves nothing of its own behind, never touches what is not
  its own, and a restarted plugin removes a partition no claim records;
- memory shares in devdax and kmem mode: the region of the share, its blocks onlined (kmem) and
  offlined before the memory goes; pages in use are retried and the memory never taken away online.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.hostmemory import node_list
from dra_driver.plugin.partitioner import EmulatedPartitioner
from tests.support.kubelet import running_kubelet
from tests.support.plugin import DRIVER
from tests.support.sharing import (
    GIB,
    H100,
    NODE,
    Sharing,
    blocks_of_node,
    env_of,
    kubelet_claim,
    plugin_of,
    sharing_stack,
)

pytestmark = [pytest.mark.slow(seconds=30), pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sharing() -> Iterator[Sharing]:
    with sharing_stack() as running:
        yield running


# -- GPU partitions ---------------------------------------------------------------------------------


def test_a_partition_is_made_handed_over_alone_and_removed_before_its_gpu(sharing: Sharing) -> None:
    async def scenario() -> None:
        ref = await sharing.claim_partition("mig-one", "gpu0-1g10gb-3")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            results = await plugin.prepare([kubelet_claim(ref)])
            (answered,) = results[ref.uid].devices
            assert (answered.device, answered.pool) == ("gpu0-1g10gb-3", "fabric-pcie")
            assert answered.cdi_device_ids == (f"k8s.fabric-dra.io/gpu-partition={ref.uid}-gpu0-1g10gb-3",)

            gpu = sharing.device("gpu0")
            assert [(h.partition, h.claim_uid, h.node) for h in gpu.partitions] == [
                ("gpu0-1g10gb-3", ref.uid, NODE)
            ]
            (made,) = sharing.partitions("gpu0").items()
            assert made[0] == "1g10gb-3"
            files = made[1]
            assert (files["profile"], files["start"], files["size"]) == ("1g.10gb", "3", "1")
            spec = sharing.spec(ref)
            assert spec["kind"] == "k8s.fabric-dra.io/gpu-partition"
            env = env_of(spec)
            assert env["NVIDIA_VISIBLE_DEVICES"] == files["uuid"]
            assert env["FABRIC_DRA_GPU0_1G10GB_3_PARTITION_UUID"] == files["uuid"]
            assert env["FABRIC_DRA_GPU0_1G10GB_3_DEVICE_NODES"] == files["dev"]
            (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
            assert mount["hostPath"].endswith("/mig/1g10gb-3")  # the partition, not its GPU

            await plugin.unprepare([kubelet_claim(ref)])
        assert sharing.gpu("gpu0") is None, "the GPU stayed on the node after its last partition"
        assert sharing.device("gpu0").partitions == []
        assert cdi.spec_files_of_claim(sharing.stack.cdi_root, DRIVER, ref.uid) == []

    asyncio.run(scenario())


def test_two_partitions_of_one_gpu_on_one_node(sharing: Sharing) -> None:
    async def scenario() -> None:
        small = await sharing.claim_partition("mig-small", "gpu1-1g10gb-0")
        large = await sharing.claim_partition("mig-large", "gpu1-3g40gb-4")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            await plugin.prepare([kubelet_claim(small), kubelet_claim(large)])  # one call, concurrently
            made = sharing.partitions("gpu1")
            assert sorted(made) == ["1g10gb-0", "3g40gb-4"]
            assert made["1g10gb-0"]["uuid"] != made["3g40gb-4"]["uuid"]
            assert made["1g10gb-0"]["minor"] != made["3g40gb-4"]["minor"]
            assert env_of(sharing.spec(small))["NVIDIA_VISIBLE_DEVICES"] == made["1g10gb-0"]["uuid"]
            assert env_of(sharing.spec(large))["NVIDIA_VISIBLE_DEVICES"] == made["3g40gb-4"]["uuid"]
            assert len(sharing.device("gpu1").partitions) == 2

            await plugin.unprepare([kubelet_claim(small)])
            assert sorted(sharing.partitions("gpu1")) == ["3g40gb-4"], "the other claim's partition went too"
            assert sharing.hosts.bound().get("gpu1") == NODE, "the GPU left with a partition still in use"

            await plugin.unprepare([kubelet_claim(large)])
        assert "gpu1" not in sharing.hosts.bound()

    asyncio.run(scenario())


def test_a_partition_that_cannot_be_made_leaves_nothing_and_takes_nothing_of_others(sharing: Sharing) -> None:
    async def scenario() -> None:
        first = await sharing.claim_partition("mig-first", "gpu2-1g10gb-0")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            await plugin.prepare([kubelet_claim(first)])
            gpu = sharing.gpu("gpu2")
            assert gpu is not None
            # made on the node outside fabric-dra (an operator's nvidia-smi): slices 2 and 3
            stray = EmulatedPartitioner(sharing.sysfs).create(gpu, H100.profile("2g.20gb"), 2)  # type: ignore[arg-type]

            second = await sharing.claim_partition("mig-second", "gpu2-1g10gb-3")
            results = await plugin.node_prepare_resources([kubelet_claim(second)])
            error = results[second.uid].error
            assert "device gpu2-1g10gb-3 was bound to node node-a but could not be made usable there" in error
            assert f"memory slice 3 is taken by partition {stray.uuid} (2g.20gb at 2)" in error
            assert "\n" not in error
            assert sorted(sharing.partitions("gpu2")) == ["1g10gb-0", "2g20gb-2"]  # nothing half-made
            assert cdi.spec_files_of_claim(sharing.stack.cdi_root, DRIVER, second.uid) == []

            await plugin.unprepare([kubelet_claim(second)])  # the pod goes: its placement is released
            assert [h.claim_uid for h in sharing.device("gpu2").partitions] == [first.uid]
            assert sorted(sharing.partitions("gpu2")) == ["1g10gb-0", "2g20gb-2"]  # never another's

        # a restarted plugin finds the partition its record knows, and removes the one no claim has
        sharing.stack.stop_plugin()
        sharing.stack.start_plugin()
        assert sorted(sharing.partitions("gpu2")) == ["1g10gb-0"]
        assert "removed partition" in sharing.stack.plugin.log_since_start()  # type: ignore[union-attr]
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            again = await plugin.prepare([kubelet_claim(first)])  # answered from the checkpoint
            assert again[first.uid].devices[0].device == "gpu2-1g10gb-0"
            await plugin.unprepare([kubelet_claim(first)])
        assert "gpu2" not in sharing.hosts.bound()

    asyncio.run(scenario())


# -- CXL memory shares ------------------------------------------------------------------------------


def test_a_devdax_share_is_its_dax_device_and_goes_with_its_region(sharing: Sharing) -> None:
    async def scenario() -> None:
        share = str(uuid.uuid4())
        ref = await sharing.claim_share("mem-devdax", share, "4Gi")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            results = await plugin.prepare([kubelet_claim(ref)])
            (answered,) = results[ref.uid].devices
            assert answered.cdi_device_ids == (f"k8s.fabric-dra.io/cxl-memory={ref.uid}-cxlpool0-{share}",)
            assert share in sharing.shares()
            spec = sharing.spec(ref)
            env = env_of(spec)
            p = cdi.env_prefix(f"cxlpool0-{share}")
            assert (env[f"{p}SHARE_ID"], env[f"{p}MEMORY_MODE"], env[f"{p}MEMORY_BYTES"]) == (
                share,
                "devdax",
                str(4 * GIB),
            )
            assert env[f"{p}DEVICE_NODES"] == f"/dev/{env[f'{p}DAX']}"
            assert spec["devices"][0]["containerEdits"].get("hooks") is None
            node = int(
                (sharing.sysfs / "bus" / "dax" / "devices" / env[f"{p}DAX"] / "target_node").read_text()
            )
            assert set(blocks_of_node(sharing, node).values()) == {"offline"}
            await plugin.unprepare([kubelet_claim(ref)])
        assert share not in sharing.shares()
        assert f"cxlpool0/{share}" not in sharing.hosts.bound()
        assert sharing.hosts.yanked == []

    asyncio.run(scenario())


def test_a_kmem_share_is_system_ram_of_its_node_and_offline_before_it_goes(sharing: Sharing) -> None:
    async def scenario() -> None:
        share = str(uuid.uuid4())
        ref = await sharing.claim_share("mem-kmem", share, "2Gi", mode="kmem")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            await plugin.prepare([kubelet_claim(ref)])
            spec = sharing.spec(ref)
            env = env_of(spec)
            p = cdi.env_prefix(f"cxlpool0-{share}")
            node = int(env[f"{p}NUMA_NODE"])
            assert env[f"{p}MEMORY_MODE"] == "kmem" and f"{p}DEVICE_NODES" not in env
            (hook,) = spec["devices"][0]["containerEdits"]["hooks"]
            assert hook == {
                "hookName": "createRuntime",
                "path": "/opt/fabric-dra/bin/fabric-dra",
                "args": ["fabric-dra", "cdi-hook", "set-mems", "--node", str(node)],
                "timeout": 10,
            }
            assert blocks_of_node(sharing, node) and set(blocks_of_node(sharing, node).values()) == {"online"}
            has_memory = (sharing.sysfs / "devices" / "system" / "node" / "has_memory").read_text()
            assert node in node_list(has_memory)
            await plugin.unprepare([kubelet_claim(ref)])
        assert share not in sharing.shares()
        assert sharing.hosts.yanked == [], "the memory was taken away while blocks were online"

    asyncio.run(scenario())


def test_pages_in_use_are_retried_and_the_memory_is_never_taken_away_online(sharing: Sharing) -> None:
    async def scenario() -> None:
        brief, stuck = str(uuid.uuid4()), str(uuid.uuid4())
        passing = await sharing.claim_share("mem-busy-brief", brief, "2Gi", mode="kmem")
        pinned = await sharing.claim_share("mem-busy-stuck", stuck, "2Gi", mode="kmem")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            await plugin.prepare([kubelet_claim(passing), kubelet_claim(pinned)])

            # pages in use for a while: the offline is retried within the call, then it succeeds
            sharing.hosts.pages_in_use(NODE, f"cxlpool0/{brief}", refusals=3)
            await plugin.unprepare([kubelet_claim(passing)])
            assert brief not in sharing.shares()
            assert all(n == 0 for n in sharing.hosts.kernel.pinned.values()), "the refusals were not met"

            # pages that stay in use: the call ends with a retriable error, nothing detached
            node = int(env_of(sharing.spec(pinned))[f"{cdi.env_prefix(f'cxlpool0-{stuck}')}NUMA_NODE"])
            sharing.hosts.pages_in_use(NODE, f"cxlpool0/{stuck}", refusals=1_000_000)
            detaches = len(sharing.manager.detach_calls)
            errors = await plugin.node_unprepare_resources([kubelet_claim(pinned)], deadline=8)
            error = errors[pinned.uid]
            assert "the kernel would not offline 2 memory block(s) of cxlpool0-" in error, error
            assert "the memory stays online and attached to this node" in error, error
            assert "nothing is detached while they are online" in error and "\n" not in error
            assert len(sharing.manager.detach_calls) == detaches, "detached with blocks online"
            assert stuck in sharing.shares()
            assert set(blocks_of_node(sharing, node).values()) == {"online"}

            sharing.hosts.kernel.pinned.clear()  # the pages could be migrated now
            await plugin.unprepare([kubelet_claim(pinned)])
        assert stuck not in sharing.shares()
        assert sharing.hosts.yanked == []

    asyncio.run(scenario())


def test_the_checkpoint_records_the_partition_and_the_share(sharing: Sharing) -> None:
    """What a restart and the next unprepare work from: the partition's placement and record, the
    share's ID, size, mode and onlined blocks."""

    async def scenario() -> None:
        part = await sharing.claim_partition("rec-mig", "gpu0-7g80gb-0")
        share = str(uuid.uuid4())
        mem = await sharing.claim_share("rec-mem", share, "1Gi", mode="kmem")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            await plugin.prepare([kubelet_claim(part), kubelet_claim(mem)])
            part_entry, mem_entry = sharing.entry(part), sharing.entry(mem)
            assert part_entry is not None and mem_entry is not None
            (gpu,) = part_entry["devices"]
            assert (gpu["parent"], gpu["partition_profile"], gpu["partition_start"]) == ("gpu0", "7g.80gb", 0)
            assert gpu["partition"]["uuid"] == sharing.partitions("gpu0")["7g80gb-0"]["uuid"]
            (memory,) = mem_entry["devices"]
            assert (memory["share_id"], memory["memory_bytes"], memory["memory_mode"]) == (share, GIB, "kmem")
            assert len(memory["memory"]["blocks"]) == 1
            await plugin.unprepare([kubelet_claim(part), kubelet_claim(mem)])
        assert sharing.hosts.yanked == [] and "gpu0" not in sharing.hosts.bound()

    asyncio.run(scenario())


def test_two_shares_of_one_size_in_one_claim_get_a_region_each(sharing: Sharing) -> None:
    """Two new regions of one size carry nothing that tells them apart: each share must still
    end up with its own, never both with one."""

    async def scenario() -> None:
        shares = sorted(str(uuid.uuid4()) for _ in range(2))
        results = [
            {
                "request": request,
                "driver": DRIVER,
                "pool": "fabric-cxl",
                "device": "cxlpool0",
                "shareID": share,
                "consumedCapacity": {f"{DRIVER}/memory": "1Gi"},
            }
            for request, share in zip(("left", "right"), shares, strict=True)
        ]
        ref = await sharing.stack.create_claim("mem-twins", [], results=results)
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            answer = await plugin.prepare([kubelet_claim(ref)])
            assert sorted(d.request_names for d in answer[ref.uid].devices) == [("left",), ("right",)]
            entry = sharing.entry(ref)
            assert entry is not None
            regions = {d["share_id"]: d["host"]["region"] for d in entry["devices"]}
            assert sorted(regions) == shares and len(set(regions.values())) == 2
            spec = sharing.spec(ref)
            daxes = {env_of(spec, i)[f"{cdi.env_prefix(f'cxlpool0-{s}')}DAX"] for i, s in enumerate(shares)}
            assert len(daxes) == 2
            await plugin.unprepare([kubelet_claim(ref)])
        assert not set(shares) & set(sharing.shares())
        assert sharing.hosts.yanked == []

    asyncio.run(scenario())


def test_the_reset_between_tenants_removes_the_last_tenants_partitions(sharing: Sharing) -> None:
    """A GPU handed over warm on this node after another tenant (the manager answers
    ``resetRequired``): the partitions that tenant left go before the function-level reset, and the
    new claim gets only its own."""

    async def scenario() -> None:
        sharing.hosts.plug(NODE, sharing.device("gpu2"))  # warm here from the last tenant
        gpu = sharing.gpu("gpu2")
        assert gpu is not None
        left = EmulatedPartitioner(sharing.sysfs)
        leftovers = [left.create(gpu, H100.profile(p), s) for p, s in (("1g.10gb", 0), ("3g.40gb", 4))]  # type: ignore[arg-type]
        sharing.manager.reset_required.add("gpu2")
        ref = await sharing.claim_partition("mig-next-tenant", "gpu2-1g10gb-0")
        async with running_kubelet(sharing.stack.registry_dir) as kubelet:
            plugin = await plugin_of(kubelet)
            await plugin.prepare([kubelet_claim(ref)])
            made = sharing.partitions("gpu2")
            assert list(made) == ["1g10gb-0"]
            assert made["1g10gb-0"]["uuid"] not in {p.uuid for p in leftovers}, "the last tenant's partition"
            assert (Path(gpu.sysfs_path) / "reset").read_text() == "1\n"  # then the function-level reset
            assert sharing.manager.reset_reports == [("gpu2", NODE, "ok")]
            await plugin.unprepare([kubelet_claim(ref)])
        assert "gpu2" not in sharing.hosts.bound()

    asyncio.run(scenario())
