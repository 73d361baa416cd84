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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import DeviceBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import HostScanner
from manager_api.models import Device
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
    uid: str, paths: list[Path], driver: str, scanner: HostScanner | None, taken: set[str]
) -> ClaimEntry | None:
    devices: list[PreparedDevice] = []
    for path in paths:
        try:
            spec_devices = cdi.read_spec_devices(path)
        except cdi.CdiSpecError as err:
            log.error("cannot read CDI spec while rebuilding the checkpoint", claim=uid, error=str(err))
            return None
        for item in spec_devices:
            host = None
            if scanner is not None:
                host = scanner.find(item.identity(), taken)
                if host is not None:
                    taken.add(host.sysfs_path)
            devices.append(
                PreparedDevice(
                    **item.facts(),
                    request_names=list(item.request_names),
                    attached=True,
                    host=host,
                    cdi_device_ids=[cdi.cdi_device_id(driver, item.type, uid, item.device)],
                )
            )
    return ClaimEntry(
        uid=uid,
        state=ClaimState.PREPARE_COMPLETED,
        devices=devices,
        cdi_spec_files=[str(p) for p in paths],
    )


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]


def _device_record(device: Device) -> PreparedDevice:
    return PreparedDevice(**DeviceFacts.of(device), attached=False)


async def reconcile(
    store: CheckpointStore,
    backend: DeviceBackend,
    *,
    cdi_root: Path,
    driver: str,
    real_host: bool,
    scanner: HostScanner | None,
    rebuild: bool,
) -> ReconcileReport:
    """Bring the checkpoint, the CDI specs and the fabric's bindings to this node into agreement
    (module docstring), commit what changed and log every repair and problem."""
    repair = _Repair(store, ReconcileReport(), store.claims(), cdi_root, driver)
    bound = await _fabric_bindings(backend, repair.report)
    by_claim: dict[str, dict[str, Device]] = {}
    for device in bound or []:
        if device.claim_uid:
            by_claim.setdefault(device.claim_uid, {})[device.name] = device
    repair.specs_without_entries(by_claim, scanner=scanner, rebuild=rebuild)
    repair.entries(bound is not None, by_claim, real_host=real_host)
    repair.bindings_without_entries(by_claim)
    if repair.changed:
        await store.commit()
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

    def _put(self, entry: ClaimEntry) -> None:
        self.store.put(entry)
        self.claims[entry.uid] = entry
        self.changed = True

    def specs_without_entries(
        self, by_claim: dict[str, dict[str, Device]], *, scanner: HostScanner | None, rebuild: bool
    ) -> None:
        """Spec files of a claim the checkpoint does not know: re-adopted when the checkpoint was
        rebuilt or the fabric still binds the claim's devices, else removed once a minute old."""
        taken = {d.host.sysfs_path for e in self.claims.values() for d in e.devices if d.host is not None}
        for uid, paths in spec_files_by_claim(self.cdi_root, self.driver).items():
            if uid in self.claims:
                continue
            if rebuild or uid in by_claim:
                entry = _adopt_from_specs(uid, paths, self.driver, scanner, taken)
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
                    self.driver, [d.spec_device(uid) for d in entry.devices], real_host=real_host
                )
                paths = cdi.write_specs(self.cdi_root, self.driver, uid, specs)
                entry = entry.model_copy(update={"cdi_spec_files": [str(p) for p in paths]})
                self._put(entry)
                self.report.repaired.append(f"claim {uid}: rewrote missing CDI spec files")
            if fabric_checked:
                self._lost_bindings(entry, by_claim.get(uid, {}))

    def _lost_bindings(self, entry: ClaimEntry, held: dict[str, Device]) -> None:
        lost = [d.device for d in entry.devices if d.device not in held]
        if not lost:
            return
        devices = [
            d.model_copy(update={"attached": False, "host": None}) if d.device in lost else d
            for d in entry.devices
        ]
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
                    devices=[_device_record(d) for d in held_devices.values()],
                )
            )
            self.changed = True
            self.report.problems.append(
                f"claim {uid}: the fabric binds {', '.join(sorted(held_devices))} to this node but this "
                f"plugin had no record; recorded so that the kubelet's unprepare detaches it"
            )


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
