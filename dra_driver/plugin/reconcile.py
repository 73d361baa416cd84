"""Startup reconciliation of the three records of what is prepared on this node.

- the checkpoint (what this plugin finished or started),
- the CDI spec files in ``--cdi-root`` (what containers can be given),
- the fabric's bindings to this node, from the manager (what is really attached).

Repairs: a missing spec of a prepared claim is rewritten; a spec without a checkpoint entry is
re-adopted when the checkpoint was lost (rebuilt) or the fabric still binds the claim's devices,
else removed once it is a minute old (younger ones may belong to a pod of a rolling update that
is mid-prepare); a prepared device the fabric no longer binds here sends its claim back to
*PrepareStarted*, so the kubelet's next prepare re-attaches it instead of answering from the
checkpoint; a device the fabric binds here for a claim we have no record of is recorded, so the
kubelet's unprepare detaches it. Everything else is reported as a problem in the log.

GPU partitions: on every GPU this node holds for partitions (its claims' records, the fabric's
partition holders here), a partition whose placement no claim of this node records is a
leftover of a crash — made by a prepare that never recorded it, or missed by an unprepare — and
is removed; a placement a claim records (made, or being made) is never touched. Memory shares
held here are keyed by their share ID, as partitions are by their partition device.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.plugin import cdi
from dra_driver.plugin.attach import PARTITION_TYPE
from dra_driver.plugin.backend import DeviceBackend, held_by_claim, identity_of
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import HostDevice, HostScanner
from dra_driver.plugin.partitioner import Partitioner, PartitionFailed
from manager_api.models import Device
from manager_api.partitions import parse_partition
from plumbing.logs import get_logger

__all__ = ["ReconcileReport", "reconcile", "spec_files_by_claim"]

log = get_logger(__name__)

ORPHAN_SPEC_MIN_AGE = 60.0


@dataclass
class ReconcileReport:
    repaired: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fabric_checked: bool = False


def spec_files_by_claim(cdi_root: Path, driver: str) -> dict[str, list[Path]]:
    prefix = f"k8s.{driver}-"
    found: dict[str, list[Path]] = {}
    try:
        names = os.listdir(cdi_root)
    except FileNotFoundError:
        return found
    for name in sorted(names):
        if not (name.startswith(prefix) and name.endswith(".json")) or "_" not in name:
            continue
        uid = name[: -len(".json")].rpartition("_")[2]
        found.setdefault(uid, []).append(cdi_root / name)
    return found


def _adopt_from_specs(
    uid: str,
    paths: list[Path],
    driver: str,
    scanner: HostScanner | None,
    taken: set[str],
    partitioner: Partitioner | None,
) -> ClaimEntry | None:
    devices: list[PreparedDevice] = []
    for path in paths:
        try:
            spec_devices = cdi.read_spec_entries(path)
        except cdi.CdiSpecError as err:
            log.error("cannot read CDI spec while rebuilding the checkpoint", claim=uid, error=str(err))
            return None
        for item, prefix, env in spec_devices:
            sharing = _sharing_from_env(item, prefix, env)
            identity = item.identity()
            if sharing.get("memory_bytes"):
                identity = dataclasses.replace(identity, memory_bytes=sharing["memory_bytes"])
            host = None
            if scanner is not None:
                # a GPU with partitions is shared by their claims; a whole device or a region is not
                host = scanner.find(identity, () if item.parent is not None else taken)
                if host is not None and item.parent is None:
                    taken.add(host.sysfs_path)
            partition = None
            if host is not None and partitioner is not None and sharing.get("partition_profile"):
                partition = _partition_at(
                    partitioner, host, sharing["partition_profile"], sharing["partition_start"]
                )
            devices.append(
                PreparedDevice(
                    **{**item.facts(), **{k: v for k, v in sharing.items() if k == "memory_bytes"}},
                    request_names=list(item.request_names),
                    attached=True,
                    host=host,
                    cdi_device_ids=[cdi.cdi_device_id(driver, item.type, uid, item.key)],
                    partition=partition,
                    **{k: v for k, v in sharing.items() if k != "memory_bytes"},
                )
            )
    return ClaimEntry(
        uid=uid,
        state=ClaimState.PREPARE_COMPLETED,
        devices=devices,
        cdi_spec_files=[str(p) for p in paths],
    )


def _sharing_from_env(item: cdi.SpecDevice, prefix: str, env: dict[str, str]) -> dict[str, Any]:
    """A partition's placement and a share's size and mode, from a spec's variables."""
    found: dict[str, Any] = {}
    start = env.get(f"{prefix}PARTITION_START", "")
    if item.parent is not None and env.get(f"{prefix}PARTITION_PROFILE") and start.isdigit():
        found |= {"partition_profile": env[f"{prefix}PARTITION_PROFILE"], "partition_start": int(start)}
    if item.share_id is not None:
        size = env.get(f"{prefix}MEMORY_BYTES", "")
        if size.isdigit():
            found["memory_bytes"] = int(size)
        with contextlib.suppress(ValueError):
            found["memory_mode"] = MemoryMode(env.get(f"{prefix}MEMORY_MODE", ""))
    return found


def _partition_at(partitioner: Partitioner, host: HostDevice, profile: str, start: int) -> Any:
    try:
        existing = partitioner.existing(host)
    except PartitionFailed as err:
        log.error("cannot list a GPU's partitions while rebuilding the checkpoint", error=str(err))
        return None
    return next((p for p in existing if p.is_placement(profile, start)), None)


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]


def _device_record(key: str, device: Device) -> PreparedDevice:
    """The record of what the fabric holds here for a claim nobody recorded: a device, a
    partition of it (``key`` is the partition device) or a share of its pool."""
    record = PreparedDevice(**DeviceFacts.of(device), attached=False)
    if device.memory_pool is not None:
        share = next((s for s in device.memory_pool.shares if key == f"{device.name}-{s.share_id}"), None)
        if share is not None:
            return record.model_copy(update={"share_id": share.share_id, "memory_bytes": share.memory_bytes})
    if key != device.name:
        return record.model_copy(update={"device": key, "parent": device.name, "type": PARTITION_TYPE})
    return record


async def reconcile(
    store: CheckpointStore,
    backend: DeviceBackend,
    *,
    cdi_root: Path,
    driver: str,
    real_host: bool,
    scanner: HostScanner | None,
    rebuild: bool,
    node: str = "",
    partitioner: Partitioner | None = None,
    hook_path: str = cdi.DEFAULT_HOOK_PATH,
) -> ReconcileReport:
    """Bring the checkpoint, the CDI specs and the fabric's bindings to this node into agreement
    (module docstring), commit what changed and log every repair and problem."""
    repair = _Repair(store, ReconcileReport(), store.claims(), cdi_root, driver, hook_path=hook_path)
    bound = await _fabric_bindings(backend, repair.report)
    by_claim = held_by_claim(bound or [], node or getattr(backend, "node", ""))
    repair.specs_without_entries(by_claim, scanner=scanner, rebuild=rebuild, partitioner=partitioner)
    repair.entries(bound is not None, by_claim, real_host=real_host)
    repair.bindings_without_entries(by_claim)
    if repair.changed:
        await store.commit()
    if partitioner is not None and scanner is not None:
        await asyncio.to_thread(repair.leftover_partitions, partitioner, scanner, bound or [])
    _log(repair.report, store)
    return repair.report


async def _fabric_bindings(backend: DeviceBackend, report: ReconcileReport) -> list[Device] | None:
    """The fabric's bindings to this node; None (and a problem reported) when it cannot say."""
    try:
        bound = await backend.bindings()
    except Exception as err:  # the fabric side is re-checked by later calls
        report.problems.append(f"the fabric manager could not be asked for this node's bindings: {err}")
        bound = None
    report.fabric_checked = bound is not None
    return bound


@dataclass
class _Repair:
    """One reconcile pass over the three records: what it has changed and found so far."""

    store: CheckpointStore
    report: ReconcileReport
    claims: dict[str, ClaimEntry]
    cdi_root: Path
    driver: str
    changed: bool = False
    hook_path: str = cdi.DEFAULT_HOOK_PATH

    def _put(self, entry: ClaimEntry) -> None:
        self.store.put(entry)
        self.claims[entry.uid] = entry
        self.changed = True

    def specs_without_entries(
        self,
        by_claim: dict[str, dict[str, Device]],
        *,
        scanner: HostScanner | None,
        rebuild: bool,
        partitioner: Partitioner | None = None,
    ) -> None:
        """Spec files of a claim the checkpoint does not know: re-adopted when the checkpoint was
        rebuilt or the fabric still binds the claim's devices, else removed once a minute old."""
        taken = {
            d.host.sysfs_path
            for e in self.claims.values()
            for d in e.devices
            if d.host is not None and d.parent is None
        }
        for uid, paths in spec_files_by_claim(self.cdi_root, self.driver).items():
            if uid in self.claims:
                continue
            if rebuild or uid in by_claim:
                entry = _adopt_from_specs(uid, paths, self.driver, scanner, taken, partitioner)
                if entry is not None:
                    self._put(entry)
                    self.report.repaired.append(f"claim {uid}: re-adopted from its CDI spec files")
                    continue
            young = [p for p in paths if time.time() - p.stat().st_mtime < ORPHAN_SPEC_MIN_AGE]
            if young:
                self.report.problems.append(
                    f"claim {uid}: recent CDI spec files without a checkpoint entry; left alone"
                )
                continue
            cdi.remove_spec_files(paths)
            names = ", ".join(p.name for p in paths)
            self.report.repaired.append(f"claim {uid}: removed orphaned CDI spec files {names}")

    def entries(
        self, fabric_checked: bool, by_claim: dict[str, dict[str, Device]], *, real_host: bool
    ) -> None:
        """Each recorded claim: its missing spec files rewritten; sent back to PrepareStarted when
        the fabric no longer binds one of its devices here."""
        for uid, entry in list(self.claims.items()):
            if entry.state is ClaimState.PREPARE_STARTED:
                self.report.problems.append(
                    f"claim {uid}: preparation was interrupted; the kubelet's next call finishes it"
                )
                continue
            missing = _missing(entry.cdi_spec_files)
            if missing or not entry.cdi_spec_files:
                specs = cdi.build_specs(
                    self.driver,
                    [d.spec_device(uid) for d in entry.devices],
                    real_host=real_host,
                    hook_path=self.hook_path,
                )
                paths = cdi.write_specs(self.cdi_root, self.driver, uid, specs)
                entry = entry.model_copy(update={"cdi_spec_files": [str(p) for p in paths]})
                self._put(entry)
                self.report.repaired.append(f"claim {uid}: rewrote missing CDI spec files")
            if fabric_checked:
                self._lost_bindings(entry, by_claim.get(uid, {}))

    def _lost_bindings(self, entry: ClaimEntry, held: dict[str, Device]) -> None:
        lost = [d.key for d in entry.devices if d.key not in held]
        if not lost:
            return
        # what this node made of it went with it (a partition, onlined memory): made anew
        cleared = {"attached": False, "host": None, "partition": None, "memory": None}
        devices = [d.model_copy(update=cleared) if d.key in lost else d for d in entry.devices]
        # Recorded in the store only: the pass goes on with the entry as it was (no spec to rewrite).
        self.store.put(entry.model_copy(update={"state": ClaimState.PREPARE_STARTED, "devices": devices}))
        self.changed = True
        self.report.problems.append(
            f"claim {entry.uid}: the fabric no longer binds {', '.join(lost)} to this node; the claim goes "
            f"back to PrepareStarted so the kubelet's next prepare re-attaches"
        )

    def bindings_without_entries(self, by_claim: dict[str, dict[str, Device]]) -> None:
        """Devices the fabric binds here for a claim with no record: recorded, so the kubelet's
        unprepare detaches them."""
        for uid, held_devices in by_claim.items():
            if uid in self.claims:
                continue
            self.store.put(
                ClaimEntry(
                    uid=uid,
                    state=ClaimState.PREPARE_STARTED,
                    devices=[_device_record(key, d) for key, d in held_devices.items()],
                )
            )
            self.changed = True
            self.report.problems.append(
                f"claim {uid}: the fabric binds {', '.join(sorted(held_devices))} to this node but this "
                f"plugin had no record; recorded so that the kubelet's unprepare detaches it"
            )

    def leftover_partitions(
        self, partitioner: Partitioner, scanner: HostScanner, bound: list[Device]
    ) -> None:
        """Remove, from every GPU this node holds for partitions, each partition whose placement
        no claim of this node records (module docstring). Blocking (NVML)."""
        for gpu, host in self._partitioned_gpus(scanner, bound).items():
            try:
                existing = partitioner.existing(host)
            except PartitionFailed as err:
                self.report.problems.append(f"GPU {gpu}: its partitions could not be listed: {err}")
                continue
            # a concurrent plugin pod (rolling update) records its placement before it makes one
            self.store.refresh()
            known = self._placements(gpu, bound)
            for partition in existing:
                if (partition.profile, partition.start) in known:
                    continue
                try:
                    partitioner.destroy(partition)
                except PartitionFailed as err:
                    self.report.problems.append(f"GPU {gpu}: leftover partition not removed: {err}")
                    continue
                self.report.repaired.append(
                    f"GPU {gpu}: removed partition {partition.uuid or '(no compute instance)'} "
                    f"({partition.profile} at slice {partition.start}): no claim on this node has it"
                )

    def _partitioned_gpus(self, scanner: HostScanner, bound: list[Device]) -> dict[str, HostDevice]:
        """GPU device name → where this host has it, for every GPU it holds for partitions."""
        gpus: dict[str, HostDevice] = {}
        for entry in self.store.claims().values():
            for d in entry.devices:
                if d.parent is not None and d.host is not None and scanner.present(d.host):
                    gpus.setdefault(d.parent, d.host)
        for device in bound:
            if device.partitions and device.name not in gpus:
                host = scanner.find(identity_of(device))
                if host is not None:
                    gpus[device.name] = host
        return gpus

    def _placements(self, gpu: str, bound: list[Device]) -> set[tuple[str, int]]:
        """(profile, start) of every partition of ``gpu`` a claim of this node records."""
        tables = {d.name: d.partition_table for d in bound if d.partition_table is not None}
        known: set[tuple[str, int]] = set()
        for entry in self.store.claims().values():
            for d in entry.devices:
                if d.parent != gpu:
                    continue
                if d.partition_profile is not None and d.partition_start is not None:
                    known.add((d.partition_profile, d.partition_start))
                elif gpu in tables:
                    placement = parse_partition(d.device, {gpu: tables[gpu]})
                    if placement is not None:
                        known.add((placement.profile.name, placement.start))
        return known


def _log(report: ReconcileReport, store: CheckpointStore) -> None:
    for line in report.repaired:
        log.warning("reconcile repaired", detail=line)
    for line in report.problems:
        log.error("reconcile found a problem", detail=line)
    log.info(
        "reconcile done",
        claims=len(store.claims()),
        repaired=len(report.repaired),
        problems=len(report.problems),
        fabric_checked=report.fabric_checked,
    )
