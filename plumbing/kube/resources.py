"""The Kubernetes resources fabric-dra reads and writes, named once."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONFIGMAPS",
    "DEPLOYMENTS",
    "DEVICE_BUDGETS",
    "DEVICE_CLASSES",
    "DEVICE_TAINT_RULES",
    "DEVICE_TAINT_RULE_VERSIONS",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "RESOURCE_API_VERSIONS",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "SECRETS",
    "TOKEN_REVIEWS",
    "Resource",
    "resource_api",
]


@dataclass(frozen=True, slots=True)
class Resource:
    """One REST resource of the API server: where it lives and what it is called."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def with_version(self, version: str) -> Resource:
        return Resource(self.group, version, self.plural, self.kind, self.namespaced)

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
NODES = Resource("", "v1", "nodes", "Node", False)
PODS = Resource("", "v1", "pods", "Pod", True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
SECRETS = Resource("", "v1", "secrets", "Secret", True)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)

# resource.k8s.io is served as v1 from Kubernetes 1.34; older clusters serve v1beta1/v1beta2.
#: the versions of resource.k8s.io to try, newest first (the first one served is kept)
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
# DeviceTaintRule (KEP-5055, gate DRADeviceTaintRules): v1alpha3 since 1.33, v1beta2 from 1.36 (a beta
# API, off unless --runtime-config turns it on), v1 from 1.37 (k8s.io/api/resource/*/register.go).
#: the versions of resource.k8s.io that may serve devicetaintrules, newest first
DEVICE_TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
DEVICE_TAINT_RULES = Resource("resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", False)
#: fabric-dra's own custom resource: a cap on what an agent tree holds (deploy/base/devicebudget-crd.yaml)
DEVICE_BUDGETS = Resource("fabric-dra.io", "v1alpha1", "devicebudgets", "DeviceBudget", True)

_ALL = [
    NAMESPACES,
    NODES,
    PODS,
    CONFIGMAPS,
    SECRETS,
    EVENTS,
    LEASES,
    TOKEN_REVIEWS,
    DEPLOYMENTS,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_SLICES,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    DEVICE_BUDGETS,
]


def resource_api(api_version: str, kind: str) -> Resource:
    """The known resource for an object's ``apiVersion`` and ``kind``."""
    group, _, version = api_version.rpartition("/")
    for res in _ALL:
        if res.group == group and res.kind == kind:
            return res.with_version(version)
    raise KeyError(f"unknown resource {api_version} {kind}")
