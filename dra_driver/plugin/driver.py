"""The kubelet-facing callbacks: NodePrepareResources and NodeUnprepareResources.

One implementation (:class:`Driver`) serves both gRPC versions the kubelet speaks,
``k8s.io.kubelet.pkg.apis.dra.v1`` and ``v1beta1`` (their messages are field-for-field the same);
:func:`dra_servicers` wraps it once per version.

Prepare, per claim and under that claim's lock: answer from the checkpoint if the claim is already
prepared; else read the ResourceClaim (UID, allocated, reserved; only this driver's results),
record *PrepareStarted*, attach every device concurrently and wait until the host sees it, write
the CDI specs, record *PrepareCompleted*, answer with the CDI device IDs. When the fabric is slower
than the kubelet's deadline the attach goes on in the background and the claim gets a retriable
error; the kubelet's next call picks up the result, and the message names the devices that stay
attached meanwhile. When a device cannot work on this node at all (the fabric refuses the pair for
good, the device is unhealthy or gone), the devices the claim did attach are detached again: the
pod has to be deleted, and nothing of its claim stays bound to this node.

Unprepare works from the checkpoint alone (the claim may be gone from the API server): remove the
device host-side, detach, drop the CDI specs and the entry. Unknown claims are a no-op success.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from dra_driver.plugin import cdi, prepare_errors
from dra_driver.plugin.attach import ClaimAttacher
from dra_driver.plugin.backend import DeviceBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, PreparedDevice
from dra_driver.plugin.claims import ClaimNotFound, ClaimRef, ClaimSource, ConfigError, memory_mode
from dra_driver.plugin.claimstatus import ClaimStatusWriter, DeviceReadiness, Reason, device_data
from dra_driver.plugin.config import HostMode, PluginConfig
from dra_driver.plugin.hostmemory import MemoryFailed
from dra_driver.plugin.linkhealth import Link, LinkJudge
from dra_driver.plugin.metrics import CLAIM_RESULTS, observe_phase
from dra_driver.plugin.partitioner import PartitionFailed
from dra_driver.plugin.prepare_errors import PrepareFailed
from dra_driver.plugin.state import ClaimLocks
from dra_driver.proto.dra_v1 import api_pb2 as v1_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as v1_grpc
from dra_driver.proto.dra_v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver.proto.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.selection.quantity import QuantityError, parse_quantity
from manager_api.devices import MEMORY_CAPACITY
from manager_api.errors import FabricError
from plumbing.crashpoints import crash_point
from plumbing.kube import ApiError
from plumbing.kube.dra import DeviceRequestAllocationResult, ResourceClaim
from plumbing.logs import get_logger

__all__ = [
    "ClaimOutcome",
    "ClaimRef",
    "Driver",
    "PrepareFailed",
    "PreparedResultDevice",
    "base_request_name",
    "dra_servicers",
]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedResultDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(slots=True)
class ClaimOutcome:
    devices: list[PreparedResultDevice] = field(default_factory=list)
    error: str = ""


class HealthNotifier(Protocol):
    def notify(self) -> None: ...


def base_request_name(request: str) -> str:
    """``req/sub`` -> ``req``: the kubelet matches container requests by the base name
    (k8s.io/dynamic-resource-allocation/resourceclaim.BaseRequestRef)."""
    return request.partition("/")[0]


_Result = TypeVar("_Result")


async def _each_claim(
    refs: Sequence[ClaimRef], work: Callable[[ClaimRef], Awaitable[_Result]]
) -> dict[str, _Result]:
    """``work`` for every distinct claim of one kubelet call, concurrently; results by claim UID."""
    unique = list({ref.uid: ref for ref in refs}.values())
    if len(unique) == 1:  # the usual call: no task to run one claim
        return {unique[0].uid: await work(unique[0])}
    results = await asyncio.gather(*(work(ref) for ref in unique))
    return {ref.uid: result for ref, result in zip(unique, results, strict=True)}


class Driver:
    def __init__(
        self,
        config: PluginConfig,
        *,
        store: CheckpointStore,
        locks: ClaimLocks,
        backend: DeviceBackend,
        claims: ClaimSource,
        status: ClaimStatusWriter | None = None,
        links: LinkJudge | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.driver_name = config.driver_name
        self.node = config.node_name
        self.store = store
        self.locks = locks
        self.backend = backend
        self.claims = claims
        #: writes the claims' ``status.devices`` (None: the claims' status is left alone)
        self.status = status
        #: told the link each device negotiated at attach (health judges it against that)
        self.links = links
        #: claims whose device status this process has said since it started
        self._said: set[str] = set()
        self.health: HealthNotifier | None = None
        self._clock = clock
        self.attacher = ClaimAttacher(backend, store, node=self.node, clock=clock)
        #: attaches still running in the background, by (claim UID, device)
        self.inflight = self.attacher.inflight
        self._real_host = config.host_mode is HostMode.REAL

    # -- deadlines -----------------------------------------------------------------------------

    def deadline(self, time_remaining: float | None) -> float:
        """When to answer: the kubelet's deadline (45 s) minus a margin."""
        remaining = self.config.default_call_timeout if time_remaining is None else time_remaining
        return self._clock() + max(0.0, remaining - self.config.deadline_margin)

    # -- prepare -------------------------------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef], deadline: float) -> dict[str, ClaimOutcome]:
        return await _each_claim(refs, lambda ref: self._prepare_claim(ref, deadline))

    async def _prepare_claim(self, ref: ClaimRef, deadline: float) -> ClaimOutcome:
        try:
            with observe_phase("prepare"):
                async with self.locks.hold(ref.uid):
                    devices = await self._prepare_locked(ref, deadline)
        except PrepareFailed as err:
            CLAIM_RESULTS.labels("prepare", "error").inc()
            log.warning(
                "claim not prepared", claim=ref.uid, name=f"{ref.namespace}/{ref.name}", error=str(err)
            )
            self._say_not_ready(ref)
            return ClaimOutcome(error=str(err))
        except Exception as err:
            CLAIM_RESULTS.labels("prepare", "error").inc()
            log.exception("claim preparation failed unexpectedly", claim=ref.uid)
            return ClaimOutcome(error=f"preparing claim {ref.namespace}/{ref.name} failed: {err!r}")
        CLAIM_RESULTS.labels("prepare", "ok").inc()
        if self.health is not None:
            self.health.notify()
        return ClaimOutcome(devices=devices)

    # -- what the claim's owner sees (status.devices) -------------------------------------------

    def _say_ready(self, ref: ClaimRef, entry: ClaimEntry) -> None:
        """Every device of the prepared claim: Ready, and where it is."""
        if self.links is not None:
            for d in entry.devices:
                fabric, _ = self.attacher.attached_facts(ref.uid, d.key)
                if fabric is not None:
                    link = Link(fabric.pcie_generation, fabric.pcie_width)
                    self.links.negotiated(ref.uid, d.key, link, fabric.pcie_errors)
        if self.status is None:
            self.attacher.forget(ref.uid)
            return
        said = []
        for d in entry.devices:
            fabric, seconds = self.attacher.attached_facts(ref.uid, d.key)
            data = device_data(self.node, d, fabric, seconds)
            where = f" at PCI address {data['pciAddress']}" if "pciAddress" in data else ""
            path = ", ".join(f"{k} {data[k]}" for k in ("fabric", "switch", "port") if k in data)
            said.append(
                DeviceReadiness(
                    d.pool,
                    d.device,
                    d.share_id,
                    ready=True,
                    reason=Reason.PREPARED,
                    message=f"{d.key} is attached to node {self.node}"
                    + (f" through {path}" if path else "")
                    + f", visible{where} and prepared",
                    data=data,
                )
            )
        self.status.publish(ref, said)
        self._said.add(ref.uid)
        self.attacher.forget(ref.uid)

    def _say_not_ready(self, ref: ClaimRef) -> None:
        """The devices of a claim whose prepare failed on the fabric or the host: not Ready, and why.
        A claim refused before any attach (not allocated, replaced) has nothing to say."""
        verdicts = {key: v for (uid, key), v in self.attacher.verdicts.items() if uid == ref.uid}
        entry = self.store.get(ref.uid)
        if self.status is None or not verdicts or entry is None:
            return
        blocking = "; ".join(f"{key}: {reason}" for key, (reason, _) in sorted(verdicts.items()))
        said = []
        for d in entry.devices:
            reason, message = verdicts.get(
                d.key,
                (
                    Reason.CLAIM_NOT_PREPARED,
                    f"{d.key} is in place on node {self.node}, but the claim's other devices are not "
                    f"({blocking})",
                ),
            )
            fabric, seconds = self.attacher.attached_facts(ref.uid, d.key)
            # Never without the node: where the allocation names none, admission holds a plugin
            # to the entries that name its own (deploy/base/admission-policy.yaml).
            data = device_data(self.node, d, fabric, seconds) if d.attached else {"node": self.node}
            said.append(DeviceReadiness(d.pool, d.device, d.share_id, False, reason, message, data))
        self.status.publish(ref, said)
        self._said.add(ref.uid)

    def _answer(self, entry: ClaimEntry) -> list[PreparedResultDevice]:
        return [
            PreparedResultDevice(
                request_names=tuple(d.request_names),
                pool=d.pool,
                device=d.device,
                cdi_device_ids=tuple(d.cdi_device_ids),
            )
            for d in entry.devices
        ]

    async def _read_claim(self, ref: ClaimRef) -> list[PreparedDevice]:
        """The devices of this driver in the claim's allocation, after checking it is the claim asked for."""
        with observe_phase("claim_read"):  # the GET and what the claim says
            return await self._claim_devices(ref)

    async def _claim_devices(self, ref: ClaimRef) -> list[PreparedDevice]:
        what = f"ResourceClaim {ref.namespace}/{ref.name}"
        try:
            claim = await self.claims.get(ref.namespace, ref.name)
        except ClaimNotFound as err:
            raise PrepareFailed(f"{err}; it was deleted before the kubelet prepared it") from err
        except ApiError as err:
            raise PrepareFailed(f"reading {what} failed: {err}; the kubelet will retry") from err
        if claim.metadata.uid != ref.uid:
            raise PrepareFailed(
                f"{what} has UID {claim.metadata.uid}, the kubelet asked for {ref.uid}: the claim was "
                f"replaced; the kubelet will retry with the new one"
            )
        if claim.status.allocation is None:
            raise PrepareFailed(f"{what} is not allocated; the scheduler allocates it before the pod runs")
        if not claim.status.reserved_for:
            raise PrepareFailed(f"{what} is not reserved for any pod (status.reservedFor is empty)")
        devices: dict[tuple[str, str, str | None], PreparedDevice] = {}
        for result in claim.results_for(self.driver_name):
            if result.admin_access:
                raise PrepareFailed(
                    f"{what} requests admin access to device {result.device}; fabric-dra does not support "
                    f"adminAccess (a fabric device is bound to one node for one claim)"
                )
            key = (result.pool, result.device, result.share_id)
            request = base_request_name(result.request)
            other_pool = next((p for p, d, _ in devices if d == result.device and p != result.pool), None)
            if other_pool is not None:
                raise PrepareFailed(
                    f"{what} names device {result.device} in two pools ({other_pool}, {result.pool}); "
                    "a device of this driver is in one pool only: the allocation is wrong"
                )
            if key in devices:
                if request not in devices[key].request_names:
                    devices[key].request_names.append(request)
                continue
            devices[key] = PreparedDevice(
                device=result.device,
                pool=result.pool,
                type="other",
                request_names=[request],
                **self._share_of(what, claim, result),
            )
        return list(devices.values())

    def _share_of(
        self, what: str, claim: ResourceClaim, result: DeviceRequestAllocationResult
    ) -> dict[str, Any]:
        """A share's facts from its allocation result: its ID, its consumed memory and the mode the
        claim's configuration (else ``--memory-mode``) asks for; none for a device allocated whole."""
        if result.share_id is None:
            return {}
        # the allocation names the capacity as the slice published it: qualified by the driver
        asked = (result.consumed_capacity or {}).get(f"{self.driver_name}/{MEMORY_CAPACITY}")
        if asked is None:
            raise PrepareFailed(
                f"{what} allocates share {result.share_id} of device {result.device} without a consumed "
                "capacity of memory; a share of a memory pool is its memory: the allocation is wrong"
            )
        try:
            size = parse_quantity(asked)
            memory_bytes = size.as_integer() if size.is_integer() else None
        except QuantityError as err:
            raise PrepareFailed(f"{what}: share {result.share_id} consumes memory {asked!r}: {err}") from err
        if memory_bytes is None or memory_bytes <= 0:
            raise PrepareFailed(
                f"{what}: share {result.share_id} consumes memory {asked!r}, not a whole number of bytes"
            )
        try:
            mode = memory_mode(claim, result, self.driver_name) or self.config.memory_mode
        except ConfigError as err:
            raise PrepareFailed(
                f"{what}: the configuration of request {result.request} for {self.driver_name} is not "
                f"usable: {err}"
            ) from err
        return {"share_id": result.share_id, "memory_bytes": memory_bytes, "memory_mode": mode}

    async def _prepare_locked(self, ref: ClaimRef, deadline: float) -> list[PreparedResultDevice]:
        self.store.refresh()
        entry = self.store.get(ref.uid)
        if entry is not None and entry.state is ClaimState.PREPARE_COMPLETED:
            self._ensure_specs(entry)
            if entry.uid not in self._said:  # prepared by an earlier run, whose write may be lost
                self._say_ready(ref, entry)
            return self._answer(entry)

        wanted = await self._read_claim(ref)
        if not wanted:
            log.info("claim has no devices of this driver", claim=ref.uid, driver=self.driver_name)
            return []
        known = {(d.pool, d.key): d for d in entry.devices} if entry is not None else {}
        devices = [
            known.get((d.pool, d.key), d).model_copy(update={"request_names": d.request_names})
            for d in wanted
        ]
        entry = ClaimEntry(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=devices,
        )
        with observe_phase("checkpoint"):
            self.store.put(entry)
            crash_point("plugin.prepare.before-checkpoint-started")
            # Guards against a crash of this process mid-attach; after a power loss the fabric's
            # bindings to this node (reconcile) say the same, so no fsync is needed here.
            await self.store.commit(durable=False)
        crash_point("plugin.prepare.after-checkpoint-started")

        entry = await self.attacher.attach_all(ref, entry, deadline)

        with observe_phase("cdi_write"):
            specs = cdi.build_specs(
                self.driver_name,
                [d.spec_device(ref.uid) for d in entry.devices],
                real_host=self._real_host,
                hook_path=self.config.cdi_hook_path,
            )
            crash_point("plugin.prepare.before-cdi-write")
            paths = cdi.write_specs(self.config.cdi_root, self.driver_name, ref.uid, specs)
            crash_point("plugin.prepare.after-cdi-write")
        with observe_phase("checkpoint"):  # the completed record, written durably
            completed = entry.model_copy(
                update={
                    "state": ClaimState.PREPARE_COMPLETED,
                    "cdi_spec_files": [str(p) for p in paths],
                    "devices": [
                        d.model_copy(
                            update={
                                "cdi_device_ids": [
                                    cdi.cdi_device_id(self.driver_name, d.type, ref.uid, d.key)
                                ]
                            }
                        )
                        for d in entry.devices
                    ],
                }
            )
            self.store.put(completed)
            crash_point("plugin.prepare.before-checkpoint-completed")
            await self.store.commit()
        crash_point("plugin.prepare.after-checkpoint-completed")
        self.attacher.drop_reservations(ref.uid)
        self._say_ready(ref, completed)
        log.info(
            "claim prepared",
            claim=ref.uid,
            name=f"{ref.namespace}/{ref.name}",
            node=self.node,
            devices=",".join(d.device for d in completed.devices),
        )
        return self._answer(completed)

    def _ensure_specs(self, entry: ClaimEntry) -> bool:
        """Rewrite the claim's CDI specs if any is missing (e.g. /var/run was cleared by a reboot)."""
        if all(Path(p).exists() for p in entry.cdi_spec_files) and entry.cdi_spec_files:
            return False
        specs = cdi.build_specs(
            self.driver_name,
            [d.spec_device(entry.uid) for d in entry.devices],
            real_host=self._real_host,
            hook_path=self.config.cdi_hook_path,
        )
        cdi.write_specs(self.config.cdi_root, self.driver_name, entry.uid, specs)
        log.warning("rewrote missing CDI spec files", claim=entry.uid)
        return True

    # -- unprepare -----------------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef], deadline: float) -> dict[str, str]:
        return await _each_claim(refs, lambda ref: self._unprepare_claim(ref, deadline))

    async def _unprepare_claim(self, ref: ClaimRef, deadline: float) -> str:
        try:
            with observe_phase("unprepare"):
                async with self.locks.hold(ref.uid):
                    released = await self._unprepare_locked(ref, deadline)
        except FabricError as err:
            CLAIM_RESULTS.labels("unprepare", "error").inc()
            log.warning("claim not unprepared", claim=ref.uid, error=err.message)
            reason = prepare_errors.detach_failure(err, self.node)
            return f"unpreparing claim {ref.namespace}/{ref.name}: {reason}"
        except (PartitionFailed, MemoryFailed) as err:
            CLAIM_RESULTS.labels("unprepare", "error").inc()
            log.warning("claim not unprepared", claim=ref.uid, error=str(err))
            return (
                f"unpreparing claim {ref.namespace}/{ref.name}: {str(err).rstrip('. ')}; nothing was "
                f"detached: the claim stays recorded on node {self.node} and the kubelet retries"
            )
        except Exception as err:
            CLAIM_RESULTS.labels("unprepare", "error").inc()
            log.exception("claim unprepare failed unexpectedly", claim=ref.uid)
            return f"unpreparing claim {ref.namespace}/{ref.name} failed: {err!r}"
        CLAIM_RESULTS.labels("unprepare", "ok").inc()
        self.attacher.forget(ref.uid)
        self._said.discard(ref.uid)
        if self.status is not None and released is not None:
            self.status.withdraw(ref, [(d.pool, d.device, d.share_id) for d in released.devices])
        if self.health is not None:
            self.health.notify()
        return ""

    async def _unprepare_locked(self, ref: ClaimRef, deadline: float) -> ClaimEntry | None:
        """Release the claim; its entry as it was (None when there was nothing to release)."""
        self.store.refresh()
        await self.attacher.inflight.cancel_claim(ref.uid)
        entry = self.store.get(ref.uid)
        if entry is None:
            # Never prepared here, or already unprepared: nothing to undo but stray spec files.
            cdi.remove_spec_files(cdi.spec_files_of_claim(self.config.cdi_root, self.driver_name, ref.uid))
            self.attacher.drop_reservations(ref.uid)
            log.info("claim was not prepared on this node; nothing to do", claim=ref.uid)
            return None
        budget = max(0.0, deadline - self._clock())
        last = self.attacher.last_on_gpu
        if len(entry.devices) == 1:
            device = entry.devices[0]
            await self.backend.release(ref.uid, device, within=budget, last_on_gpu=last(ref.uid, device))
        else:
            results = await asyncio.gather(
                *(
                    self.backend.release(ref.uid, d, within=budget, last_on_gpu=last(ref.uid, d))
                    for d in entry.devices
                ),
                return_exceptions=True,
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]  # the entry stays: the kubelet's retry releases what is left
        with observe_phase("cdi_remove"):
            paths = {Path(p) for p in entry.cdi_spec_files}
            paths.update(cdi.spec_files_of_claim(self.config.cdi_root, self.driver_name, ref.uid))
            cdi.remove_spec_files(paths)
        crash_point("plugin.unprepare.after-cdi-remove")
        with observe_phase("checkpoint"):
            self.store.delete(ref.uid)
            await self.store.commit()
        crash_point("plugin.unprepare.after-checkpoint")
        self.attacher.drop_reservations(ref.uid)
        log.info(
            "claim unprepared",
            claim=ref.uid,
            name=f"{entry.namespace}/{entry.name}",
            node=self.node,
            devices=",".join(d.device for d in entry.devices),
        )
        return entry


# -- gRPC ---------------------------------------------------------------------------------------

_Context = grpc.aio.ServicerContext[Any, Any]


def _make_servicer(pb: Any, base: type) -> type:
    """A DRAPlugin servicer for one proto version, delegating to :class:`Driver`."""

    class Servicer(base):  # type: ignore[misc]
        def __init__(self, driver: Driver) -> None:
            self.driver = driver

        async def NodePrepareResources(self, request: Any, context: _Context) -> Any:
            deadline = self.driver.deadline(context.time_remaining())
            refs = [ClaimRef(c.uid, c.namespace, c.name) for c in request.claims]
            outcomes = await self.driver.prepare(refs, deadline)
            response = pb.NodePrepareResourcesResponse()
            for uid, outcome in outcomes.items():
                claim = response.claims[uid]
                if outcome.error:
                    claim.error = outcome.error
                    continue
                for device in outcome.devices:
                    claim.devices.add(
                        request_names=list(device.request_names),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=list(device.cdi_device_ids),
                    )
            return response

        async def NodeUnprepareResources(self, request: Any, context: _Context) -> Any:
            deadline = self.driver.deadline(context.time_remaining())
            refs = [ClaimRef(c.uid, c.namespace, c.name) for c in request.claims]
            errors = await self.driver.unprepare(refs, deadline)
            response = pb.NodeUnprepareResourcesResponse()
            for uid, error in errors.items():
                claim = response.claims[uid]
                if error:
                    claim.error = error
            return response

    Servicer.__name__ = f"DRAPluginServicer_{pb.__name__.split('.')[-2]}"
    return Servicer


_V1Servicer = _make_servicer(v1_pb2, v1_grpc.DRAPluginServicer)
_V1beta1Servicer = _make_servicer(v1beta1_pb2, v1beta1_grpc.DRAPluginServicer)

#: PluginInfo.supported_versions names the services, as the kubelet expects
#: (k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService = "v1.DRAPlugin").
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def dra_servicers(driver: Driver, server: grpc.aio.Server) -> list[str]:
    """Register both DRAPlugin versions on ``server``; returns their supported_versions names."""
    v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(driver), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1Servicer(driver), server)
    return list(DRA_SERVICES)
