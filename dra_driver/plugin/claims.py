"""Read the ResourceClaim the kubelet names: ``resource.k8s.io/v1``, else an older served version.

The kubelet sends only namespace, name and UID; the allocation comes from the API server. The
allocation result has the same shape in v1, v1beta2 and v1beta1, so one typed view reads them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dra_driver.errors import KubeletPluginError
from plumbing.kube import KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.resources import RESOURCE_API_VERSIONS, RESOURCE_CLAIMS

__all__ = ["RESOURCE_VERSIONS", "ClaimNotFound", "ClaimReader", "ClaimRef", "ClaimSource"]

#: Tried in this order; the first one the API server serves is remembered.
RESOURCE_VERSIONS = RESOURCE_API_VERSIONS


class ClaimNotFound(KubeletPluginError):
    pass


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    uid: str
    namespace: str
    name: str


class ClaimSource(Protocol):
    async def get(self, namespace: str, name: str) -> ResourceClaim: ...


class ClaimReader:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._versions = list(RESOURCE_VERSIONS)

    @property
    def version(self) -> str:
        return self._versions[0]

    async def get(self, namespace: str, name: str) -> ResourceClaim:
        for version in list(self._versions):
            try:
                raw = await self.kube.get(RESOURCE_CLAIMS.with_version(version), name, namespace)
            except NotFound as err:
                details = err.body.get("details") or {}
                if details.get("name") == name:
                    raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from err
                # No details naming the claim: this API version is not served here; try an older one.
                continue
            if self._versions[0] != version:
                self._versions.remove(version)
                self._versions.insert(0, version)
            return ResourceClaim.model_validate(raw)
        raise ClaimNotFound(
            f"ResourceClaim {namespace}/{name} not found (resource.k8s.io {', '.join(RESOURCE_VERSIONS)})"
        )
