"""ResourceClaim controller: claims from templates for pods, and their release.

Follows Kubernetes' ``pkg/controller/resourceclaim/controller.go``:

- for each pod entry with ``resourceClaimTemplateName``, create a ResourceClaim from the
  template — ``generateName: <pod>-<entry>-``, a controller ownerReference to the pod and the
  annotation ``resource.kubernetes.io/pod-claim-name: <entry>`` (how an existing claim is
  found again after a crash) — and record it in ``pod.status.resourceClaimStatuses``;
- when a pod is gone, drop it from each claim's ``status.reservedFor``; a claim reserved by
  nobody is deallocated (``status.allocation`` cleared, the scheduler's
  ``resource.kubernetes.io/delete-protection`` finalizer removed), and a claim generated for
  a pod that no longer exists is deleted.

Pods leave the API only after the stand-in kubelet unprepared their claims (its finalizer),
so a device is never released while a node still has it prepared.
"""

from __future__ import annotations

import copy
from typing import Any

from kube_standin.cluster.events import EventRecorder
from plumbing.kube import Conflict, KubeClient, NotFound
from plumbing.kube.dra import is_allocated
from plumbing.kube.informer import Informer, reconcile_passes
from plumbing.kube.resources import PODS, RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = ["DELETE_PROTECTION", "POD_CLAIM_NAME", "ClaimController", "pod_claim_names"]

log = get_logger(__name__)

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


def pod_claim_names(pod: dict[str, Any]) -> dict[str, str | None]:
    """Pod claim entry → ResourceClaim name (None while the generated claim does not exist yet)."""
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names: dict[str, str | None] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names[entry["name"]] = entry["resourceClaimName"]
        else:
            names[entry["name"]] = statuses.get(entry["name"])
    return names


class ClaimController:
    def __init__(
        self,
        kube: KubeClient,
        pods: Informer,
        claims: Informer,
        templates: Informer,
        events: EventRecorder,
    ) -> None:
        self.kube = kube
        self.pods = pods
        self.claims = claims
        self.templates = templates
        self.events = events
        self._pods: dict[tuple[str, str], dict[str, Any]] | None = None

    async def run(self) -> None:
        await reconcile_passes("claim sync", (self.pods, self.claims, self.templates), self.sync_all)

    async def sync_all(self) -> None:
        for pod in self.pods.values():
            await self.sync_pod(pod)
        # The pods by namespace and name, read without the copy Informer.get makes: the claims'
        # consumers and owners are looked up here once per claim on every pass.
        self._pods = {
            (p["metadata"].get("namespace") or "default", p["metadata"]["name"]): p
            for p in self.pods.values()
        }
        try:
            for claim in self.claims.values():
                await self.sync_claim(claim)
        finally:
            self._pods = None

    # -- claims for pods ----------------------------------------------------------------------

    async def sync_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        entries = (pod.get("spec") or {}).get("resourceClaims") or []
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        recorded = {s.get("name") for s in statuses}
        changed = False
        for entry in entries:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name or entry["name"] in recorded:
                continue
            claim = self._generated_claim(pod, entry["name"]) or await self._create_claim(
                pod, entry, template_name
            )
            if claim is None:
                continue
            statuses.append({"name": entry["name"], "resourceClaimName": claim["metadata"]["name"]})
            changed = True
        if changed:
            try:
                updated = await self.kube.patch(
                    PODS,
                    meta["name"],
                    {"status": {"resourceClaimStatuses": statuses}},
                    meta.get("namespace"),
                    subresource="status",
                )
            except NotFound:
                return
            self.pods.apply(updated)

    def _generated_claim(self, pod: dict[str, Any], entry: str) -> dict[str, Any] | None:
        uid = pod["metadata"]["uid"]
        for claim in self.claims.values():
            meta = claim["metadata"]
            if meta.get("namespace") != pod["metadata"].get("namespace"):
                continue
            if (meta.get("annotations") or {}).get(POD_CLAIM_NAME) != entry:
                continue
            if any(
                ref.get("uid") == uid and ref.get("controller") for ref in meta.get("ownerReferences") or []
            ):
                return claim
        return None

    async def _create_claim(
        self, pod: dict[str, Any], entry: dict[str, Any], template_name: str
    ) -> dict[str, Any] | None:
        meta = pod["metadata"]
        namespace = meta.get("namespace") or "default"
        template = self.templates.get(namespace, template_name)
        if template is None:
            await self.events.record(
                pod,
                "FailedResourceClaimCreation",
                f"PodResourceClaim {entry['name']}: resource claim template {template_name!r} not found",
                type="Warning",
            )
            return None
        template_spec = template.get("spec") or {}
        template_meta = template_spec.get("metadata") or {}
        # generateName as the real controller: "<pod>-<claim>-", shortened to fit a name.
        prefix = f"{meta['name'][:28]}-{entry['name'][:28]}-"
        claim = {
            "apiVersion": RESOURCE_CLAIMS.api_version,
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": prefix,
                "namespace": namespace,
                "labels": template_meta.get("labels") or {},
                "annotations": {**(template_meta.get("annotations") or {}), POD_CLAIM_NAME: entry["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template_spec.get("spec") or {}),
        }
        created = await self.kube.create(
            RESOURCE_CLAIMS, claim, namespace, field_manager="resource-claim-controller"
        )
        self.claims.apply(created)
        log.info("claim created", pod=meta["name"], claim=created["metadata"]["name"], namespace=namespace)
        return created

    # -- releasing ----------------------------------------------------------------------------

    async def sync_claim(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        namespace = meta.get("namespace") or "default"
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        valid = [r for r in reserved if self._consumer_exists(namespace, r)]
        owner_pod = next(
            (r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Pod" and r.get("controller")),
            None,
        )
        owner_gone = owner_pod is not None and not self._pod_exists(
            namespace, owner_pod["name"], owner_pod["uid"]
        )
        deallocated = False
        try:
            if len(valid) != len(reserved) or (not valid and is_allocated(claim)):
                deallocated = not valid
                new_status = {k: v for k, v in status.items() if k != "reservedFor"}
                if valid:
                    new_status["reservedFor"] = valid
                else:
                    new_status.pop("allocation", None)
                    new_status.pop("devices", None)
                body = {**claim, "status": new_status}
                claim = await self.kube.replace(RESOURCE_CLAIMS, body, subresource="status")
                self.claims.apply(claim)
                if not valid:
                    log.info("claim deallocated", claim=meta["name"], namespace=namespace)
            # Only a claim that is no longer allocated loses the finalizer, and only when it was just
            # deallocated or is going away: the scheduler adds it right before allocating.
            releasable = not is_allocated(claim) and (
                deallocated or owner_gone or claim["metadata"].get("deletionTimestamp")
            )
            if releasable and DELETE_PROTECTION in (claim["metadata"].get("finalizers") or []):
                finalizers = [f for f in claim["metadata"]["finalizers"] if f != DELETE_PROTECTION]
                claim = await self.kube.replace(
                    RESOURCE_CLAIMS, {**claim, "metadata": {**claim["metadata"], "finalizers": finalizers}}
                )
                self.claims.apply(claim)
            if owner_gone and not valid and not claim["metadata"].get("deletionTimestamp"):
                await self.kube.delete(RESOURCE_CLAIMS, meta["name"], namespace, uid=meta["uid"])
                log.info("generated claim deleted", claim=meta["name"], namespace=namespace)
        except (Conflict, NotFound):
            return  # the next pass sees the newer object

    def _pod(self, namespace: str, name: str, uid: str | None) -> dict[str, Any] | None:
        """The cached pod with that name and UID, not to be changed. From the pass's index when
        it has it; otherwise from the informer, which may have seen the pod since."""
        pod = (self._pods or {}).get((namespace, name))
        if pod is None or pod["metadata"].get("uid") != uid:
            pod = self.pods.get(namespace, name)
        return pod if pod is not None and pod["metadata"].get("uid") == uid else None

    def _pod_exists(self, namespace: str, name: str, uid: str) -> bool:
        return self._pod(namespace, name, uid) is not None

    def _consumer_exists(self, namespace: str, ref: dict[str, Any]) -> bool:
        if ref.get("resource") != "pods" or ref.get("apiGroup"):
            return True  # some other consumer: not ours to judge
        pod = self._pod(namespace, ref.get("name", ""), ref.get("uid"))
        if pod is None:
            return False
        # A pod that finished no longer needs its devices (controller.go: podResourceClaimIsUnused).
        return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
