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
    report = ReconcileReport()
    changed = False
    claims = store.claims()
    on_disk = spec_files_by_claim(cdi_root, driver)

    bound: list[Device] | None
    try:
        bound = await backend.bindings()
    except Exception as err:  # the fabric side is re-checked by later calls
        report.problems.append(f"the fabric manager could not be asked for this node's bindings: {err}")
        bound = None
    by_claim: dict[str, dict[str, Device]] = {}
    for device in bound or []:
        if device.claim_uid:
            by_claim.setdefault(device.claim_uid, {})[device.name] = device
    report.fabric_checked = bound is not None

    taken = {d.host.sysfs_path for e in claims.values() for d in e.devices if d.host is not None}
    for uid, paths in on_disk.items():
        if uid in claims:
            continue
        if rebuild or uid in by_claim:
            entry = _adopt_from_specs(uid, paths, driver, scanner, taken)
            if entry is not None:
                store.put(entry)
                claims[uid] = entry
                changed = True
                report.repaired.append(f"claim {uid}: re-adopted from its CDI spec files")
                continue
        young = [p for p in paths if time.time() - p.stat().st_mtime < ORPHAN_SPEC_MIN_AGE]
        if young:
            report.problems.append(
                f"claim {uid}: recent CDI spec files without a checkpoint entry; left alone"
            )
            continue
        cdi.remove_spec_files(paths)
        names = ", ".join(p.name for p in paths)
        report.repaired.append(f"claim {uid}: removed orphaned CDI spec files {names}")

    for uid, entry in list(claims.items()):
        if entry.state is ClaimState.PREPARE_STARTED:
            report.problems.append(
                f"claim {uid}: preparation was interrupted; the kubelet's next call finishes it"
            )
            continue
        missing = _missing(entry.cdi_spec_files)
        if missing or not entry.cdi_spec_files:
            specs = cdi.build_specs(
                driver,
                [d.spec_device(uid) for d in entry.devices],
                real_host=real_host,
            )
            paths = cdi.write_specs(cdi_root, driver, uid, specs)
            entry = entry.model_copy(update={"cdi_spec_files": [str(p) for p in paths]})
            store.put(entry)
            claims[uid] = entry
            changed = True
            report.repaired.append(f"claim {uid}: rewrote missing CDI spec files")
        if bound is not None:
            held = by_claim.get(uid, {})
            lost = [d.device for d in entry.devices if d.device not in held]
            if lost:
                devices = [
                    d.model_copy(update={"attached": False, "host": None}) if d.device in lost else d
                    for d in entry.devices
                ]
                store.put(entry.model_copy(update={"state": ClaimState.PREPARE_STARTED, "devices": devices}))
                changed = True
                report.problems.append(
                    f"claim {uid}: the fabric no longer binds {', '.join(lost)} to this node; the claim goes "
                    f"back to PrepareStarted so the kubelet's next prepare re-attaches"
                )

    for uid, held_devices in by_claim.items():
        if uid in claims:
            continue
        store.put(
            ClaimEntry(
                uid=uid,
                state=ClaimState.PREPARE_STARTED,
                devices=[_device_record(d) for d in held_devices.values()],
            )
        )
        changed = True
        report.problems.append(
            f"claim {uid}: the fabric binds {', '.join(sorted(held_devices))} to this node but this plugin "
            f"had no record; recorded so that the kubelet's unprepare detaches it"
        )

    if changed:
        await store.commit()
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
    return report
