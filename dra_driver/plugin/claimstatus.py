"""What a claim's owner sees of its devices: a ``Ready`` condition and the device's whereabouts in
the ResourceClaim's ``status.devices`` (KEP-4817, ``resource.k8s.io/v1`` ``AllocatedDeviceStatus``).

For every device (and memory share) of this driver that a claim holds on this node, one entry —
driver, pool, device and, for a share, its ``shareID`` — with:

- ``Ready``: ``True`` (reason ``Prepared``) once the device is attached, visible on the host and
  handed to the runtime; ``False`` with the reason of what stands in the way (``Attaching``,
  ``AttachFailed``, ``NotVisible``, ``PartitionFailed``, ``MemoryFailed``, ``ClaimNotPrepared``:
  this device is in place, another of the claim's is not) and the same one-line message the
  kubelet's event carries;
- ``data``: where the device is — node, fabric, switch, port, the host's PCI address, negotiated
  link generation and width — what this node made of it (partition, memory share) and how long
  the attach took. Kept under the API server's 10 KiB (``AllocatedDeviceStatusDataMaxLength``).

How it is written, and why: a JSON merge patch of the ``status`` subresource that carries the
claim's ``metadata.resourceVersion``, so it is a compare-and-swap (409 on a stale read: read again,
merge again, retry). The first attempt merges onto the claim as this plugin last saw it — the
prepare's own claim read (:meth:`ClaimStatusWriter.seen`), then the object each write answered — so
a claim nobody else touched between prepare and unprepare costs one PATCH per write and no GET; the
compare-and-swap makes a stale copy cost a 409 and a read, never a lost entry. The merge is done
here on what was read: another writer's entries (the controller's binding conditions, another
driver's devices) and the other condition types in this driver's entries stay as they are.
Server-side apply with a field manager per node would let the API server do that merge, but a merge patch
replaces the whole list, which is exactly what is needed to *remove* this node's entries on
unprepare, it is evaluated the same way by every server (the API test server does not model managed
fields), and RBAC needs ``patch`` on ``resourceclaims/status`` only.

Writes run in the background, one worker per claim applying the latest wanted state, so the
kubelet's answer never waits for the API server; an API server that is away is retried with
back-off, a write the API server refuses (admission: another node's claim; validation) is logged
once and dropped. On unprepare this node's ``Ready`` condition and ``data`` go (the entry with
them unless another writer's conditions remain); a deallocated claim's entries are dropped by the
API server itself (``dropDeallocatedStatusDevices``).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.metrics import REGISTRY
from manager_api.models import Device
from plumbing.backoff import Backoff
from plumbing.kube import ApiError, Conflict, Forbidden, Invalid, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim, merge_conditions
from plumbing.kube.resources import RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = [
    "DATA_MAX_BYTES",
    "LINK_HEALTHY",
    "READY",
    "ClaimStatusWriter",
    "DeviceKey",
    "DeviceReadiness",
    "LinkHealth",
    "Reason",
    "device_data",
    "merge_entries",
]

log = get_logger(__name__)

#: the condition type KEP-4817 names for "configured as the class and claim ask"
READY = "Ready"
#: the device's PCIe link still runs as it was negotiated at attach (:mod:`.linkhealth`)
LINK_HEALTHY = "LinkHealthy"
#: the condition types this plugin writes (and takes back on unprepare)
OWNED_CONDITIONS = (READY, LINK_HEALTHY)
#: ``AllocatedDeviceStatusDataMaxLength`` (k8s.io/api/resource/v1/types.go)
DATA_MAX_BYTES = 10 * 1024
_CONFLICT_RETRIES = 8
#: claims whose last-seen object is kept for the next write's first attempt (the oldest go first:
#: a claim read for a prepare that then said nothing would otherwise stay forever)
_SEEN_MAX = 1024

#: (pool, device, share ID): an entry's key within this driver (``SharedDeviceID``)
DeviceKey = tuple[str, str, str | None]


class Reason:
    """The ``Ready`` condition's reasons (metav1 reason syntax: CamelCase)."""

    PREPARED = "Prepared"
    ATTACHING = "Attaching"
    ATTACH_FAILED = "AttachFailed"
    NOT_VISIBLE = "NotVisible"
    PARTITION_FAILED = "PartitionFailed"
    MEMORY_FAILED = "MemoryFailed"
    CLAIM_NOT_PREPARED = "ClaimNotPrepared"


NOT_READY_DEVICES = Gauge(
    "fabric_dra_plugin_claim_devices_not_ready",
    "Devices of claims on this node whose Ready condition is False, by reason",
    ["reason"],
    registry=REGISTRY,
)
READY_DEVICES = Gauge(
    "fabric_dra_plugin_claim_devices_ready",
    "Devices of claims on this node whose Ready condition is True",
    registry=REGISTRY,
)
STATUS_WRITES = Counter(
    "fabric_dra_plugin_claim_status_writes_total",
    "Writes of claims' status.devices, by outcome (written, unchanged, gone, refused, retried)",
    ["outcome"],
    registry=REGISTRY,
)


#: a condition's (status, reason, message)
Said = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class DeviceReadiness:
    """What one device's entry is to say: its ``Ready`` condition and (when given) its ``data``."""

    pool: str
    device: str
    share_id: str | None
    ready: bool
    reason: str
    message: str
    data: dict[str, Any] | None = None

    @property
    def key(self) -> DeviceKey:
        return (self.pool, self.device, self.share_id)

    def conditions(self) -> dict[str, Said]:
        return {READY: ("True" if self.ready else "False", self.reason, self.message)}


@dataclass(frozen=True, slots=True)
class LinkHealth:
    """A device's ``LinkHealthy`` condition, alone (its ``Ready`` and ``data`` stay as they are)."""

    pool: str
    device: str
    share_id: str | None
    healthy: bool
    reason: str
    message: str
    data: None = None

    @property
    def key(self) -> DeviceKey:
        return (self.pool, self.device, self.share_id)

    def conditions(self) -> dict[str, Said]:
        return {LINK_HEALTHY: ("True" if self.healthy else "False", self.reason, self.message)}


@dataclass(frozen=True, slots=True)
class _Pending:
    """What is still to be written of one device: conditions by type, and its data when new."""

    said: dict[str, Said]
    data: dict[str, Any] | None

    def conditions(self) -> dict[str, Said]:
        return self.said

    def then(self, later: Statement | None) -> _Pending | None:
        if later is None:
            return None
        data = later.data if later.data is not None else self.data
        return _Pending({**self.said, **later.conditions()}, data)


Statement = DeviceReadiness | LinkHealth | _Pending


def _pending(statement: Statement | None) -> _Pending | None:
    return None if statement is None else _Pending(dict(statement.conditions()), statement.data)


def _compact(value: Any) -> Any:
    """``value`` without None members (and without members left empty by that)."""
    if isinstance(value, dict):
        kept = {k: _compact(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in kept.items() if v != {}}
    return value


def _size(data: dict[str, Any]) -> int:
    return len(json.dumps(data, separators=(",", ":")).encode())


def device_data(
    node: str, prepared: PreparedDevice, fabric: Device | None, attach_seconds: float | None
) -> dict[str, Any]:
    """The entry's ``data``: where the device is and what this node made of it. Facts the node
    does not have (a device prepared by an earlier run of the plugin has no manager answer at
    hand) are left out, never guessed."""
    host = prepared.host
    data: dict[str, Any] = {"node": node, "type": prepared.type, "model": prepared.model}
    if fabric is not None:
        data |= {
            "fabric": fabric.fabric,
            "switch": fabric.switch,
            "port": fabric.port,
            "link": {"generation": fabric.pcie_generation, "width": fabric.pcie_width},
        }
    if host is not None:
        data |= {"pciAddress": host.pci_address, "numaNode": host.numa_node}
    if prepared.parent is not None:
        data["partition"] = {
            "name": prepared.device,
            "gpu": prepared.parent,
            "profile": prepared.partition_profile,
            "start": prepared.partition_start,
            "uuid": prepared.partition.uuid if prepared.partition is not None else None,
        }
    if prepared.share_id is not None:
        memory = prepared.memory
        data["share"] = {
            "id": prepared.share_id,
            "bytes": prepared.memory_bytes,
            "mode": prepared.memory_mode.value if prepared.memory_mode is not None else None,
            "numaNode": memory.node if memory is not None else None,
            "dax": memory.dax if memory is not None else None,
        }
    if attach_seconds is not None:
        data["attachSeconds"] = round(attach_seconds, 3)
    data = _compact(data)
    if _size(data) > DATA_MAX_BYTES:
        # Names from the fabric are bounded but not by us: rather the where than nothing.
        data = {k: data[k] for k in ("node", "fabric", "switch", "port", "pciAddress") if k in data}
    return data


def _entry_key(entry: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID") or None)


def merge_entries(
    current: list[dict[str, Any]],
    driver: str,
    wanted: Mapping[DeviceKey, Statement | None],
    allocated: set[DeviceKey],
    generation: Any,
) -> list[dict[str, Any]]:
    """``current`` (a claim's ``status.devices``) with this driver's entries as ``wanted`` says:
    a statement sets its conditions (and ``data``, when it has some); None withdraws this plugin's
    conditions and ``data``. Entries
    of devices the claim does not allocate (any more) are not added: the API server refuses them.
    Everything else is kept as it is."""
    devices = [dict(d) for d in current]
    for key, want in wanted.items():
        full = (driver, *key)
        index = next((i for i, d in enumerate(devices) if _entry_key(d) == full), None)
        if want is None:
            if index is None:
                continue
            entry = devices[index]
            conditions = [c for c in entry.get("conditions") or [] if c.get("type") not in OWNED_CONDITIONS]
            entry.pop("data", None)
            if conditions:
                entry["conditions"] = conditions
            else:
                entry.pop("conditions", None)
            if not conditions and not entry.get("networkData"):
                del devices[index]
            continue
        if key not in allocated:
            continue
        if index is None:
            entry = {"driver": driver, "pool": key[0], "device": key[1]}
            if key[2] is not None:
                entry["shareID"] = key[2]
            devices.append(entry)
        else:
            entry = devices[index]
        entry["conditions"] = merge_conditions(entry.get("conditions") or [], want.conditions(), generation)
        if want.data is not None:
            entry["data"] = want.data
    return devices


def _merged(
    earlier: dict[DeviceKey, _Pending | None], later: dict[DeviceKey, Any]
) -> dict[DeviceKey, _Pending | None]:
    """What is to be written once ``later`` is said after ``earlier``: per device, a withdrawal
    replaces everything, a statement adds its conditions to what is pending."""
    merged = dict(earlier)
    for key, statement in later.items():
        pending = merged.get(key)
        if pending is not None:
            merged[key] = pending.then(statement)
        else:
            merged[key] = _pending(statement)
    return merged


class ClaimStatusWriter:
    """Keeps claims' ``status.devices`` entries of this node's devices as the plugin last said
    (:meth:`publish`, :meth:`withdraw`), writing in the background (module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        driver: str,
        node: str,
        version: Callable[[], str] = lambda: RESOURCE_CLAIMS.version,
    ) -> None:
        self._kube = kube
        self._driver = driver
        self._node = node
        self._version = version
        #: claim UID → (the claim, what its entries are to say next)
        self._wanted: dict[str, tuple[ClaimRef, dict[DeviceKey, _Pending | None]]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        #: what each device's Ready says now (None: True, else the reason), for the gauges
        self._said: dict[tuple[str, DeviceKey], str | None] = {}
        self._reasons: set[str] = set()
        #: claim UID → the claim as last read or written here: the base of the next write's first
        #: compare-and-swap (module docstring)
        self._seen: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def seen(self, obj: dict[str, Any]) -> None:
        """``obj`` is a claim as the API server just answered it (the prepare's read): the next write
        of its status starts from it instead of reading it again."""
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return
        self._seen[uid] = obj
        self._seen.move_to_end(uid)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)

    # -- what the plugin says ---------------------------------------------------------------------

    def publish(self, ref: ClaimRef, devices: Iterable[DeviceReadiness | LinkHealth]) -> None:
        self._want(ref, {d.key: d for d in devices})

    def withdraw(self, ref: ClaimRef, keys: Iterable[DeviceKey]) -> None:
        self._want(ref, dict.fromkeys(keys))

    def _want(self, ref: ClaimRef, wanted: dict[DeviceKey, DeviceReadiness | LinkHealth | None]) -> None:
        if not wanted:
            return
        for key, want in wanted.items():
            if want is None:
                self._said.pop((ref.uid, key), None)
            elif isinstance(want, DeviceReadiness):
                self._said[(ref.uid, key)] = None if want.ready else want.reason
        self._count()
        _, pending = self._wanted.get(ref.uid, (ref, {}))
        self._wanted[ref.uid] = (ref, _merged(pending, wanted))
        worker = self._workers.get(ref.uid)
        if worker is None or worker.done():
            self._workers[ref.uid] = asyncio.get_running_loop().create_task(
                self._work(ref.uid), name=f"claim-status-{ref.uid}"
            )

    def _count(self) -> None:
        reasons: dict[str, int] = {}
        for reason in self._said.values():
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
        READY_DEVICES.set(sum(1 for r in self._said.values() if r is None))
        self._reasons.update(reasons)
        for reason in self._reasons:  # a reason no device has any more reads 0, not its last count
            NOT_READY_DEVICES.labels(reason).set(reasons.get(reason, 0))

    # -- writing ------------------------------------------------------------------------------------

    async def _work(self, uid: str) -> None:
        backoff = Backoff(0.2, 30.0, 2.0)
        while uid in self._wanted:
            ref, wanted = self._wanted.pop(uid)
            try:
                await self._write(ref, wanted)
            except (Forbidden, Invalid) as err:
                STATUS_WRITES.labels("refused").inc()
                log.error(
                    "the API server refused the claim's device status",
                    claim=ref.uid,
                    name=f"{ref.namespace}/{ref.name}",
                    node=self._node,
                    error=err.message,
                )
            except (ApiError, OSError) as err:
                STATUS_WRITES.labels("retried").inc()
                # Newer wishes win over this one; what they do not mention is still to be written.
                _, newer = self._wanted.get(uid, (ref, {}))
                self._wanted[uid] = (ref, _merged(wanted, newer))
                log.warning(
                    "claim device status not written; retrying",
                    claim=ref.uid,
                    error=str(err),
                    retry_in=round(backoff.peek(), 2),
                )
                await backoff.sleep()
            else:
                backoff.reset()
        self._workers.pop(uid, None)

    async def _write(self, ref: ClaimRef, wanted: dict[DeviceKey, _Pending | None]) -> None:
        version = self._version()
        # a copy seen before is only a guess at the current claim: the patch's resourceVersion
        # checks it, and a 409 reads the claim again
        obj: dict[str, Any] | None = self._seen.pop(ref.uid, None)
        for _ in range(_CONFLICT_RETRIES):
            if obj is None:
                try:
                    obj = await self._kube.get(RESOURCE_CLAIMS.with_version(version), ref.name, ref.namespace)
                except NotFound:
                    STATUS_WRITES.labels("gone").inc()
                    return
            claim = ResourceClaim.read(obj)
            if claim is None or claim.metadata.uid != ref.uid:
                STATUS_WRITES.labels("gone").inc()
                return  # deleted, or replaced by another claim of the same name
            allocation = claim.status.allocation
            allocated: set[DeviceKey] = {
                (r.pool, r.device, r.share_id)
                for r in (allocation.results if allocation is not None else [])
                if r.driver == self._driver
            }
            current = list((obj.get("status") or {}).get("devices") or [])
            devices = merge_entries(current, self._driver, wanted, allocated, claim.metadata.generation)
            # a withdrawal is a claim's last write: nothing of it is kept for a next one
            keep = any(w is not None for w in wanted.values())
            if devices == current:
                STATUS_WRITES.labels("unchanged").inc()
                if keep:
                    self.seen(obj)
                return
            patch = {
                "metadata": {"resourceVersion": claim.metadata.resource_version},
                "status": {"devices": devices or None},
            }
            try:
                written = await self._kube.patch(
                    RESOURCE_CLAIMS.with_version(version),
                    ref.name,
                    patch,
                    ref.namespace,
                    subresource="status",
                )
            except Conflict:
                obj = None
                continue
            except NotFound:
                STATUS_WRITES.labels("gone").inc()
                return
            STATUS_WRITES.labels("written").inc()
            if keep:
                self.seen(written)
            log.debug("claim device status written", claim=ref.uid, entries=len(devices))
            return
        why = f"claim {ref.uid}: its status kept changing under {_CONFLICT_RETRIES} writes"
        raise Conflict(409, "Conflict", why)

    async def flush(self) -> None:
        """Wait until every wanted state is written (or given up on)."""
        while self._workers:
            await asyncio.gather(*list(self._workers.values()), return_exceptions=True)

    async def aclose(self) -> None:
        for worker in list(self._workers.values()):
            worker.cancel()
        await asyncio.gather(*list(self._workers.values()), return_exceptions=True)
        self._workers.clear()
