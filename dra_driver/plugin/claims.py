"""Read the ResourceClaim the kubelet names: ``resource.k8s.io/v1``, else an older served version.

The kubelet sends only namespace, name and UID; the allocation comes from the API server. The
allocation result has the same shape in v1, v1beta2 and v1beta1, so one typed view reads them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin.config import MemoryMode
from plumbing.kube import KubeClient, NotFound
from plumbing.kube.dra import DeviceRequestAllocationResult, ResourceClaim
from plumbing.kube.resources import RESOURCE_API_VERSIONS, RESOURCE_CLAIMS

__all__ = [
    "CONFIG_API_VERSION",
    "RESOURCE_VERSIONS",
    "ClaimNotFound",
    "ClaimReader",
    "ClaimRef",
    "ClaimSource",
    "ConfigError",
    "MemoryConfig",
    "memory_mode",
]

#: the apiVersion of this driver's opaque device configuration
CONFIG_API_VERSION: Literal["fabric-dra.io/v1alpha1"] = "fabric-dra.io/v1alpha1"

#: Tried in this order; the first one the API server serves is remembered.
RESOURCE_VERSIONS = RESOURCE_API_VERSIONS


class ClaimNotFound(KubeletPluginError):
    pass


class ConfigError(KubeletPluginError):
    """The claim's (or its class's) configuration for this driver cannot be used (one line)."""


class MemoryConfig(BaseModel):
    """How a claim wants a CXL memory share (opaque ``parameters`` of this driver's config)::

    config:
    - requests: [memory]
      opaque:
        driver: fabric-dra.io
        parameters: {apiVersion: fabric-dra.io/v1alpha1, kind: MemoryConfig, mode: kmem}
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["fabric-dra.io/v1alpha1"] = CONFIG_API_VERSION
    kind: Literal["MemoryConfig"] = "MemoryConfig"
    mode: MemoryMode

    @classmethod
    def read(cls, parameters: object) -> MemoryConfig:
        if not isinstance(parameters, dict):
            raise ConfigError("its opaque parameters are not an object")
        if parameters.get("kind") != "MemoryConfig":
            raise ConfigError(f"kind {parameters.get('kind')!r} is not one this driver knows (MemoryConfig)")
        values = {("api_version" if k == "apiVersion" else k): v for k, v in parameters.items()}
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]).replace("api_version", "apiVersion")
            raise ConfigError(f"MemoryConfig {where}: {first['msg']}") from None


def _applies(requests: object, request: str) -> bool:
    """Whether a config entry's ``requests`` cover ``request`` (``main`` or ``main/sub``; an
    empty list covers every request: k8s.io/api/resource/v1 ``DeviceClaimConfiguration``)."""
    if not requests:
        return True
    if not isinstance(requests, list):
        return False
    return request in requests or request.partition("/")[0] in requests


def memory_mode(
    claim: ResourceClaim, result: DeviceRequestAllocationResult, driver: str
) -> MemoryMode | None:
    """The memory mode the claim's allocation configures for ``result``: the last of this driver's
    opaque configurations (the class's first, then the claim's, as the allocation lists them) that
    applies to its request; None when none does. Raises :class:`ConfigError`."""
    allocation = claim.status.allocation
    mode = None
    for entry in allocation.devices.config if allocation is not None else []:
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        if not _applies(entry.get("requests"), result.request):
            continue
        mode = MemoryConfig.read(opaque.get("parameters")).mode
    return mode


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    uid: str
    namespace: str
    name: str


class ClaimSource(Protocol):
    async def get(self, namespace: str, name: str) -> ResourceClaim: ...


class ClaimReader:
    def __init__(self, kube: KubeClient, *, on_read: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.kube = kube
        self._versions = list(RESOURCE_VERSIONS)
        #: told every claim as read (the status writer starts its next write from it)
        self._on_read = on_read

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
            claim = ResourceClaim.model_validate(raw)
            if self._on_read is not None:
                self._on_read(raw)
            return claim
        raise ClaimNotFound(
            f"ResourceClaim {namespace}/{name} not found (resource.k8s.io {', '.join(RESOURCE_VERSIONS)})"
        )
