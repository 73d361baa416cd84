"""One pass of the stand-in scheduler, driven by hand against the API test server: its informers'
caches filled from a list and never watched, so what the scheduler sees between its own writes
is exactly what the test gives it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from kube_standin.cluster.events import EventRecorder
from kube_standin.cluster.scheduler import Scheduler
from plumbing.kube import KubeClient
from plumbing.kube.dra import is_allocated
from plumbing.kube.informer import Informer, object_key
from plumbing.kube.resources import (
    DEVICE_CLASSES,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Resource,
)
from tests.integration.cluster.conftest import DRIVER


async def _filled(kube: KubeClient, resource: Resource) -> Informer:
    """An informer whose cache is the server's list, as after its first list, and which never
    watches: the test decides what it sees later."""
    informer = Informer(kube, resource)
    items, _ = await kube.list_all(resource)
    informer.items = {object_key(obj): obj for obj in items}
    informer.synced.set()
    return informer


async def _scheduler(kube: KubeClient) -> tuple[Scheduler, Informer]:
    """A scheduler over filled, never-watching informers, and its claims' informer."""
    claims = await _filled(kube, RESOURCE_CLAIMS)
    scheduler = Scheduler(
        kube,
        pods=await _filled(kube, PODS),
        nodes=await _filled(kube, NODES),
        claims=claims,
        slices=await _filled(kube, RESOURCE_SLICES),
        classes=await _filled(kube, DEVICE_CLASSES),
        events=EventRecorder(kube, "default-scheduler", "test"),
    )
    return scheduler, claims


async def _world(
    kube: KubeClient, gpus: int, pods: int, device: dict[str, Any] | None = None
) -> tuple[str, str, list[str]]:
    """A node, a pool of ``gpus`` GPUs on it (each with the fields of ``device``), a class, and
    ``pods`` pods with one claim of one GPU each: the namespace, the node and the cluster-scoped
    names to delete afterwards."""
    tag = uuid.uuid4().hex[:6]
    ns, node, device_class, pool = f"pass-{tag}", f"node-{tag}", f"gpu-{tag}", f"pool-{tag}"
    await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(NODES, {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
    await kube.create(
        DEVICE_CLASSES,
        {
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    await kube.create(
        RESOURCE_SLICES,
        {
            "metadata": {"name": pool},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "nodeName": node,
                "devices": [{"name": f"gpu-{i}", **(device or {})} for i in range(gpus)],
            },
        },
    )
    await _claims_and_pods(kube, ns, pods, {"name": "gpu", "exactly": {"deviceClassName": device_class}})
    return ns, node, [device_class, pool]


async def _claims_and_pods(kube: KubeClient, ns: str, pods: int, request: dict[str, Any]) -> None:
    """``pods`` claims of the one ``request`` each (``claim-i``), and a pod using each (``pod-i``)."""
    for i in range(pods):
        claim = {"name": f"claim-{i}", "namespace": ns}
        spec = {"devices": {"requests": [request]}}
        await kube.create(RESOURCE_CLAIMS, {"metadata": claim, "spec": spec}, ns)
        await kube.create(
            PODS,
            {
                "metadata": {"name": f"pod-{i}", "namespace": ns},
                "spec": {
                    "resourceClaims": [{"name": "accel", "resourceClaimName": f"claim-{i}"}],
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "accel"}]}}
                    ],
                },
            },
            ns,
        )


@pytest.mark.parametrize("informer_trails", [False, True], ids=["informer-current", "informer-trails"])
async def test_pods_of_one_pass_never_share_a_device(kube: KubeClient, informer_trails: bool) -> None:
    """Three pods, two GPUs, one pass: two pods get one GPU each, the third stays pending — also
    when the claims' informer has not taken the scheduler's writes (a watch event of the older
    version overwrote them), so the allocator's snapshot, kept across the pass, never counts a
    device held by a claim written earlier in the pass as free."""
    ns, node, cluster_scoped = await _world(kube, gpus=2, pods=3)
    try:
        scheduler, claims = await _scheduler(kube)
        if informer_trails:

            def trailing(obj: dict[str, Any]) -> None:
                """The informer keeps the version before the scheduler's write."""

            claims.apply = trailing  # type: ignore[method-assign]
        await scheduler.schedule_pending()

        listed, _ = await kube.list_all(RESOURCE_CLAIMS, ns)
        devices = [
            r["device"]
            for c in listed
            if is_allocated(c)
            for r in c["status"]["allocation"]["devices"]["results"]
        ]
        assert sorted(devices) == ["gpu-0", "gpu-1"]
        listed_pods, _ = await kube.list_all(PODS, ns)
        pending = [p["metadata"]["name"] for p in listed_pods if not p["spec"].get("nodeName")]
        assert len(pending) == 1
        events, _ = await kube.list_all(EVENTS, ns)
        refused = [e for e in events if e.get("reason") == "FailedScheduling"]
        assert [e["regarding"]["name"] for e in refused] == pending
        assert "cannot allocate all claims" in refused[0]["note"]
    finally:
        await kube.delete_ignore_missing(NODES, node)
        await kube.delete_ignore_missing(DEVICE_CLASSES, cluster_scoped[0])
        await kube.delete_ignore_missing(RESOURCE_SLICES, cluster_scoped[1])


async def test_a_trailing_informer_does_not_unreserve_a_pod_waiting_for_binding_conditions(
    kube: KubeClient,
) -> None:
    """A pod whose device has binding conditions waits after the allocation; the next pass checks
    the claim. With the claims' informer still at the version before the scheduler's own write, the
    claim must not look unallocated ("lost its allocation": un-reserved, scheduled again) — the
    scheduler reads its own write until the informer has it, as for allocation."""
    conditions = {
        "bindsToNode": True,
        "bindingConditions": ["FabricAttached"],
        "bindingFailureConditions": ["FabricAttachFailed"],
    }
    ns, node, cluster_scoped = await _world(kube, gpus=1, pods=1, device=conditions)
    try:
        scheduler, claims = await _scheduler(kube)

        def trailing(obj: dict[str, Any]) -> None:
            """The informer keeps the version before the scheduler's write."""

        claims.apply = trailing  # type: ignore[method-assign]
        await scheduler.schedule_pending()  # allocates, then waits for FabricAttached
        writes: list[str] = []
        replace = kube.replace

        async def recorded(
            res: Resource,
            obj: Mapping[str, Any],
            *,
            subresource: str | None = None,
            request_timeout: float | None = None,
        ) -> dict[str, Any]:
            writes.append(f"{res.plural}/{obj['metadata']['name']}")
            return await replace(res, obj, subresource=subresource, request_timeout=request_timeout)

        kube.replace = recorded  # type: ignore[method-assign]
        await scheduler.schedule_pending()  # checks the claim: its condition is not yet True
        kube.replace = replace  # type: ignore[method-assign]
        # un-reserving it from the stale copy would be a write (refused: its resourceVersion is old)
        assert writes == []

        (claim,) = (await kube.list_all(RESOURCE_CLAIMS, ns))[0]
        assert is_allocated(claim), "the claim was un-reserved"
        (pod,) = (await kube.list_all(PODS, ns))[0]
        assert not pod["spec"].get("nodeName"), "bound before its binding conditions were met"
        events, _ = await kube.list_all(EVENTS, ns)
        assert [e["reason"] for e in events if e.get("reason") == "FailedBinding"] == []
    finally:
        await kube.delete_ignore_missing(NODES, node)
        await kube.delete_ignore_missing(DEVICE_CLASSES, cluster_scoped[0])
        await kube.delete_ignore_missing(RESOURCE_SLICES, cluster_scoped[1])


async def test_a_first_available_warm_request_goes_to_the_node_whose_warm_device_is_still_free(
    kube: KubeClient,
) -> None:
    """Two nodes, each with one warm GPU in a node-local slice of one pool, two cold GPUs shared;
    node A runs no pod, node B two. Two pods, one pass, each claim ``firstAvailable: [warm, any]``.
    The first goes to A (fewest pods) and takes its warm GPU; for the second, A can only offer a
    cold GPU through the second subrequest, B its warm one through the first: upstream's DRA
    ``Score`` (8 against 7 before normalisation, 100 against 87 after) outweighs B's one pod more
    (one point of least allocated), so it goes to B — the allocator already counts A's warm GPU
    as taken, where a warm-count node label would still show it."""
    tag = uuid.uuid4().hex[:6]
    ns, device_class, pool = f"warm-{tag}", f"gpu-{tag}", f"pool-{tag}"
    nodes = [f"a-{tag}", f"b-{tag}"]
    await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    for name in nodes:
        await kube.create(NODES, {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    await kube.create(
        DEVICE_CLASSES,
        {
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    warm = {"warm": {"bool": True}}
    slices: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
        ({"nodeName": nodes[0]}, [{"name": "warm-a", "attributes": warm}]),
        ({"nodeName": nodes[1]}, [{"name": "warm-b", "attributes": warm}]),
        ({"allNodes": True}, [{"name": "cold-0"}, {"name": "cold-1"}]),
    ]
    for index, (where, devices) in enumerate(slices):
        await kube.create(
            RESOURCE_SLICES,
            {
                "metadata": {"name": f"{pool}-{index}"},
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": len(slices)},
                    **where,
                    "devices": devices,
                },
            },
        )
    container = {"name": "c", "image": "busybox"}
    for i in range(2):  # B's pods, no claims
        busy = {"metadata": {"name": f"busy-{i}"}, "spec": {"nodeName": nodes[1], "containers": [container]}}
        await kube.create(PODS, busy, ns)
    prefer_warm = [
        {
            "name": "warm",
            "deviceClassName": device_class,
            "selectors": [{"cel": {"expression": f'"warm" in device.attributes["{DRIVER}"]'}}],
        },
        {"name": "any", "deviceClassName": device_class},
    ]
    await _claims_and_pods(kube, ns, 2, {"name": "gpu", "firstAvailable": prefer_warm})
    try:
        scheduler, _ = await _scheduler(kube)
        await scheduler.schedule_pending()

        pods, _ = await kube.list_all(PODS, ns)
        placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        assert placed["pod-0"] == nodes[0] and placed["pod-1"] == nodes[1]
        claims = {c["metadata"]["name"]: c for c in (await kube.list_all(RESOURCE_CLAIMS, ns))[0]}
        results = {
            name: [(r["request"], r["device"]) for r in c["status"]["allocation"]["devices"]["results"]]
            for name, c in claims.items()
        }
        assert results == {"claim-0": [("gpu/warm", "warm-a")], "claim-1": [("gpu/warm", "warm-b")]}
    finally:
        for name in nodes:
            await kube.delete_ignore_missing(NODES, name)
        await kube.delete_ignore_missing(DEVICE_CLASSES, device_class)
        for index in range(len(slices)):
            await kube.delete_ignore_missing(RESOURCE_SLICES, f"{pool}-{index}")
