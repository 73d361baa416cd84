"""What the cluster serves, read from API discovery.

Device taints (``DRADeviceTaints``) cannot be asked for directly: a cluster without the feature
gate silently drops ``devices[].taints`` on write. Discovery tells whether the cluster serves
``devicetaintrules`` (served only with the gate on); :mod:`.publisher` also checks what the
API server stored and falls back to withholding unhealthy devices if taints were dropped.
"""

from __future__ import annotations

from typing import Literal

from plumbing.kube import ApiError, KubeClient, NotFound
from plumbing.logs import get_logger

__all__ = ["ResourceApiMissing", "TaintsMode", "device_taints_served", "require_resource_v1"]

log = get_logger(__name__)

TaintsMode = Literal["auto", "on", "off"]
GROUP = "resource.k8s.io"


class ResourceApiMissing(RuntimeError):
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
