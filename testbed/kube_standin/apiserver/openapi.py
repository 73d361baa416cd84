"""The OpenAPI v3 discovery kubectl reads before writing: ``/openapi/v3`` lists one document per
group version; each document lists the resource paths and their operations.

kubectl (cli-runtime's QueryParamVerifierV3) checks that the PATCH operation of a kind
accepts the ``fieldValidation`` parameter before it leaves validation to the server; this
server always validates strictly, so it says so. Schemas are left out (``components`` is
empty): kubectl's create/apply/get/delete do not need them here, ``kubectl explain`` does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kube_standin.apiserver.features import ALL_SERVED, NEWEST_DEFAULTS, FeatureGates, ServedVersions
from kube_standin.apiserver.registry import GROUPS, ResourceType, resources_in

__all__ = ["group_version_document", "openapi_index"]

_QUERY = ("dryRun", "fieldManager", "fieldValidation", "pretty")


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _operation(res: ResourceType, version: str, action: str, kind: str | None = None) -> dict[str, Any]:
    gvk = {"group": res.group, "version": version, "kind": kind or res.kind}
    op: dict[str, Any] = {
        "operationId": f"{action}{res.kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
        "parameters": [{"name": name, "in": "query", "schema": {"type": "string"}} for name in _QUERY],
        "responses": {"200": {"description": "OK"}},
    }
    return op


def group_version_document(
    group: str, version: str, server_version: str, gates: FeatureGates = NEWEST_DEFAULTS
) -> dict[str, Any] | None:
    served = [r for r in resources_in(group, version) if r.served_in(version, gates)]
    if not served:
        return None
    prefix = "/" + _gv_path(group, version)
    paths: dict[str, Any] = {}
    for res in served:
        scope = (
            f"{prefix}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{prefix}/{res.plural}"
        )
        collection: dict[str, Any] = {}
        if "create" in res.verbs:
            collection["post"] = _operation(res, version, "post")
        if "list" in res.verbs:
            collection["get"] = _operation(res, version, "list")
        if collection:
            paths[scope] = collection
        if "get" in res.verbs:
            paths[f"{scope}/{{name}}"] = {
                "get": _operation(res, version, "get"),
                "put": _operation(res, version, "put"),
                "patch": _operation(res, version, "patch"),
                "delete": _operation(res, version, "delete"),
            }
        if res.status_subresource:
            paths[f"{scope}/{{name}}/status"] = {
                "get": _operation(res, version, "get"),
                "put": _operation(res, version, "put"),
                "patch": _operation(res, version, "patch"),
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": f"v{server_version.lstrip('v')}"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def openapi_index(
    server_version: str, served: ServedVersions = ALL_SERVED, gates: FeatureGates = NEWEST_DEFAULTS
) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for api in GROUPS:
        for version in served.filter(api.name, api.versions):
            document = group_version_document(api.name, version, server_version, gates)
            digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()
            path = _gv_path(api.name, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
