"""Device-taint eviction: pods whose allocated device carries a ``NoExecute`` taint are deleted.

Follows Kubernetes' ``pkg/controller/devicetainteviction/device_taint_eviction.go`` (the
``device-taint-eviction-controller`` of kube-controller-manager), only as far as fabric-dra
relies on it:

- the taints are those of the device in its pool's newest ResourceSlices (older generations are
  ignored, ``pool.getDevice``), and those of every DeviceTaintRule that selects the allocated
  device, whether or not a slice still lists it (the controller tracks rules itself since 1.35;
  :mod:`.taint_tracker`), effect ``NoExecute`` only (``allEvictingDeviceTaints``); the rule's
  status (``EvictionInProgress``) is not written;
- a taint is tolerated by the allocation result's ``tolerations`` with effect ``NoExecute`` that
  match it (``resourceclaim.ToleratesTaint``): without ``tolerationSeconds`` for ever, else until
  ``timeAdded + tolerationSeconds`` (``claimEvictionTime``);
- a pod is affected when it is bound to a node and one of its claims is allocated, reserved for
  it and carries such a taint (``podEvictionTime``); pods already being deleted or finished are
  left alone;
- eviction is the ``DeviceTaintManagerEviction`` Event, the ``DisruptionTarget`` condition
  (reason ``DeletionByDeviceTaintManager``) and a delete with the pod's UID as precondition
  (``addConditionAndDeletePod``).

Deallocating the claim is not this controller's part: once the pod is gone the ResourceClaim
controller (:mod:`.claims`) drops it from ``reservedFor`` and deallocates a claim nobody reserves.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from dra_driver.selection.model import DeviceTaint, DeviceToleration
from dra_driver.selection.taints import tolerates
from kube_standin.cluster.claims import pod_claim_names
from kube_standin.cluster.events import EventRecorder
from kube_standin.cluster.taint_tracker import rule_taints
from plumbing.kube import Conflict, KubeClient, NotFound
from plumbing.kube.informer import Informer, reconcile_passes
from plumbing.kube.resources import PODS
from plumbing.logs import get_logger

__all__ = ["TaintEvictionController", "eviction_time"]

log = get_logger(__name__)

_NO_EXECUTE = "NoExecute"


def _added(taint: dict[str, Any], now: float) -> float:
    value = taint.get("timeAdded")
    if not value:
        return now
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return now


def eviction_time(
    taints: list[dict[str, Any]], tolerations: list[dict[str, Any]], now: float
) -> float | None:
    """When a device with ``taints``, allocated with ``tolerations``, must be given up (wall clock);
    None when never."""
    when: float | None = None
    accepted = [DeviceToleration.model_validate(t) for t in tolerations]
    for raw in taints:
        if raw.get("effect") != _NO_EXECUTE:
            continue
        taint = DeviceTaint.model_validate(raw)
        matching = [t for t in accepted if t.effect == _NO_EXECUTE and tolerates(t, taint)]
        if any(t.toleration_seconds is None for t in matching):
            continue  # tolerated for ever
        seconds = min((max(0, t.toleration_seconds or 0) for t in matching), default=0)
        at = _added(raw, now) + seconds
        when = at if when is None else min(when, at)
    return when


class TaintEvictionController:
    def __init__(
        self,
        kube: KubeClient,
        pods: Informer,
        claims: Informer,
        slices: Informer,
        events: EventRecorder,
        rules: Informer | None = None,
    ) -> None:
        self.kube = kube
        self.pods = pods
        self.claims = claims
        self.slices = slices
        self.events = events
        #: DeviceTaintRules, where the API server serves them
        self.rules = rules

    async def run(self) -> None:
        # resync 1 s: a tolerationSeconds running out is seen soon
        informers: tuple[Informer, ...] = (self.pods, self.claims, self.slices)
        if self.rules is not None:
            informers = (*informers, self.rules)
        await reconcile_passes("device taint eviction", informers, self.sync, resync=1.0)

    def _device_taints(self) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
        """(driver, pool, device) → taints, from each pool's newest slices."""
        newest: dict[tuple[str, str], int] = {}
        for item in self.slices.values():
            spec = item.get("spec") or {}
            key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
            newest[key] = max(newest.get(key, 0), int((spec.get("pool") or {}).get("generation") or 0))
        taints: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for item in self.slices.values():
            spec = item.get("spec") or {}
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            if int((spec.get("pool") or {}).get("generation") or 0) != newest[(driver, pool)]:
                continue
            for device in spec.get("devices") or []:
                if device.get("taints"):
                    taints[(driver, pool, device.get("name", ""))] = list(device["taints"])
        return taints

    def claim_eviction(
        self, claim: dict[str, Any], taints: dict[tuple[str, str, str], list[dict[str, Any]]], now: float
    ) -> float | None:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        when: float | None = None
        rules = list(self.rules.values()) if self.rules is not None else []
        for result in (allocation.get("devices") or {}).get("results") or []:
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            device_taints = [*taints.get(key, []), *rule_taints(rules, *key)]
            if not device_taints:
                continue
            at = eviction_time(device_taints, result.get("tolerations") or [], now)
            if at is not None:
                when = at if when is None else min(when, at)
        return when

    async def sync(self) -> None:
        taints = self._device_taints()
        if not taints and not (self.rules is not None and self.rules.values()):
            return
        now = time.time()
        for pod in self.pods.values():
            meta = pod["metadata"]
            spec = pod.get("spec") or {}
            if not spec.get("nodeName") or meta.get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            namespace = meta.get("namespace") or "default"
            for name in pod_claim_names(pod).values():
                claim = self.claims.get(namespace, name) if name else None
                if claim is None:
                    continue
                reserved = (claim.get("status") or {}).get("reservedFor") or []
                if not any(r.get("uid") == meta.get("uid") for r in reserved):
                    continue  # not the pod meant to use the claim
                when = self.claim_eviction(claim, taints, now)
                if when is not None and when <= now:
                    await self.evict(pod)
                    break

    async def evict(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        await self.events.record(pod, "DeviceTaintManagerEviction", "Marking for deletion")
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByDeviceTaintManager",
                "message": "Device Taint manager: deleting due to NoExecute taint",
                "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        try:
            updated = await self.kube.replace(
                PODS, {**pod, "status": {**status, "conditions": conditions}}, subresource="status"
            )
            self.pods.apply(updated)
            await self.kube.delete(PODS, meta["name"], meta.get("namespace"), uid=meta["uid"])
        except (Conflict, NotFound):
            return  # a newer pod object, or gone: the next pass decides
        log.info(
            "pod evicted for a NoExecute device taint", pod=meta["name"], namespace=meta.get("namespace")
        )
