"""Deployment controller: ``apps/v1`` Deployment replicas → Pods.

The stand-in skips ReplicaSets: pods are owned by their Deployment directly (controller
ownerReference) and named ``<deployment>-<5 random chars>``. Scaling down deletes the
newest pods first, pods not yet bound to a node before running ones, as the ReplicaSet
controller ranks them. Template changes are not rolled out.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import string
from typing import Any

from kube_standin.cluster.events import EventRecorder
from plumbing.kube import AlreadyExists, ApiError, KubeClient, NotFound
from plumbing.kube.informer import Informer, wait_any
from plumbing.kube.resources import DEPLOYMENTS, PODS
from plumbing.logs import get_logger

__all__ = ["DeploymentController", "owned_by"]

log = get_logger(__name__)
_SUFFIX = string.ascii_lowercase + string.digits


def owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    return any(
        ref.get("uid") == owner_uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


def _is_running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


class DeploymentController:
    def __init__(
        self, kube: KubeClient, deployments: Informer, pods: Informer, events: EventRecorder
    ) -> None:
        self.kube = kube
        self.deployments = deployments
        self.pods = pods
        self.events = events

    async def run(self) -> None:
        wake_d, wake_p = self.deployments.listen(), self.pods.listen()
        await self.deployments.synced.wait()
        await self.pods.synced.wait()
        while True:
            await wait_any(wake_d, wake_p)
            wake_d.clear()
            wake_p.clear()
            for deployment in self.deployments.values():
                try:
                    await self.reconcile(deployment)
                except ApiError as err:
                    log.warning(
                        "deployment sync failed", deployment=deployment["metadata"]["name"], error=str(err)
                    )
                    wake_d.set()
                    await asyncio.sleep(0.5)
                except Exception:  # a bug must not stop the control plane; log it and go on
                    log.exception("unexpected error; continuing", deployment=deployment["metadata"]["name"])
                    await asyncio.sleep(1.0)

    async def reconcile(self, deployment: dict[str, Any]) -> None:
        meta = deployment["metadata"]
        if meta.get("deletionTimestamp"):
            return
        namespace, name, uid = meta.get("namespace") or "default", meta["name"], meta["uid"]
        spec = deployment.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        mine = [
            p
            for p in self.pods.values()
            if owned_by(p, uid) and not (p.get("metadata") or {}).get("deletionTimestamp")
        ]
        if len(mine) < desired:
            for _ in range(desired - len(mine)):
                await self._create_pod(deployment, namespace, name, uid)
        elif len(mine) > desired:
            # Unscheduled before scheduled, pending before running, newest first.
            ranked = sorted(
                mine,
                key=lambda p: (
                    bool((p.get("spec") or {}).get("nodeName")),
                    _is_running(p),
                    _negated(p["metadata"].get("creationTimestamp") or ""),
                ),
            )
            for pod in ranked[: len(mine) - desired]:
                try:
                    await self.kube.delete(
                        PODS, pod["metadata"]["name"], namespace, uid=pod["metadata"]["uid"]
                    )
                except NotFound:
                    continue
                await self.events.record(
                    deployment, "ScalingReplicaSet", f"Deleted pod {pod['metadata']['name']}", action="Delete"
                )
        await self._status(deployment, mine, desired)

    async def _create_pod(self, deployment: dict[str, Any], namespace: str, name: str, uid: str) -> None:
        template = copy.deepcopy((deployment.get("spec") or {}).get("template") or {})
        pod_meta = template.get("metadata") or {}
        for _ in range(5):
            pod_name = f"{name}-{''.join(secrets.choice(_SUFFIX) for _ in range(5))}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": namespace,
                    "labels": pod_meta.get("labels") or {},
                    "annotations": pod_meta.get("annotations") or {},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": name,
                            "uid": uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": template.get("spec") or {},
            }
            try:
                created = await self.kube.create(PODS, pod, namespace, field_manager="deployment-controller")
            except AlreadyExists:
                continue
            self.pods.apply(created)
            log.info("pod created", deployment=name, pod=pod_name, namespace=namespace)
            await self.events.record(
                deployment, "ScalingReplicaSet", f"Created pod {pod_name}", action="Create"
            )
            return

    async def _status(self, deployment: dict[str, Any], pods: list[dict[str, Any]], desired: int) -> None:
        ready = sum(1 for p in pods if _is_running(p))
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(desired - ready, 0),
        }
        current = deployment.get("status") or {}
        if all(current.get(k, 0) == v for k, v in status.items()):
            return
        meta = deployment["metadata"]
        try:
            updated = await self.kube.patch(
                DEPLOYMENTS, meta["name"], {"status": status}, meta.get("namespace"), subresource="status"
            )
        except NotFound:
            return
        self.deployments.apply(updated)


def _negated(timestamp: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in timestamp)
