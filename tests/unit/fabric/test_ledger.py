"""The ledger: each write carries only the entries that changed, a failed write leaves them for the
next one, and no node may hold more than its bound (the binder refuses that node only)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabric.state.ledger import (
    LEDGER_SHARDS,
    ConfigMapLedgerStore,
    FileLedgerStore,
    Ledger,
    LedgerDocument,
    LedgerEntry,
    LedgerError,
    LedgerState,
    LedgerStore,
    shard_names,
    shard_of,
)
from manager_api import models as api
from manager_api.errors import NodeBindingLimit
from plumbing.kube.client import NotFound
from tests.unit.fabric.fakes import make_harness


def entry(device: str, node: str = "node-0", claim: str = "c1") -> LedgerEntry:
    return LedgerEntry(
        device=device,
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        node=node,
        host=node,
        claim_uid=claim,
        state=LedgerState.ATTACHING,
        operation_id="op",
    )


class RecordingStore(LedgerStore):
    """Keeps what each save was asked to write; fails the saves it is told to."""

    def __init__(self) -> None:
        self.saved: dict[str, str] = {}
        self.writes: list[list[str]] = []
        self.fail = False

    def describe(self) -> str:
        return "memory"

    async def load(self) -> dict[str, LedgerEntry]:
        return {d: LedgerEntry.model_validate_json(raw) for d, raw in self.saved.items()}

    async def save(self, entries: Mapping[str, LedgerEntry], changed: Collection[str]) -> None:
        self.writes.append(sorted(changed))
        if self.fail:
            raise LedgerError("the store is down")
        for device in changed:
            if device in entries:
                self.saved[device] = entries[device].model_dump_json()
            else:
                self.saved.pop(device, None)


async def test_a_write_carries_only_the_changed_entries_and_a_failed_one_keeps_them() -> None:
    store = RecordingStore()
    ledger = Ledger(store)
    await ledger.load()
    for i in range(5):
        ledger.put(entry(f"gpu{i}"))
    await ledger.commit()
    ledger.remove("gpu1")
    ledger.put(entry("gpu2", claim="c2"))
    await ledger.commit()
    assert store.writes == [[f"gpu{i}" for i in range(5)], ["gpu1", "gpu2"]]
    await ledger.commit()  # nothing changed: no write
    assert len(store.writes) == 2

    store.fail = True
    ledger.put(entry("gpu7"))
    with pytest.raises(LedgerError):
        await ledger.commit()
    store.fail = False
    ledger.remove("gpu3")
    await ledger.commit()
    assert store.writes[-1] == ["gpu3", "gpu7"]  # the failed write's change rides along
    reloaded = Ledger(store)
    await reloaded.load()
    assert sorted(e.device for e in reloaded.entries()) == ["gpu0", "gpu2", "gpu4", "gpu7"]
    assert reloaded.get("gpu2").claim_uid == "c2"  # type: ignore[union-attr]


async def test_the_file_store_still_writes_the_whole_ledger(tmp_path: Path) -> None:
    ledger = Ledger(FileLedgerStore(tmp_path))
    await ledger.load()
    ledger.put(entry("gpu0"))
    ledger.put(entry("gpu1"))
    await ledger.commit()
    ledger.remove("gpu0")
    await ledger.commit()
    document = json.loads((tmp_path / "ledger.json").read_text())
    assert (document["kind"], sorted(document["entries"])) == ("FabricDraLedger", ["gpu1"])


async def test_entries_are_counted_per_node_and_the_bound_refuses_that_node_only() -> None:
    ledger = Ledger(RecordingStore(), max_entries_per_node=2)
    await ledger.load()
    ledger.put(entry("gpu0", "node-0"))
    ledger.put(entry("gpu1", "node-0"))
    with pytest.raises(NodeBindingLimit, match=r"node node-0 holds 2 devices .*--max-bindings-per-node"):
        ledger.admit("node-0", "gpu2")
    ledger.admit("node-1", "gpu2")  # another node is not held back
    ledger.put(entry("gpu1", "node-1"))  # an entry that moves to another node moves its count
    assert (ledger.entries_of("node-0"), ledger.entries_of("node-1")) == (1, 1)
    ledger.admit("node-0", "gpu2")
    ledger.remove("gpu0")
    ledger.remove("gpu0")  # twice: counted once
    assert ledger.entries_of("node-0") == 0


async def test_the_binder_refuses_an_attach_beyond_the_nodes_bound(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=2, devices=4)
    h.ledger.max_entries_per_node = 2

    def request(device: str, node: str) -> api.AttachRequest:
        return api.AttachRequest.model_construct(device=device, node=node, claim_uid=f"claim-{device}")

    for device in ("gpu0", "gpu1"):
        assert (await h.attachments.attach(request(device, "node-0"), wait=5))[1] == 200
    with pytest.raises(NodeBindingLimit) as refused:
        await h.attachments.attach(request("gpu2", "node-0"), wait=5)
    assert refused.value.http_status == 409 and refused.value.node == "node-0"
    assert h.ledger.get("gpu2") is None and "gpu2" not in h.fabric.bound
    # the same claim asking again for a device it holds is no new entry: still answered
    assert (await h.attachments.attach(request("gpu1", "node-0"), wait=5))[1] == 200
    assert (await h.attachments.attach(request("gpu2", "node-1"), wait=5))[1] == 200


def test_a_devices_shard_never_moves() -> None:
    # CRC-32 of the name: the same in every process and release (a moved entry would be lost)
    assert [shard_of(d) for d in ("gpu0", "nvme1", "t5")] == [233, 218, 46]
    assert len({shard_of(f"gpu{i}") for i in range(10_000)}) == LEDGER_SHARDS


def test_rbac_names_every_configmap_of_the_deployed_ledger() -> None:
    from fabric.bindings.usage import usage_record_name
    from fabric.state.drains import drain_record_name

    deploy = Path(__file__).parents[3] / "deploy" / "base"
    manager = (deploy / "manager.yaml").read_text()
    name = "fabric-dra-manager-ledger"
    assert f"--ledger-name={name}" in manager
    rules = [
        rule
        for doc in yaml.safe_load_all((deploy / "manager-rbac.yaml").read_text())
        if doc and doc["kind"] == "Role"
        for rule in doc["rules"]
        if "configmaps" in rule["resources"] and "update" in rule["verbs"]
    ]
    assert len(rules) == 1
    assert rules[0]["resourceNames"] == [
        name,
        *shard_names(name),
        usage_record_name(name),
        drain_record_name(name),
    ]


class ShardServer:
    """The three calls the ConfigMap store makes, on a dict (the integration tests use a real
    API server; this checks what a write carries)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []

    async def get(self, res: Any, name: str, namespace: str, **_: Any) -> dict[str, Any]:
        if name not in self.objects:
            raise NotFound(404, "NotFound", f'configmaps "{name}" not found')
        return self.objects[name]

    async def create(self, res: Any, obj: dict[str, Any], namespace: str, **_: Any) -> dict[str, Any]:
        return self._store(obj)

    async def replace(self, res: Any, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._store(obj)

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        self.writes.append(name)
        saved = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(len(self.writes))}}
        self.objects[name] = saved
        return saved


async def test_a_shard_write_carries_its_shards_entries_as_a_ledger_document() -> None:
    server = ShardServer()
    store = ConfigMapLedgerStore(server, name="ledger", namespace="ns")  # type: ignore[arg-type]
    ledger = Ledger(store)
    await ledger.load()
    devices = [f"gpu{i}" for i in range(300)]
    for device in devices:
        ledger.put(entry(device))
    await ledger.commit()
    assert sorted(server.writes) == sorted({shard_names("ledger")[shard_of(d)] for d in devices})
    ledger.put(entry("gpu7", claim="c7"))
    ledger.remove("gpu8")
    server.writes.clear()
    await ledger.commit()
    assert sorted(server.writes) == sorted({shard_names("ledger")[shard_of(d)] for d in ("gpu7", "gpu8")})
    shard = server.objects[shard_names("ledger")[shard_of("gpu7")]]
    document = LedgerDocument.model_validate_json(shard["data"]["ledger.json"])
    assert document.entries["gpu7"].claim_uid == "c7"
    assert sorted(document.entries) == sorted(
        d for d in devices if shard_of(d) == shard_of("gpu7") and d != "gpu8"
    )
    reread = Ledger(ConfigMapLedgerStore(server, name="ledger", namespace="ns"))  # type: ignore[arg-type]
    await reread.load()
    assert sorted(e.device for e in reread.entries()) == sorted(set(devices) - {"gpu8"})


async def test_a_shard_leaves_out_the_fields_at_their_defaults_and_reads_back_the_same_entries() -> None:
    """Each change rewrites its whole shard (both sides parse it), so an entry is written without
    the fields at their defaults; read back, every entry is the one that was put, whatever it holds."""
    from fabric.state.ledger import PartitionHold, ResetState, ShareRecord

    server = ShardServer()
    ledger = Ledger(ConfigMapLedgerStore(server, name="ledger", namespace="ns"))  # type: ignore[arg-type]
    await ledger.load()
    plain = entry("gpu1")
    busy = entry("gpu2").model_copy(
        update={
            "rollback": True,
            "task_monitor": "/redfish/v1/TaskService/TaskMonitors/7",
            "error": "FabricUnavailable",
            "namespace": "team-a",
            "reset": ResetState.PENDING,
            "partitions": [PartitionHold(partition="gpu2-1g.10gb-0", claim_uid="c9")],
        }
    )
    share = entry("pool0/s1").model_copy(
        update={"share": ShareRecord(pool="pool0", share_id="s1", memory_bytes=1 << 30, chunk_mib=1024)}
    )
    for e in (plain, busy, share):
        ledger.put(e)
    await ledger.commit()
    raw = server.objects[shard_names("ledger")[shard_of("gpu1")]]["data"]["ledger.json"]
    written = json.loads(raw)["entries"]["gpu1"]
    assert not {"rollback", "task_monitor", "error", "reset", "partitions", "share"} & set(written)
    reread = Ledger(ConfigMapLedgerStore(server, name="ledger", namespace="ns"))  # type: ignore[arg-type]
    await reread.load()
    assert {e.device: e for e in reread.entries()} == {e.device: e for e in (plain, busy, share)}
