"""What a resource request is, read from its method, path and query before any handler runs.

As ``k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`` (``RequestInfoFactory``): the
path ``/api/v1/namespaces/ns/pods/name/status`` or ``/apis/group/version/...`` names the
resource, namespace, name and subresource; the method (and ``?watch=``, or the legacy
``/watch/`` prefix) names the verb. Everything after this step — the test hooks, the verb
handlers, the request counts — speaks in these terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.registry import ResourceType, find_resource
from kube_standin.apiserver.status import StatusError, bad_request

__all__ = ["RequestInfo", "ResourceLookup", "not_found_path", "resolve_request_info"]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request to a resource: the verb, the resource in the version the client spoke, and
    the object it names (``namespace``/``name``/``subresource`` are None where the path has none)."""

    verb: str
    res: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def group(self) -> str:
        return self.res.group

    @property
    def resource(self) -> str:
        """The plural resource name (``resourceslices``), as in the audit log."""
        return self.res.plural

    @property
    def resource_key(self) -> str:
        """``group/resource[/subresource]``; the core group is empty (``pods/status``)."""
        base = f"{self.res.group}/{self.res.plural}" if self.res.group else self.res.plural
        return f"{base}/{self.subresource}" if self.subresource else base

    @property
    def api_version(self) -> str:
        """``group/version`` as objects in this request carry it."""
        return self.res.api_version(self.version)

    def check_object(self, obj: Any) -> Obj:
        """``obj`` as an object of the request's kind and version (missing ``apiVersion``/``kind``
        filled in), in the request's namespace; 400 when it names another."""
        if not isinstance(obj, dict):
            raise bad_request("the request body must be a JSON object")
        expected_av = self.api_version
        api_version = obj.setdefault("apiVersion", expected_av)
        kind = obj.setdefault("kind", self.res.kind)
        if api_version != expected_av:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({expected_av})"
            )
        if kind != self.res.kind:
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({self.res.kind})"
            )
        meta = obj.get("metadata")
        if meta is None:
            obj["metadata"] = meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if self.res.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and self.namespace and body_ns != self.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if self.namespace:
                meta["namespace"] = self.namespace
        return obj

    def check_name(self, body_name: Any) -> None:
        """rest.go ``checkName``: 400 unless the object's name is the one on the URL."""
        if body_name != self.name:
            raise bad_request(
                f"the name of the object ({body_name or ''}) does not match the name on the URL ({self.name})"
            )


def not_found_path() -> StatusError:
    """The answer to a path that names nothing this server serves."""
    return StatusError(404, "NotFound", "the server could not find the requested resource")


def _verb(method: str, name: str | None, watch: bool) -> str:
    if method in ("GET", "HEAD"):
        if name is not None:
            return "get"
        return "watch" if watch else "list"
    if method == "POST":
        return "create" if name is None else "post-subresource"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    return "delete" if name is not None else "deletecollection"


#: how a path's group, version and plural name a resource (built-in, or a custom resource's).
ResourceLookup = Callable[[str, str, str], ResourceType | None]


def resolve_request_info(
    method: str,
    group: str,
    version: str,
    rest: list[str],
    watch_param: str,
    lookup: ResourceLookup = find_resource,
) -> RequestInfo:
    """The request to ``rest`` (the path after ``/api/v1`` or ``/apis/group/version``).

    ``watch_param`` is the ``watch`` query parameter (``""`` when absent). A path that names no
    served resource, or a subresource the resource lacks, is 404.
    """
    legacy_watch = False
    if rest[0] == "watch":
        legacy_watch, rest = True, rest[1:]
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        candidate = lookup(group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise not_found_path()
    res = lookup(group, version, rest[0])
    if res is None:
        raise not_found_path()
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if subresource is not None and not (
        (subresource == "status" and res.status_subresource)
        or (subresource == "scale" and res.scale_subresource)
    ):
        raise not_found_path()
    if res.namespaced and namespace is None and name is not None:
        raise not_found_path()
    verb = _verb(method, name, legacy_watch or watch_param in ("true", "1"))
    return RequestInfo(verb, res, version, namespace, name, subresource)
