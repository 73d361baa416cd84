"""The resources the API test server serves, declared once: discovery, routing, field selectors
and per-kind write semantics (status subresource, generation) are all derived from this table.

Behaviour follows each kind's registry strategy in ``kubernetes/pkg/registry`` (v1.34):
which kinds have a status subresource, which set ``metadata.generation``, what a create
resets, and which field selectors the real server accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kube_standin.apiserver.customresources.served import CustomKind

__all__ = [
    "GROUPS",
    "RESOURCES",
    "ApiGroup",
    "FieldGetter",
    "ResourceType",
    "find_resource",
    "resources_in",
]

FieldGetter = Callable[[Mapping[str, Any]], Any]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _dig(*path: str) -> FieldGetter:
    def get(obj: Mapping[str, Any]) -> Any:
        node: Any = obj
        for key in path:
            if not isinstance(node, Mapping):
                return None
            node = node.get(key)
        return node

    return get


@dataclass(frozen=True)
class ResourceType:
    """One REST resource (``pods``) in one API group, served in one or more versions."""

    group: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    versions: tuple[str, ...]  # served, preferred first; objects are stored in versions[0]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _ALL_VERBS
    #: has a ``/status`` subresource: the main resource ignores status changes and vice versa.
    status_subresource: bool = False
    #: has a ``/scale`` subresource (autoscaling/v1 Scale over ``spec.replicas``).
    scale_subresource: bool = False
    #: ``metadata.generation`` is 1 on create and bumps when anything but metadata/status changes.
    tracks_generation: bool = False
    #: what a create keeps of a client-sent ``status`` (None: drop it).
    create_status: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None
    #: field selectors beyond metadata.name / metadata.namespace.
    field_selectors: Mapping[str, FieldGetter] = field(default_factory=dict)
    #: where objects are kept; events.k8s.io/v1 Events share the core Events' storage.
    storage_group: str | None = None
    #: the name must be a DNS label (namespaces) rather than a DNS subdomain.
    name_is_label: bool = False
    #: any path segment is a valid name (core Events).
    name_is_path_segment: bool = False
    #: a PUT of a missing object creates it (the strategy's AllowCreateOnUpdate).
    create_on_update: bool = False
    #: a custom resource: its CRD's schemas (:mod:`kube_standin.apiserver.customresources`), which
    #: decode and validate it instead of the built-in schemas and rules.
    custom: CustomKind | None = field(default=None, compare=False)

    @property
    def storage_key(self) -> str:
        group = self.group if self.storage_group is None else self.storage_group
        return f"{group}/{self.plural}" if group else self.plural

    @property
    def group_resource(self) -> str:
        """``plural.group`` as Kubernetes error messages spell it (``resourceclaims.resource.k8s.io``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    @property
    def storage_version(self) -> str:
        return self.versions[0]

    def selectable_fields(self) -> dict[str, FieldGetter]:
        fields: dict[str, FieldGetter] = {"metadata.name": _dig("metadata", "name")}
        if self.namespaced:
            fields["metadata.namespace"] = _dig("metadata", "namespace")
        fields.update(self.field_selectors)
        return fields


@dataclass(frozen=True)
class ApiGroup:
    name: str  # "" for the core group
    versions: tuple[str, ...]  # preferred first


def _pod_create_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    # pod strategy PrepareForCreate: status starts as Pending, whatever the client sent.
    return {"phase": "Pending"}


def _namespace_create_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"phase": "Active"}


def _keep_status(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    # node strategy: "Nodes allow *all* fields, including status, to be set on create."
    status = obj.get("status")
    return dict(status) if isinstance(status, Mapping) else None


_EVENT_FIELDS: dict[str, FieldGetter] = {
    "involvedObject.kind": _dig("involvedObject", "kind"),
    "involvedObject.namespace": _dig("involvedObject", "namespace"),
    "involvedObject.name": _dig("involvedObject", "name"),
    "involvedObject.uid": _dig("involvedObject", "uid"),
    "involvedObject.apiVersion": _dig("involvedObject", "apiVersion"),
    "involvedObject.resourceVersion": _dig("involvedObject", "resourceVersion"),
    "involvedObject.fieldPath": _dig("involvedObject", "fieldPath"),
    "reason": _dig("reason"),
    "reportingComponent": _dig("reportingComponent"),
    "source": _dig("source", "component"),
    "type": _dig("type"),
}

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "namespaces",
        "namespace",
        "Namespace",
        False,
        ("v1",),
        short_names=("ns",),
        status_subresource=True,
        create_status=_namespace_create_status,
        field_selectors={"status.phase": _dig("status", "phase")},
        name_is_label=True,
    ),
    ResourceType(
        "",
        "nodes",
        "node",
        "Node",
        False,
        ("v1",),
        short_names=("no",),
        status_subresource=True,
        create_status=_keep_status,
        field_selectors={"spec.unschedulable": lambda o: bool(_dig("spec", "unschedulable")(o))},
    ),
    ResourceType(
        "",
        "pods",
        "pod",
        "Pod",
        True,
        ("v1",),
        short_names=("po",),
        categories=("all",),
        status_subresource=True,
        tracks_generation=True,
        create_status=_pod_create_status,
        field_selectors={
            "spec.nodeName": _dig("spec", "nodeName"),
            "spec.restartPolicy": _dig("spec", "restartPolicy"),
            "spec.schedulerName": _dig("spec", "schedulerName"),
            "spec.serviceAccountName": _dig("spec", "serviceAccountName"),
            "spec.hostNetwork": lambda o: bool(_dig("spec", "hostNetwork")(o)),
            "status.phase": _dig("status", "phase"),
            "status.podIP": _dig("status", "podIP"),
            "status.nominatedNodeName": _dig("status", "nominatedNodeName"),
        },
    ),
    ResourceType("", "configmaps", "configmap", "ConfigMap", True, ("v1",), short_names=("cm",)),
    ResourceType(
        "",
        "secrets",
        "secret",
        "Secret",
        True,
        ("v1",),
        field_selectors={"type": _dig("type")},
    ),
    ResourceType(
        "",
        "events",
        "event",
        "Event",
        True,
        ("v1",),
        short_names=("ev",),
        field_selectors=_EVENT_FIELDS,
        name_is_path_segment=True,
        create_on_update=True,
    ),
    ResourceType(
        "events.k8s.io",
        "events",
        "event",
        "Event",
        True,
        ("v1",),
        short_names=("ev",),
        # The real server keeps both views in one storage; so does this one (see convert.py).
        storage_group="",
        field_selectors=_EVENT_FIELDS,
        name_is_path_segment=True,
        create_on_update=True,
    ),
    ResourceType("coordination.k8s.io", "leases", "lease", "Lease", True, ("v1",), create_on_update=True),
    ResourceType(
        "apps",
        "deployments",
        "deployment",
        "Deployment",
        True,
        ("v1",),
        short_names=("deploy",),
        categories=("all",),
        status_subresource=True,
        scale_subresource=True,
        tracks_generation=True,
    ),
    ResourceType(
        "authentication.k8s.io",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
        False,
        ("v1",),
        verbs=("create",),
    ),
    ResourceType(
        "resource.k8s.io",
        "resourceclaims",
        "resourceclaim",
        "ResourceClaim",
        True,
        ("v1", "v1beta2", "v1beta1"),
        status_subresource=True,
        tracks_generation=True,
    ),
    ResourceType(
        "resource.k8s.io",
        "resourceclaimtemplates",
        "resourceclaimtemplate",
        "ResourceClaimTemplate",
        True,
        ("v1", "v1beta2", "v1beta1"),
        tracks_generation=True,
    ),
    ResourceType(
        "resource.k8s.io",
        "resourceslices",
        "resourceslice",
        "ResourceSlice",
        False,
        ("v1", "v1beta2", "v1beta1"),
        tracks_generation=True,
        field_selectors={
            "spec.driver": _dig("spec", "driver"),
            "spec.nodeName": _dig("spec", "nodeName"),
            # Not selectable on a real server (only driver and nodeName are); served here
            # because a pool spans several slices and tests look them up by pool.
            "spec.pool.name": _dig("spec", "pool", "name"),
        },
    ),
    # ValidatingAdmissionPolicy and its binding (GA in 1.30): the server evaluates them on every
    # write (:mod:`kube_standin.apiserver.policies`); the policy's status (type checking) is the
    # real server's controller's and is left empty.
    ResourceType(
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        False,
        ("v1",),
        categories=("api-extensions",),
        status_subresource=True,
        tracks_generation=True,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        "ValidatingAdmissionPolicyBinding",
        False,
        ("v1",),
        categories=("api-extensions",),
        tracks_generation=True,
    ),
    # CustomResourceDefinitions (apiextensions-apiserver): validated and given their status by
    # kube_standin.apiserver.customresources, which serves the resources they define.
    ResourceType(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        False,
        ("v1",),
        short_names=("crd", "crds"),
        categories=("api-extensions",),
        status_subresource=True,
        tracks_generation=True,
    ),
    ResourceType(
        "resource.k8s.io",
        "deviceclasses",
        "deviceclass",
        "DeviceClass",
        False,
        ("v1", "v1beta2", "v1beta1"),
        tracks_generation=True,
    ),
)

GROUPS: tuple[ApiGroup, ...] = (
    ApiGroup("", ("v1",)),
    ApiGroup("admissionregistration.k8s.io", ("v1",)),
    ApiGroup("apiextensions.k8s.io", ("v1",)),
    ApiGroup("apps", ("v1",)),
    ApiGroup("events.k8s.io", ("v1",)),
    ApiGroup("authentication.k8s.io", ("v1",)),
    ApiGroup("coordination.k8s.io", ("v1",)),
    ApiGroup("resource.k8s.io", ("v1", "v1beta2", "v1beta1")),
)

_BY_PATH: dict[tuple[str, str, str], ResourceType] = {
    (res.group, version, res.plural): res for res in RESOURCES for version in res.versions
}


def find_resource(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def resources_in(group: str, version: str) -> list[ResourceType]:
    return [res for res in RESOURCES if res.group == group and version in res.versions]
