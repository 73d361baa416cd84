"""What the kubelet shows an operator when a device cannot be prepared.

The error a plugin returns for a claim becomes the pod's ``FailedPrepareDynamicResources`` event,
often the only thing an operator reads. Every message names the device, the node, the cause (the
fabric manager's or the fabric's own words) and the next step — what happens by itself and what a
person should do — in one line::

    device gpu0 could not be attached to node kind-worker: device gpu0 is unhealthy: the fabric
    reports it Critical; it cannot be attached until gpu0 is repaired; delete the pod so the
    scheduler allocates another device
"""

from __future__ import annotations

from dra_driver.errors import KubeletPluginError
from manager_api.client import BadToken, ManagerUnreachable
from manager_api.errors import (
    AttachTimeout,
    AuthError,
    BindFailed,
    BindRefused,
    BudgetExceeded,
    DeviceBusy,
    DeviceNotFound,
    DeviceUnhealthy,
    FabricError,
    FabricUnavailable,
    NodeNotFound,
    NotLeader,
)

__all__ = [
    "SHARED_CLAIM_RECIPE",
    "PrepareFailed",
    "attach_failure",
    "cannot_work_here",
    "detach_failure",
    "held_by_claim_elsewhere",
    "kept_attached",
    "rolled_back",
    "still_attaching",
]


class PrepareFailed(KubeletPluginError):
    """A per-claim failure, reported to the kubelet in the claim's ``error`` field."""


#: where the recipe for pods sharing a claim is documented
SHARED_CLAIM_RECIPE = "docs/plugin.md, 'Pods sharing a claim'"


def held_by_claim_elsewhere(err: BaseException, claim_uid: str | None, node: str) -> str | None:
    """The node another pod of the *same* claim has the device on, when ``err`` says so.

    A fabric device is bound to one host at a time. A claim several pods share is prepared on
    every node they run on; where the scheduler did not pin the allocation to one node (no
    ``bindsToNode``: the API server dropped it), it spreads them, and every node but the first
    gets the manager's 409 with ``held_by`` = "<that node>/<this claim's UID>". Retrying cannot
    cure that while the pods there run, so the message says what to change instead."""
    if not isinstance(err, DeviceBusy) or not err.held_by or claim_uid is None:
        return None
    holder, sep, holder_claim = err.held_by.rpartition("/")
    if not sep or holder_claim != claim_uid or not holder or holder == node:
        return None
    return holder


def cannot_work_here(err: BaseException, claim_uid: str | None, node: str) -> bool:
    """Whether ``err`` says this allocation cannot work on ``node`` however often it is retried
    (the pod has to go so the scheduler picks again): the claim's other devices are then rolled
    back rather than kept bound for a retry that cannot succeed."""
    return (
        isinstance(err, BindRefused | DeviceUnhealthy | DeviceNotFound | NodeNotFound)
        or held_by_claim_elsewhere(err, claim_uid, node) is not None
    )


def _devices(names: list[str]) -> str:
    return ("device " if len(names) == 1 else "devices ") + ", ".join(names)


def kept_attached(devices: list[str], node: str) -> str:
    """One line for the devices of a claim that stay attached after a retriable failure of another."""
    verb = "stays" if len(devices) == 1 else "stay"
    return (
        f"{_devices(devices)} of this claim {verb} attached to node {node}: kept so that the kubelet's "
        "retry finishes the claim without attaching again; detached when the pod is deleted"
    )


def rolled_back(released: list[str], kept: list[tuple[str, BaseException]], node: str) -> str:
    """One line for what a claim that cannot work on ``node`` released again, and what it could not."""
    parts = []
    if released:
        verb = "was" if len(released) == 1 else "were"
        parts.append(f"{_devices(released)} of this claim {verb} detached from node {node} again")
    for device, err in kept:
        cause = _cause(err) if isinstance(err, FabricError) else str(err).rstrip(". ")
        parts.append(
            f"device {device} of this claim could not be detached yet ({cause}): it stays attached to "
            f"node {node}, recorded for this claim, and is detached when the pod is deleted"
        )
    if not kept:
        parts.append(f"nothing of this claim is left attached to node {node}")
    return "; ".join(parts)


def _cause(err: FabricError) -> str:
    return err.message.rstrip(". ")


def _next_step(err: BaseException, device: str, node: str) -> str:
    if isinstance(err, BudgetExceeded):
        return (
            "nothing was attached; the kubelet retries the prepare and it succeeds once the tree "
            "releases enough ('fabric-dra budget' shows what each tree holds; docs/budgets.md)"
        )
    if isinstance(err, DeviceBusy):
        return (
            "the kubelet retries and gets it once the holder releases it; if it stays busy, "
            "'fabric-dra status' shows who holds it"
        )
    if isinstance(err, DeviceUnhealthy):
        return (
            f"it cannot be attached until {device} is repaired; delete the pod so the scheduler "
            "allocates another device"
        )
    if isinstance(err, BindRefused):
        return (
            f"this allocation cannot work on node {node} and retrying does not change that: delete the "
            "pod so the scheduler picks again (it offers a device only to the nodes that reach it; "
            "if it picks this node again, check the fabric's cabling and 'fabric-dra status')"
        )
    if isinstance(err, BindFailed):
        return (
            f"{device} was not left bound and the kubelet retries; if it keeps failing, look up the "
            "fabric's MessageId in the Redfish service's log"
        )
    if isinstance(err, AttachTimeout):
        return "the fabric task was cancelled and rolled back; the kubelet retries"
    if isinstance(err, DeviceNotFound):
        return (
            "the device left the fabric; the controller withdraws it from its ResourceSlice — delete "
            "the pod so the scheduler allocates another device"
        )
    if isinstance(err, NodeNotFound):
        return (
            f"node {node} has no port on the device's fabric; check the node's pool labels and "
            "the fabric's cabling, then delete the pod so the scheduler allocates again"
        )
    if isinstance(err, BadToken):
        return (
            "nothing was sent to the fabric manager; check the plugin's token file "
            "(--manager-token-file: the projected service-account token the kubelet writes); the "
            "kubelet retries"
        )
    if isinstance(err, AuthError):
        return (
            "the fabric manager refused this plugin; check the plugin's token (--manager-token-file, "
            "service account fabric-dra-plugin) and the manager's --plugin-service-account"
        )
    if isinstance(err, NotLeader):
        return "no fabric manager replica leads right now; the kubelet retries"
    if isinstance(err, FabricUnavailable):
        if isinstance(err, ManagerUnreachable):
            if err.certificate_refused:
                return (
                    "the fabric manager's TLS certificate was not accepted: check --manager-ca-file and "
                    "that the certificate names the manager's address; the kubelet retries"
                )
            return "check the fabric-dra-manager pods and Service; the kubelet retries"
        return (
            "the fabric manager keeps the attach and finishes it when the fabric answers again; "
            "the kubelet retries — check the Redfish service and the manager's /readyz"
        )
    return "the kubelet retries"


def attach_failure(err: BaseException, device: str, node: str, claim_uid: str | None = None) -> str:
    """One line for a device that could not be attached (or seen) on ``node`` for ``claim_uid``."""
    cause = _cause(err) if isinstance(err, FabricError) else str(err).rstrip(". ")
    elsewhere = held_by_claim_elsewhere(err, claim_uid, node)
    if elsewhere is not None:
        return (
            f"device {device} of this claim is attached to node {elsewhere}, and a fabric device is "
            f"attached to one node at a time, so it cannot be attached to node {node} too: pods sharing "
            f"a fabric-device claim must run on one node — use pod affinity to keep them together "
            f"({SHARED_CLAIM_RECIPE}); this pod cannot start on {node} while the claim's pods on "
            f"{elsewhere} run, and retrying does not change that"
        )
    if isinstance(err, DeviceBusy):
        held = f" (held by {err.held_by})" if err.held_by else ""
        return (
            f"device {device} is in use{held} and could not be attached to node {node}: {cause}; "
            f"{_next_step(err, device, node)}"
        )
    if not isinstance(err, FabricError):  # DeviceNotVisible and other host-side failures
        return (
            f"device {device} was bound to node {node} by the fabric but the node does not see it: "
            f"{cause}; check the node's PCIe hot-plug (or run the plugin with --pci-rescan); the "
            "kubelet retries"
        )
    return f"device {device} could not be attached to node {node}: {cause}; {_next_step(err, device, node)}"


def still_attaching(device: str, node: str, last_error: FabricError | None) -> str:
    """One line for an attach that outlived the kubelet's call (it goes on in the background)."""
    why = f" (waiting for the fabric: {_cause(last_error)})" if last_error is not None else ""
    return (
        f"the fabric is still attaching {device} to node {node}{why}; this goes on in the background "
        "and the kubelet's next call picks up the result"
    )


def detach_failure(err: FabricError, node: str) -> str:
    """One line for an unprepare that could not detach (the claim stays recorded until it can)."""
    device = f"device {err.device}" if err.device else "a device"
    if isinstance(err, ManagerUnreachable):
        step = "check the fabric-dra-manager pods and Service"
    elif isinstance(err, AuthError):  # refused, or a token file that holds no token (BadToken)
        step = "check the plugin's token (--manager-token-file)"
    elif err.code == "DeviceInUse":
        step = "stop what uses it on the node (unmount it, end the process holding it)"
    elif err.code == "MemoryInUse":
        step = (
            "the kernel is asked again to migrate the pages away (nothing is detached while they are online)"
        )
    else:
        step = "the fabric manager keeps the detach and finishes it when the fabric answers"
    return (
        f"{device} could not be detached from node {node} yet: {_cause(err)}; it stays recorded "
        f"on this node, {step}, and the kubelet retries"
    )
