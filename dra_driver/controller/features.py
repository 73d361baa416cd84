"""What the cluster serves and keeps.

Device taints (``DRADeviceTaints``) and ``bindsToNode`` (``DRADeviceBindingConditions`` +
``DRAResourceClaimDeviceStatus``) cannot be asked for directly: a server with a gate off
accepts the write and silently drops the field (``dropDisabledFields`` in
``pkg/registry/resource/resourceslice/strategy.go``). Discovery does not tell either: a default
1.36 server keeps taints although it serves ``devicetaintrules`` nowhere (that API is off by
default until 1.37). So :func:`probe_slice_fields` asks the server itself — a server-side
dry-run create of a ResourceSlice whose device carries a taint and ``bindsToNode`` — and reads
which fields came back. :mod:`.publisher` also checks what the API server stored on every write
and stops sending a field it drops.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from dra_driver.errors import ControllerError
from plumbing.kube import ApiError, Invalid, KubeClient, NotFound
from plumbing.kube.resources import DEVICE_TAINT_RULE_VERSIONS, RESOURCE_SLICES
from plumbing.logs import get_logger

__all__ = [
    "CounterLayout",
    "KeptFields",
    "ResourceApiMissing",
    "TaintsMode",
    "device_taint_rules_version",
    "device_taints_served",
    "probe_counter_layout",
    "probe_slice_fields",
    "require_resource_v1",
]

log = get_logger(__name__)

TaintsMode = Literal["auto", "on", "off"]
GROUP = "resource.k8s.io"


class CounterLayout(StrEnum):
    """Where a pool's shared counters (GPU partitions, KEP-4815) go, as the API server keeps them."""

    #: the server drops ``sharedCounters`` (gate ``DRAPartitionableDevices`` off): GPUs are
    #: published whole, without partitions
    OFF = "off"
    #: Kubernetes 1.35+: counter sets in slices of their own, devices in others
    SPLIT = "split"
    #: Kubernetes 1.34: a counter set in the slice of the devices that consume it
    COMBINED = "combined"


class ResourceApiMissing(ControllerError, RuntimeError):
    """The cluster does not serve resource.k8s.io/v1 ResourceSlices."""


async def _served_versions(kube: KubeClient) -> list[str]:
    group = await kube.request("GET", f"/apis/{GROUP}")
    return [str(v.get("version")) for v in group.get("versions") or [] if v.get("version")]


async def require_resource_v1(kube: KubeClient) -> None:
    """Fail with a clear reason unless ``resource.k8s.io/v1`` serves resourceslices (Kubernetes ≥ 1.34)."""
    try:
        resources = await kube.request("GET", f"/apis/{GROUP}/v1")
    except NotFound as err:
        raise ResourceApiMissing(
            f"the API server does not serve {GROUP}/v1; fabric-dra needs Kubernetes 1.34 or newer"
        ) from err
    names = {r.get("name") for r in resources.get("resources") or []}
    if "resourceslices" not in names:
        raise ResourceApiMissing(f"the API server serves {GROUP}/v1 but not resourceslices")


async def device_taint_rules_version(kube: KubeClient) -> str | None:
    """The newest version of resource.k8s.io that serves ``devicetaintrules`` (None: none does).

    The API server registers the resource only where the gate ``DRADeviceTaintRules`` is on
    (``pkg/registry/resource/rest/storage_resource.go``), and in 1.36 only in ``v1alpha3`` and the
    beta ``v1beta2``, both off unless ``--runtime-config`` turns them on; 1.37 serves it in ``v1``."""
    try:
        versions = await _served_versions(kube)
    except ApiError as err:
        log.warning("API discovery failed; assuming device taint rules are not served", error=str(err))
        return None
    for version in sorted(versions, key=_newest_first):
        try:
            resources = await kube.request("GET", f"/apis/{GROUP}/{version}")
        except ApiError:
            continue
        if any(r.get("name") == "devicetaintrules" for r in resources.get("resources") or []):
            return version
    return None


def _newest_first(version: str) -> int:
    return DEVICE_TAINT_RULE_VERSIONS.index(version) if version in DEVICE_TAINT_RULE_VERSIONS else 99


async def device_taints_served(kube: KubeClient) -> bool:
    """True when some served version of resource.k8s.io has ``devicetaintrules``."""
    return await device_taint_rules_version(kube) is not None


@dataclass(frozen=True, slots=True)
class KeptFields:
    """Which gated device fields the API server keeps on a ResourceSlice write."""

    taints: bool
    binds_to_node: bool
    #: how it was found out: "dry-run" or "discovery" (the dry-run failed)
    source: str
    #: ``allowMultipleAllocations`` and capacity request policies (``DRAConsumableCapacity``)
    shares: bool = False


def _probe_slice(driver: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{driver}-feature-probe"},
        "spec": {
            "driver": driver,
            "pool": {"name": "feature-probe", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [
                {
                    "name": "probe",
                    "taints": [{"key": f"{driver}/probe", "effect": "NoSchedule"}],
                    "bindsToNode": True,
                },
                {
                    "name": "probe-shared",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        f"{driver}/memory": {
                            "value": "1Gi",
                            "requestPolicy": {
                                "default": "64Mi",
                                "validRange": {"min": "64Mi", "max": "1Gi", "step": "64Mi"},
                            },
                        }
                    },
                },
            ],
        },
    }


async def probe_slice_fields(kube: KubeClient, driver: str) -> KeptFields:
    """A ``dryRun=All`` create of a slice with a tainted, ``bindsToNode`` device: nothing is
    stored, and the answer is the object as the server would have stored it. Falls back to
    discovery (``devicetaintrules`` served; no ``bindsToNode``) when the dry run fails."""
    try:
        stored = await kube.request(
            "POST", RESOURCE_SLICES.path(), params={"dryRun": "All"}, body=_probe_slice(driver)
        )
    except ApiError as err:
        log.warning(
            "dry-run write of a probe ResourceSlice failed; deciding from API discovery",
            error=str(err).splitlines()[0],
        )
        return KeptFields(await device_taints_served(kube), False, "discovery")
    devices = [d for d in (stored.get("spec") or {}).get("devices") or [] if isinstance(d, dict)]
    device = next((d for d in devices if d.get("name") == "probe"), {})
    shared = next((d for d in devices if d.get("name") == "probe-shared"), {})
    return KeptFields(
        bool(device.get("taints")),
        device.get("bindsToNode") is True,
        "dry-run",
        shares=shared.get("allowMultipleAllocations") is True,
    )


def _counter_probe(driver: str, *, devices: bool) -> dict[str, object]:
    spec: dict[str, object] = {
        "driver": driver,
        "pool": {"name": "feature-probe", "generation": 1, "resourceSliceCount": 1},
        "allNodes": True,
        "sharedCounters": [{"name": "probe", "counters": {"probe": {"value": "1"}}}],
    }
    if devices:
        consumes = [{"counterSet": "probe", "counters": {"probe": {"value": "1"}}}]
        spec["devices"] = [{"name": "probe", "consumesCounters": consumes}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{driver}-feature-probe"},
        "spec": spec,
    }


async def probe_counter_layout(kube: KubeClient, driver: str) -> CounterLayout:
    """Where the API server wants shared counters (GPU partitions), asked with ``dryRun=All`` creates:
    a slice holding a counter set beside a device that consumes it is kept whole by 1.34 with
    ``DRAPartitionableDevices`` (``COMBINED``), kept without its counters where the gate is off
    (``OFF``: ``dropDisabledFields`` runs before validation), and refused by 1.35+ ("only one of
    `sharedCounters` or `devices`"), where a counter slice of its own is then kept (``SPLIT``) or
    loses its counters (``OFF``). Any other failure: ``OFF``, GPUs are published whole."""
    try:
        stored = await kube.request(
            "POST",
            RESOURCE_SLICES.path(),
            params={"dryRun": "All"},
            body=_counter_probe(driver, devices=True),
        )
    except Invalid:
        pass  # 1.35+: counters go in slices of their own
    except ApiError as err:
        log.warning("dry-run write of a probe counter slice failed", error=str(err).splitlines()[0])
        return CounterLayout.OFF
    else:
        kept = bool((stored.get("spec") or {}).get("sharedCounters"))
        return CounterLayout.COMBINED if kept else CounterLayout.OFF
    try:
        stored = await kube.request(
            "POST",
            RESOURCE_SLICES.path(),
            params={"dryRun": "All"},
            body=_counter_probe(driver, devices=False),
        )
    except ApiError as err:
        log.warning("dry-run write of a probe counter slice failed", error=str(err).splitlines()[0])
        return CounterLayout.OFF
    return CounterLayout.SPLIT if (stored.get("spec") or {}).get("sharedCounters") else CounterLayout.OFF
