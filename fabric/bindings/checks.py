"""What an attach must pass before the ledger decides what it means, each check one clear refusal.

* the device of the request's pool (``(pool, device)`` names a DRA device: the same name in another
  pool is another device), allocated to this claim on this node (:class:`fabric.state.claims.ClaimView`,
  when the manager reads the cluster), billed to the claim's own namespace;
* a device and a node the fabric knows, the node cabled to the device's switch;
* a device free (not bound outside fabric-dra) and usable (present, enabled, not Critical).
"""

from __future__ import annotations

from fabric.state.claims import ClaimView
from fabric.state.inventory import Inventory
from fabric.state.ledger import LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord, HostRecord
from manager_api import models as api
from manager_api.errors import BindRefused, DeviceBusy, DeviceNotFound, DeviceUnhealthy, NodeNotFound
from plumbing.logs import get_logger

__all__ = ["busy", "check_free", "check_usable", "claim_allows", "reachable_target"]

log = get_logger(__name__)


async def claim_allows(
    claims: ClaimView | None, inventory: Inventory, request: api.AttachRequest, *, gpu: str | None = None
) -> api.AttachRequest:
    """The attach as its claim allows it: in the pool it names, allocated to the claim on its node
    (without API access there are no claims to check), with the claim's own namespace. A
    partition is named by its device and lives in its ``gpu``'s pool."""
    record = inventory.device(gpu or request.device)
    if request.pool is not None and record is not None and inventory.pool_of(record) != request.pool:
        raise DeviceNotFound(
            f"device {request.device} is in pool {inventory.pool_of(record)}, not in pool "
            f"{request.pool} that the claim's allocation names; this fabric has no such device",
            device=request.device,
        )
    if claims is None or record is None:
        return request
    await claims.check_attach(request.claim_uid, request.device, inventory.pool_of(record), request.node)
    return _trusted_namespace(claims, request)


def _trusted_namespace(claims: ClaimView, request: api.AttachRequest) -> api.AttachRequest:
    """The attach with its claim's own namespace, as the API server has it: what a node's plugin
    sends is only its word, and the namespace is who is billed (docs/manager.md, "What a node may
    send")."""
    claim = claims.get(request.claim_uid)
    trusted = claim.metadata.namespace if claim is not None else None
    if not trusted or trusted == request.namespace:
        return request
    if request.namespace is not None:
        log.warning(
            "attach names another namespace than its claim's; the claim's is recorded",
            claim=request.claim_uid,
            device=request.device,
            node=request.node,
            sent=request.namespace,
            namespace=trusted,
        )
    return request.model_copy(update={"namespace": trusted})


def reachable_target(inventory: Inventory, request: api.AttachRequest) -> tuple[DeviceRecord, HostRecord]:
    """The device and the host of the request's node; refused when either is unknown, or the host
    is not cabled to the device's switch or one linked to it (no Redfish request is sent for such a pair)."""
    name, node = request.device, request.node
    record = inventory.device(name)
    if record is None:
        raise DeviceNotFound(f"device {name} is not in the fabric inventory", device=name)
    host = inventory.host_for_node(node)
    if host is None:
        raise NodeNotFound(f"node {node} is not a host of any fabric this manager knows", node=node)
    if host.id not in record.reachable_hosts:
        if not host.initiators.get(record.fabric):
            raise NodeNotFound(
                f"node {node} (host {host.id}) has no port on fabric {record.fabric} of device {name}",
                node=node,
                device=name,
            )
        raise BindRefused(
            f"device {name} is not reachable from node {node}: host {host.id} is not cabled to the "
            f"switch {name} hangs off, nor to a switch inter-switch links join to it "
            f"(fabric {record.fabric})",
            node=node,
            device=name,
        )
    return record, host


def check_free(inventory: Inventory, record: DeviceRecord) -> None:
    """Refuse a device the fabric binds to a host without a ledger entry: fabric-dra never touches
    bindings it did not make."""
    if record.bound_hosts:
        host = record.bound_hosts[0]
        node = inventory.node_for_host(host)
        held = f"{node or 'host ' + host} (bound outside fabric-dra)"
        raise DeviceBusy(
            f"device {record.name} is bound to {held}; fabric-dra never touches bindings it did not make",
            device=record.name,
            held_by=held,
        )
    check_usable(record)


def check_usable(record: DeviceRecord) -> None:
    """Refuse a device the fabric reports absent, disabled, unusable or Critical."""
    if not record.attributes.available:
        raise DeviceUnhealthy(
            f"device {record.name} is not available: the fabric reports it absent, disabled or unusable",
            device=record.name,
        )
    if record.attributes.health is api.Health.CRITICAL:
        raise DeviceUnhealthy(
            f"device {record.name} is unhealthy: the fabric reports it Critical", device=record.name
        )


def busy(entry: LedgerEntry) -> DeviceBusy:
    """The refusal of a device another claim or node holds, saying who and how."""
    doing = {
        LedgerState.ATTACHING: "being attached to",
        LedgerState.BOUND: "bound to",
        LedgerState.DETACHING: "being detached from",
        LedgerState.WARM: "kept warm on",
    }[entry.state]
    if entry.partition_held:
        holders = ", ".join(f"{entry.node}/{h.claim_uid}" for h in entry.partitions)
        return DeviceBusy(
            f"device {entry.device} is {doing} node {entry.node} for partitions ({holders})",
            device=entry.device,
            held_by=holders or f"{entry.node}/partitions",
            retry_after=2.0,
        )
    return DeviceBusy(
        f"device {entry.device} is {doing} node {entry.node} for claim {entry.claim_uid}",
        device=entry.device,
        held_by=f"{entry.node}/{entry.claim_uid}",
        retry_after=2.0,
    )
