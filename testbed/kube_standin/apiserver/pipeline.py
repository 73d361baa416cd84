"""The request pipeline of the API test server: every request passes the same stages, in the
order of the real server's handler chain (``DefaultBuildHandlerChain`` in
``k8s.io/apiserver/pkg/server/config.go``, the filters of
``k8s.io/apiserver/pkg/endpoints/filters``), before a verb handler sees it:

1. errors become ``meta.k8s.io/v1`` Status responses (``WithPanicRecovery`` and
   ``responsewriters.ErrorNegotiated``): a :class:`StatusError` as it is, anything else 500;
2. paths that are no resource: health, ``/version``, OpenAPI, discovery, the test hooks
   (``/testing/v1``, unauthenticated);
3. authentication: a known bearer token (``WithAuthentication``); the user is kept on the request
   (``request.state.user``) for admission. There is no authorization step: every authenticated
   user may do what the admission plugins (:mod:`kube_standin.apiserver.admission`) let it;
4. request info: path, method and query resolved to a :class:`RequestInfo` (``WithRequestInfo``),
   404 for what is not served, 405 for a verb the resource lacks;
5. the test hooks: the request is counted, then an armed fault may delay or answer it (where the
   real server would apply flow control and write the audit event);
6. the verb handler (:mod:`kube_standin.apiserver.handlers`), which negotiates the body's
   content type and reads it within the size limit (:mod:`kube_standin.apiserver.negotiation`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver import discovery, openapi
from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.handlers.create import create_resource
from kube_standin.apiserver.handlers.delete import delete_collection, delete_resource
from kube_standin.apiserver.handlers.get import get_resource, list_resource
from kube_standin.apiserver.handlers.patch import patch_resource
from kube_standin.apiserver.handlers.scope import RequestScope
from kube_standin.apiserver.handlers.update import update_resource
from kube_standin.apiserver.handlers.watch import watch_resource
from kube_standin.apiserver.requestinfo import RequestInfo, not_found_path, resolve_request_info
from kube_standin.apiserver.responses import json_response, status_response
from kube_standin.apiserver.status import (
    StatusError,
    internal_error,
    method_not_supported,
    status_object,
    unauthorized,
)
from kube_standin.apiserver.testhooks import TESTING_PREFIX, TestHookEndpoints
from plumbing.logs import get_logger

__all__ = ["HANDLERS", "Handler", "RequestPipeline"]

log = get_logger(__name__)

Handler = Callable[[RequestScope, Request, RequestInfo], Awaitable[Response]]

#: the handler of each verb (``post-subresource`` has none: no served subresource takes POST).
HANDLERS: dict[str, Handler] = {
    "get": get_resource,
    "list": list_resource,
    "watch": watch_resource,
    "create": create_resource,
    "update": update_resource,
    "patch": patch_resource,
    "delete": delete_resource,
    "deletecollection": delete_collection,
}


class RequestPipeline:
    """The stages above, as one ASGI endpoint (:meth:`handle`) for every path."""

    def __init__(
        self, scope: RequestScope, hooks: TestHookEndpoints, *, allow_anonymous: bool, server_version: str
    ) -> None:
        self.scope = scope
        self.hooks = hooks
        self.allow_anonymous = allow_anonymous
        self.server_version = server_version

    async def handle(self, request: Request) -> Response:
        """Stage 1: whatever goes wrong further down is answered as a Status."""
        path = "/" + request.path_params.get("path", "")
        try:
            return await self._route(request, path)
        except StatusError as err:
            if err.code >= 500:
                log.error(
                    "request failed", method=request.method, path=path, code=err.code, error=err.message
                )
            return status_response(err)
        except Exception as err:
            log.exception("request failed unexpectedly", method=request.method, path=path)
            return status_response(internal_error(f"{type(err).__name__}: {err}"))

    async def _route(self, request: Request, path: str) -> Response:
        """Stage 2, with authentication (stage 3) where the real server asks for it."""
        if path in ("/healthz", "/livez", "/readyz"):
            return Response("ok", media_type="text/plain")
        if path == "/openapi/v2":
            # Not served, as on servers without the v2 document; kubectl falls back to v3 or to its
            # compiled-in types.
            raise not_found_path()
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            self._authenticate(request)
            return self._openapi(path)
        if path == "/version":
            return json_response(discovery.version_info(self.server_version))
        if path.startswith(TESTING_PREFIX + "/"):
            return await self.hooks.handle(request, path[len(TESTING_PREFIX) + 1 :])
        request.state.user = self._authenticate(request)
        segments = [s for s in path.split("/") if s]
        if not segments or segments[0] not in ("api", "apis"):
            raise not_found_path()
        if segments[0] == "api":
            if len(segments) == 1:
                return json_response(discovery.api_versions(request.url.netloc))
            group, version, rest = "", segments[1], segments[2:]
        else:
            if len(segments) == 1:
                return json_response(discovery.api_group_list(self.scope.served, self.scope.custom.groups()))
            if len(segments) == 2:
                doc = discovery.api_group(segments[1], self.scope.served, self.scope.custom.groups())
                if doc is None:
                    raise not_found_path()
                return json_response(doc)
            group, version, rest = segments[1], segments[2], segments[3:]
        if not self.scope.served.allows(group, version):
            # A version --runtime-config left off is not there at all, as on a real server.
            raise not_found_path()
        if not rest:
            listing = discovery.api_resource_list(
                group, version, self.scope.served, self.scope.custom.resources()
            )
            if listing is None:
                raise not_found_path()
            return json_response(listing)
        info = resolve_request_info(
            request.method,
            group,
            version,
            rest,
            request.query_params.get("watch", ""),
            self.scope.custom.find,
        )
        return await self._resource_request(request, info)

    def _authenticate(self, request: Request) -> TokenUser | None:
        """Stage 3: the user of the request's bearer token; 401 unless it is a known one (or there is
        none, where anonymous requests are allowed: None, as without a tokens file)."""
        auth = self.scope.auth
        if not auth.required:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header and self.allow_anonymous:
            return None
        user = auth.lookup(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if user is None:
            raise unauthorized()
        return user

    def _openapi(self, path: str) -> Response:
        if path == "/openapi/v3":
            return json_response(openapi.openapi_index(self.server_version, self.scope.served))
        segments = path.removeprefix("/openapi/v3/").split("/")
        group, version = ("", segments[1]) if segments[0] == "api" else (segments[1], segments[-1])
        if not self.scope.served.allows(group, version):
            raise not_found_path()
        if (segments[0] == "api" and len(segments) == 2) or (segments[0] == "apis" and len(segments) == 3):
            document = openapi.group_version_document(group, version, self.server_version)
            if document is not None:
                return json_response(document)
        raise not_found_path()

    async def _resource_request(self, request: Request, info: RequestInfo) -> Response:
        """Stages 4 (the verb is served), 5 and 6."""
        res, verb = info.res, info.verb
        if (
            verb not in res.verbs
            or verb == "post-subresource"
            or (info.name is None and verb in ("update", "patch"))
        ):
            raise method_not_supported(res, verb)
        if verb in ("create", "deletecollection") and res.namespaced and info.namespace is None:
            raise method_not_supported(res, verb)
        injected = await self._test_hooks(info, dry_run="dryRun" in request.query_params)
        if injected is not None:
            return injected
        return await HANDLERS[verb](self.scope, request, info)

    async def _test_hooks(self, info: RequestInfo, *, dry_run: bool) -> Response | None:
        """Stage 5: count the request; an armed fault delays it and may answer it instead."""
        self.hooks.counter.count(info, dry_run=dry_run)
        rule = self.hooks.faults.take(info)
        if rule is None:
            return None
        if rule.delay_seconds:
            await asyncio.sleep(rule.delay_seconds)
        if rule.code < 400:
            return None
        log.info("injected failure", verb=info.verb, resource=info.resource_key, code=rule.code)
        headers = (
            {"Retry-After": str(rule.retry_after_seconds)} if rule.retry_after_seconds is not None else None
        )
        message = rule.message or f"injected failure for {info.verb} {info.resource_key}"
        return json_response(status_object(rule.code, rule.default_reason, message), rule.code, headers)
