"""Discovery documents (``/api``, ``/apis``, ``/apis/<group>/<version>``) and ``/version``,
derived from the resource table so they always agree with what is served. The groups and resources
of established CRDs (``custom``) follow the built-in ones, as the real server's aggregated
discovery lists them after its own."""

from __future__ import annotations

import base64
import hashlib
import platform
from collections.abc import Sequence
from typing import Any

from kube_standin.apiserver.features import ALL_SERVED, ServedVersions
from kube_standin.apiserver.registry import GROUPS, ApiGroup, ResourceType, resources_in

__all__ = ["api_group", "api_group_list", "api_resource_list", "api_versions", "version_info"]


def _group_version(group: str, version: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{version}" if group else version, "version": version}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_group(
    group: str, served: ServedVersions = ALL_SERVED, custom: Sequence[ApiGroup] = ()
) -> dict[str, Any] | None:
    for api in (*GROUPS, *custom):
        versions = served.filter(api.name, api.versions)
        if api.name == group and group and versions:
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": group,
                "versions": [_group_version(group, v) for v in versions],
                "preferredVersion": _group_version(group, versions[0]),
            }
    return None


def api_group_list(served: ServedVersions = ALL_SERVED, custom: Sequence[ApiGroup] = ()) -> dict[str, Any]:
    groups = [
        {
            "name": api.name,
            "versions": [_group_version(api.name, v) for v in versions],
            "preferredVersion": _group_version(api.name, versions[0]),
        }
        for api in (*GROUPS, *custom)
        if api.name and (versions := served.filter(api.name, api.versions))
    ]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _storage_version_hash(res: ResourceType) -> str:
    # The real server hashes group/version/kind of the storage version; any stable value works.
    digest = hashlib.sha256(f"{res.group}/{res.storage_version}/{res.kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def api_resource_list(
    group: str, version: str, versions: ServedVersions = ALL_SERVED, custom: Sequence[ResourceType] = ()
) -> dict[str, Any] | None:
    served = (
        [*resources_in(group, version), *(r for r in custom if r.group == group and version in r.versions)]
        if versions.allows(group, version)
        else []
    )
    if not served:
        return None
    resources: list[dict[str, Any]] = []
    for res in served:
        entry: dict[str, Any] = {
            "name": res.plural,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": sorted(res.verbs),
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        if res.categories:
            entry["categories"] = list(res.categories)
        if "list" in res.verbs:
            entry["storageVersionHash"] = _storage_version_hash(res)
        resources.append(entry)
        if res.status_subresource:
            resources.append(
                {
                    "name": f"{res.plural}/status",
                    "singularName": "",
                    "namespaced": res.namespaced,
                    "kind": res.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if res.scale_subresource:
            resources.append(
                {
                    "name": f"{res.plural}/scale",
                    "singularName": "",
                    "namespaced": res.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def version_info(server_version: str) -> dict[str, Any]:
    major, minor, *_ = [*server_version.lstrip("v").split("."), "0", "0"][:3]
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    return {
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": major,
        "minCompatibilityMinor": str(max(int(minor) - 1, 0)) if minor.isdigit() else minor,
        "gitVersion": f"v{server_version.lstrip('v')}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": f"linux/{arch}",
    }
