"""Startup repair of partitions and shares, on a host view the emulator laid out: a partition no
claim of this node records is removed, never one a claim records (made or being made) or one the
fabric holds for a claim this node had no record of; a lost checkpoint is rebuilt with the
partition's placement and the share's ID, size and mode from the CDI specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import HostDevice, HostScanner
from dra_driver.plugin.hostmemory import MemoryRecord
from dra_driver.plugin.partitioner import EmulatedPartitioner, Partition
from dra_driver.plugin.reconcile import reconcile
from fabric_dra_testbed.standin_hosts import EmulatedHosts
from fabric_dra_testbed.standins import make_device, make_pool
from manager_api.models import BindingState, Device, MemoryShare, PartitionHolder
from manager_api.partitions import BUILTIN_TABLES, PartitionProfile

NODE = "node-a"
DRIVER = "fabric-dra.io"
H100 = BUILTIN_TABLES["h100-80gb"]
A, B, X = (f"{c * 8}-aaaa-4aaa-8aaa-{c * 12}" for c in "abc")
SHARE = "3f0e6b9c-6f21-4d3b-8a51-0c8d1e2f3a4b"


def profile(name: str) -> PartitionProfile:
    found = H100.profile(name)
    assert found is not None
    return found


class Fabric:
    """What the manager says this node holds (the backend's ``bindings``)."""

    name = "fabric"

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.node = NODE

    async def bindings(self) -> list[Device]:
        return self.devices


@pytest.fixture
def hosts(tmp_path: Path) -> EmulatedHosts:
    return EmulatedHosts(tmp_path / "emu", [NODE])


def partition_record(uid: str, gpu: HostDevice, made: Partition | None, name: str, start: int) -> ClaimEntry:
    device = PreparedDevice(
        **DeviceFacts.of(make_device("gpu0")),
        request_names=["gpu"],
        attached=True,
        host=gpu,
        partition_profile=name,
        partition_start=start,
        partition=made,
    ).model_copy(update={"device": f"gpu0-{profile(name).label}-{start}", "parent": "gpu0"})
    state = ClaimState.PREPARE_COMPLETED if made is not None else ClaimState.PREPARE_STARTED
    return ClaimEntry(uid=uid, state=state, devices=[device])


async def test_only_a_partition_no_claim_has_is_removed(hosts: EmulatedHosts, tmp_path: Path) -> None:
    gpu_device = make_device("gpu0", partition_table=H100)
    hosts.plug(NODE, gpu_device)
    scanner = HostScanner(hosts.sysfs(NODE), real_host=False)
    gpu = scanner.find(identity_of(gpu_device))
    assert gpu is not None
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    made = partitioner.create(gpu, profile("1g.10gb"), 0)  # claim A's, recorded
    partitioner.create(gpu, profile("2g.20gb"), 2)  # claim B's, being made when the plugin died
    partitioner.create(gpu, profile("1g.10gb"), 4)  # claim X's: the fabric holds it, no record here
    stray = partitioner.create(gpu, profile("1g.10gb"), 6)  # nobody's
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()
    store.put(partition_record(A, gpu, made, "1g.10gb", 0))
    store.put(partition_record(B, gpu, None, "2g.20gb", 2))
    bound = gpu_device.model_copy(
        update={
            "state": BindingState.BOUND,
            "node": NODE,
            "partitions": [
                PartitionHolder(partition="gpu0-1g10gb-0", claim_uid=A, node=NODE),
                PartitionHolder(partition="gpu0-2g20gb-2", claim_uid=B, node=NODE),
                PartitionHolder(partition="gpu0-1g10gb-4", claim_uid=X, node=NODE),
            ],
        }
    )
    report = await reconcile(
        store,
        Fabric([bound]),  # type: ignore[arg-type]
        cdi_root=tmp_path / "cdi",
        driver=DRIVER,
        real_host=False,
        scanner=scanner,
        rebuild=False,
        node=NODE,
        partitioner=partitioner,
    )
    assert [(p.profile, p.start) for p in partitioner.existing(gpu)] == [
        ("1g.10gb", 0),
        ("2g.20gb", 2),
        ("1g.10gb", 4),
    ]
    assert (
        f"GPU gpu0: removed partition {stray.uuid} (1g.10gb at slice 6): no claim on this node has it"
        in report.repaired
    )
    # the claim the fabric holds a partition for is recorded, so its unprepare removes it
    entry = store.get(X)
    assert entry is not None and entry.state is ClaimState.PREPARE_STARTED
    assert [(d.device, d.parent, d.type) for d in entry.devices] == [
        ("gpu0-1g10gb-4", "gpu0", "gpu-partition")
    ]


async def test_a_lost_checkpoint_is_rebuilt_with_partitions_and_shares(
    hosts: EmulatedHosts, tmp_path: Path
) -> None:
    gpu_device = make_device("gpu0", partition_table=H100)
    pool = make_pool("cxlpool0", 64 << 30, serial="0xc0ffee000001")
    hosts.plug(NODE, gpu_device)
    hosts.plug(NODE, pool, target=f"cxlpool0/{SHARE}", size=2 << 30)
    scanner = HostScanner(hosts.sysfs(NODE), real_host=False)
    gpu = scanner.find(identity_of(gpu_device))
    region = scanner.find(identity_of(pool, memory_bytes=2 << 30))
    assert gpu is not None and region is not None
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    made = partitioner.create(gpu, profile("3g.40gb"), 4)
    partition = partition_record(A, gpu, made, "3g.40gb", 4).devices[0]
    share = PreparedDevice(
        **{**DeviceFacts.of(pool), "memory_bytes": 2 << 30, "share_id": SHARE},
        request_names=["memory"],
        attached=True,
        host=region,
        memory_mode=MemoryMode.KMEM,
        memory=MemoryRecord(mode=MemoryMode.KMEM, dax=region.dax, node=1, blocks=[1024, 1025]),
    )
    cdi_root = tmp_path / "cdi"
    for uid, device in ((A, partition), (B, share)):
        specs = cdi.build_specs(DRIVER, [device.spec_device(uid)], real_host=False)
        cdi.write_specs(cdi_root, DRIVER, uid, specs)
    held = [
        gpu_device.model_copy(
            update={
                "state": BindingState.BOUND,
                "node": NODE,
                "partitions": [PartitionHolder(partition="gpu0-3g40gb-4", claim_uid=A, node=NODE)],
            }
        ),
        pool.model_copy(
            update={
                "memory_pool": pool.memory_pool.model_copy(  # type: ignore[union-attr]
                    update={
                        "shares": [MemoryShare(share_id=SHARE, claim_uid=B, node=NODE, memory_bytes=2 << 30)]
                    }
                )
            }
        ),
    ]
    store = CheckpointStore(tmp_path / "checkpoint.json", driver=DRIVER, node=NODE)
    store.load()  # nothing: lost
    report = await reconcile(
        store,
        Fabric(held),  # type: ignore[arg-type]
        cdi_root=cdi_root,
        driver=DRIVER,
        real_host=False,
        scanner=scanner,
        rebuild=True,
        node=NODE,
        partitioner=partitioner,
    )
    assert report.problems == []
    (rebuilt_partition,) = store.get(A).devices  # type: ignore[union-attr]
    assert (rebuilt_partition.device, rebuilt_partition.parent, rebuilt_partition.host) == (
        "gpu0-3g40gb-4",
        "gpu0",
        gpu,
    )
    assert (rebuilt_partition.partition_profile, rebuilt_partition.partition_start) == ("3g.40gb", 4)
    assert rebuilt_partition.partition == made
    (rebuilt_share,) = store.get(B).devices  # type: ignore[union-attr]
    assert (rebuilt_share.share_id, rebuilt_share.memory_bytes, rebuilt_share.memory_mode) == (
        SHARE,
        2 << 30,
        MemoryMode.KMEM,
    )
    assert rebuilt_share.host == region
    assert rebuilt_share.key == f"cxlpool0-{SHARE}"
    assert [(p.profile, p.start) for p in partitioner.existing(gpu)] == [("3g.40gb", 4)]  # kept: it is A's
