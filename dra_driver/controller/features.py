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
from typing import Literal

from dra_driver.errors import ControllerError
from plumbing.kube import ApiError, KubeClient, NotFound
from plumbing.kube.resources import RESOURCE_SLICES
from plumbing.logs import get_logger

__all__ = [
    "KeptFields",
    "ResourceApiMissing",
    "TaintsMode",
    "device_taints_served",
    "probe_slice_fields",
    "require_resource_v1",
]

log = get_logger(__name__)

TaintsMode = Literal["auto", "on", "off"]
GROUP = "resource.k8s.io"


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


async def device_taints_served(kube: KubeClient) -> bool:
    """True when some served version of resource.k8s.io has ``devicetaintrules``."""
    try:
        versions = await _served_versions(kube)
    except ApiError as err:
        log.warning("API discovery failed; assuming device taints are not available", error=str(err))
        return False
    for version in versions:
        try:
            resources = await kube.request("GET", f"/apis/{GROUP}/{version}")
        except ApiError:
            continue
        if any(r.get("name") == "devicetaintrules" for r in resources.get("resources") or []):
            return True
    return False


@dataclass(frozen=True, slots=True)
class KeptFields:
    """Which gated device fields the API server keeps on a ResourceSlice write."""

    taints: bool
    binds_to_node: bool
    #: how it was found out: "dry-run" or "discovery" (the dry-run failed)
    source: str


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
                }
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
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    device = devices[0] if isinstance(devices[0], dict) else {}
    return KeptFields(bool(device.get("taints")), device.get("bindsToNode") is True, "dry-run")
