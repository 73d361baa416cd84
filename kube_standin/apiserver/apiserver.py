"""The Kubernetes API test server: the REST paths, verbs and semantics of a real API server
for the resources fabric-dra uses, over real HTTP.

Request flow, as in ``k8s.io/apiserver``: authenticate (bearer token) -> resolve the path to
a resource -> (test hooks: count, inject faults) -> decode -> convert to the storage version ->
default -> validate (official JSON schemas of every configured Kubernetes version, then the
server's own rules) -> store -> convert back to the requested version.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from kube_standin.apiserver import discovery, openapi, rules
from kube_standin.apiserver.auth import TokenAuthenticator
from kube_standin.apiserver.convert import apply_defaults, from_storage, to_storage
from kube_standin.apiserver.jsonobj import clone
from kube_standin.apiserver.patch import (
    PatchError,
    SchemaNode,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from kube_standin.apiserver.registry import RESOURCES, ResourceType, find_resource
from kube_standin.apiserver.responses import json_response, status_response
from kube_standin.apiserver.schemas import DEFAULT_VERSIONS, SchemaCatalog
from kube_standin.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from kube_standin.apiserver.status import (
    Cause,
    StatusError,
    bad_request,
    internal_error,
    invalid,
    method_not_supported,
    not_found,
    status_object,
    unauthorized,
    unsupported_media_type,
)
from kube_standin.apiserver.store import Change, Store, StoreState
from kube_standin.apiserver.tables import table, wants_table
from kube_standin.apiserver.testhooks import (
    TESTING_PREFIX,
    FaultInjector,
    RequestCounter,
    RequestInfo,
    TestHookEndpoints,
)
from kube_standin.apiserver.watch import WatchOptions, open_watch
from plumbing.fsutil import atomic_write
from plumbing.logs import get_logger

__all__ = ["ApiServer", "ApiServerConfig", "StateFileError"]

log = get_logger(__name__)

Obj = dict[str, Any]
_JSON_TYPES = ("application/json", "")
_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply-cbor",
}
#: the real server's request body limit (k8s.io/apiserver DefaultMaxRequestSizeBytes, 3 MiB).
MAX_REQUEST_BYTES = 3 * 1024 * 1024


class StateFileError(RuntimeError):
    """The --state-file exists but is not a state this server wrote."""


@dataclass
class ApiServerConfig:
    validate_versions: tuple[str, ...] = DEFAULT_VERSIONS
    #: reported by /version; defaults to the newest validated version.
    server_version: str | None = None
    tokens_file: Path | None = None
    allow_anonymous: bool = False
    state_file: Path | None = None
    history: int = 20_000
    #: how often an idle watch with allowWatchBookmarks gets a BOOKMARK (the real server: ~1 min).
    bookmark_interval: float = 60.0
    #: a watch without timeoutSeconds ends after a random time in [min, 2*min], as the real server.
    min_request_timeout: float = 1800.0


@dataclass
class _Target:
    res: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None
    legacy_watch: bool = False

    def info(self, verb: str) -> RequestInfo:
        return RequestInfo(
            verb,
            self.res.group,
            self.res.plural,
            self.subresource or "",
            self.namespace or "",
            self.name or "",
        )


def _name_mismatch(body_name: Any, url_name: str | None) -> StatusError:
    return bad_request(
        f"the name of the object ({body_name or ''}) does not match the name on the URL ({url_name})"
    )


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [key[0], key[1]]}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        start = data["start"]
        return int(data["rv"]), (str(start[0]), str(start[1]))
    except (binascii.Error, ValueError, KeyError, TypeError, IndexError) as err:
        raise bad_request(f"continue key is not valid: {err}") from err


class ApiServer:
    """An ASGI application (``.app``) serving the Kubernetes REST API from an in-memory store."""

    def __init__(self, config: ApiServerConfig | None = None) -> None:
        self.config = config or ApiServerConfig()
        self.store = Store(history=self.config.history)
        self.catalog = SchemaCatalog(self.config.validate_versions)
        self.auth = TokenAuthenticator(self.config.tokens_file)
        self.faults = FaultInjector()
        self.counter = RequestCounter()
        self.hooks = TestHookEndpoints(self.faults, self.counter, self.store)
        newest = max(self.config.validate_versions or ("1.34",), key=lambda v: tuple(map(int, v.split("."))))
        self.server_version = self.config.server_version or f"{newest}.0"
        self._dirty = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self.store.on_commit = self._on_commit
        if self.config.state_file is not None and self.config.state_file.exists():
            try:
                state = StoreState.model_validate_json(self.config.state_file.read_bytes())
            except (OSError, ValueError) as err:
                raise StateFileError(
                    f"state file {self.config.state_file} cannot be loaded ({str(err).splitlines()[0]}); "
                    "move it away to start with an empty server"
                ) from err
            self.store.load(state)
            log.info("state loaded", path=str(self.config.state_file), resourceVersion=self.store.rv)
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
        self.app = Starlette(
            routes=[Route("/{path:path}", self._endpoint, methods=methods)], lifespan=self._lifespan
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def warm(self) -> None:
        """Compile every served kind's validators now, so the first write is as fast as the rest."""
        self.catalog.warm(
            (res.api_version(version), res.kind) for res in RESOURCES for version in res.versions
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.config.state_file is not None:
            self._flusher = asyncio.create_task(self._flush_loop())
        try:
            yield
        finally:
            self.store.close_watchers()
            if self._flusher is not None:
                self._flusher.cancel()
            self.flush_state()

    def _on_commit(self, change: Change) -> None:
        self.counter.changes[change.storage_key] += 1
        self._dirty.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.2)  # batch bursts of writes into one file write
            self._dirty.clear()
            self.flush_state()

    def flush_state(self) -> None:
        if self.config.state_file is None:
            return
        payload = self.store.dump().model_dump_json()
        atomic_write(self.config.state_file, payload)

    # -- entry point ---------------------------------------------------------------------------

    async def _endpoint(self, request: Request) -> Response:
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

    def _authenticate(self, request: Request) -> None:
        if not self.auth.required:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header and self.config.allow_anonymous:
            return
        if scheme.lower() != "bearer" or not token.strip() or self.auth.lookup(token.strip()) is None:
            raise unauthorized()

    async def _route(self, request: Request, path: str) -> Response:
        if path in ("/healthz", "/livez", "/readyz"):
            return Response("ok", media_type="text/plain")
        if path == "/openapi/v2":
            # Not served, as on servers without the v2 document; kubectl falls back to v3 or to its
            # compiled-in types.
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            self._authenticate(request)
            return self._openapi(path)
        if path == "/version":
            return json_response(discovery.version_info(self.server_version))
        if path.startswith(TESTING_PREFIX + "/"):
            return await self.hooks.handle(request, path[len(TESTING_PREFIX) + 1 :])
        self._authenticate(request)
        segments = [s for s in path.split("/") if s]
        if not segments or segments[0] not in ("api", "apis"):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if segments[0] == "api":
            if len(segments) == 1:
                return json_response(discovery.api_versions(request.url.netloc))
            group, version, rest = "", segments[1], segments[2:]
        else:
            if len(segments) == 1:
                return json_response(discovery.api_group_list())
            if len(segments) == 2:
                doc = discovery.api_group(segments[1])
                if doc is None:
                    raise StatusError(404, "NotFound", "the server could not find the requested resource")
                return json_response(doc)
            group, version, rest = segments[1], segments[2], segments[3:]
        if not rest:
            listing = discovery.api_resource_list(group, version)
            if listing is None:
                raise StatusError(404, "NotFound", "the server could not find the requested resource")
            return json_response(listing)
        target = self._resolve(group, version, rest)
        return await self._resource_request(request, target)

    def _openapi(self, path: str) -> Response:
        if path == "/openapi/v3":
            return json_response(openapi.openapi_index(self.server_version))
        segments = path.removeprefix("/openapi/v3/").split("/")
        group, version = ("", segments[1]) if segments[0] == "api" else (segments[1], segments[-1])
        if (segments[0] == "api" and len(segments) == 2) or (segments[0] == "apis" and len(segments) == 3):
            document = openapi.group_version_document(group, version, self.server_version)
            if document is not None:
                return json_response(document)
        raise StatusError(404, "NotFound", "the server could not find the requested resource")

    def _resolve(self, group: str, version: str, rest: list[str]) -> _Target:
        legacy_watch = False
        if rest[0] == "watch":
            legacy_watch, rest = True, rest[1:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = find_resource(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        res = find_resource(group, version, rest[0])
        if res is None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and not (
            (subresource == "status" and res.status_subresource)
            or (subresource == "scale" and res.scale_subresource)
        ):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if res.namespaced and namespace is None and name is not None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return _Target(res, version, namespace, name, subresource, legacy_watch)

    @staticmethod
    def _verb(request: Request, target: _Target) -> str:
        method = request.method
        if method in ("GET", "HEAD"):
            if target.name is not None:
                return "get"
            watch = target.legacy_watch or request.query_params.get("watch", "") in ("true", "1")
            return "watch" if watch else "list"
        if method == "POST":
            return "create" if target.name is None else "post-subresource"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        return "delete" if target.name is not None else "deletecollection"

    async def _resource_request(self, request: Request, target: _Target) -> Response:
        verb = self._verb(request, target)
        res = target.res
        if (
            verb not in res.verbs
            or verb == "post-subresource"
            or (target.name is None and verb in ("update", "patch"))
        ):
            raise method_not_supported(res, verb)
        if verb in ("create", "deletecollection") and res.namespaced and target.namespace is None:
            raise method_not_supported(res, verb)
        info = target.info(verb)
        self.counter.count(info)
        rule = self.faults.take(info)
        if rule is not None:
            if rule.delay_seconds:
                await asyncio.sleep(rule.delay_seconds)
            if rule.code >= 400:
                log.info("injected failure", verb=verb, resource=info.resource_key, code=rule.code)
                headers = (
                    {"Retry-After": str(rule.retry_after_seconds)}
                    if rule.retry_after_seconds is not None
                    else None
                )
                message = rule.message or f"injected failure for {verb} {info.resource_key}"
                return json_response(
                    status_object(rule.code, rule.default_reason, message), rule.code, headers
                )
        handler: Callable[[Request, _Target], Awaitable[Response]] = {
            "get": self._get,
            "list": self._list,
            "watch": self._watch,
            "create": self._create,
            "update": self._update,
            "patch": self._patch,
            "delete": self._delete,
            "deletecollection": self._delete_collection,
        }[verb]
        return await handler(request, target)

    # -- helpers -------------------------------------------------------------------------------

    def _present(self, target: _Target, obj: Obj) -> Obj:
        return from_storage(target.res, target.version, obj)

    def _list_item(self, target: _Target, obj: Obj) -> Obj:
        shown = dict(self._present(target, obj))
        # A list's items carry no apiVersion/kind of their own, as on a real server.
        shown.pop("apiVersion", None)
        shown.pop("kind", None)
        return shown

    def _storage_form(self, target: _Target, obj: Obj) -> Obj:
        """A written object (checked, in the requested version) as the store keeps it."""
        stored = to_storage(target.res, target.version, obj)
        apply_defaults(target.res, stored)
        self._finalize_secret(target.res, stored)
        return stored

    @staticmethod
    def _dry_run(request: Request) -> bool:
        values = request.query_params.getlist("dryRun")
        for value in values:
            if value != "All":
                raise bad_request(f'Invalid dryRun value "{value}": only "All" is supported')
        return bool(values)

    @staticmethod
    async def _raw_body(request: Request) -> bytes:
        raw = await request.body()
        if len(raw) > MAX_REQUEST_BYTES:
            raise StatusError(
                413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BYTES}"
            )
        return raw

    @classmethod
    async def _body(cls, request: Request) -> Any:
        raw = await cls._raw_body(request)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type not in _JSON_TYPES and content_type not in ("application/yaml", "*/*"):
            raise unsupported_media_type(content_type)
        if not raw.strip():
            raise bad_request("the request body is empty; an object is required")
        try:
            if content_type == "application/yaml":
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as err:
            raise bad_request(f"the request body is not valid JSON: {err}") from err

    def _check_type(self, target: _Target, obj: Any) -> Obj:
        if not isinstance(obj, dict):
            raise bad_request("the request body must be a JSON object")
        expected_av = target.res.api_version(target.version)
        api_version = obj.setdefault("apiVersion", expected_av)
        kind = obj.setdefault("kind", target.res.kind)
        if api_version != expected_av:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({expected_av})"
            )
        if kind != target.res.kind:
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({target.res.kind})"
            )
        meta = obj.get("metadata")
        if meta is None:
            obj["metadata"] = meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if target.res.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and target.namespace and body_ns != target.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if target.namespace:
                meta["namespace"] = target.namespace
        return obj

    def _schema_check(self, target: _Target, obj: Obj, name: str) -> None:
        api_version = str(obj.get("apiVersion"))
        kind = str(obj.get("kind"))
        if not self.catalog.versions:
            return
        plan = self.catalog.plan(api_version, kind)
        if not plan:
            raise invalid(
                target.res,
                name,
                [
                    Cause(
                        "apiVersion",
                        "FieldValueNotSupported",
                        f"{kind} {api_version} is not served by Kubernetes "
                        + ", ".join(self.catalog.versions),
                    )
                ],
            )
        problems = self.catalog.validate(obj)
        if problems:
            all_versions = set(self.catalog.served_by(api_version, kind))
            causes = []
            for versions, error in problems[:50]:
                where = (
                    ""
                    if set(versions) == all_versions
                    else f" (Kubernetes {', '.join(sorted(set(versions)))})"
                )
                causes.append(Cause(error.path, error.reason, error.detail + where))
            raise invalid(target.res, name, causes)

    def _rules_check(self, res: ResourceType, name: str, causes: list[Cause]) -> None:
        if causes:
            raise invalid(res, name, causes)

    def _selectors(self, request: Request, res: ResourceType) -> tuple[LabelSelector, FieldSelector]:
        try:
            labels = parse_label_selector(request.query_params.get("labelSelector"))
            fields = parse_field_selector(request.query_params.get("fieldSelector"), res.selectable_fields())
        except SelectorError as err:
            raise bad_request(str(err)) from err
        return labels, fields

    @staticmethod
    def _matcher(labels: LabelSelector, fields: FieldSelector) -> Callable[[Obj], bool]:
        if labels.empty and fields.empty:
            return lambda obj: True

        def match(obj: Obj) -> bool:
            return labels.matches((obj.get("metadata") or {}).get("labels")) and fields.matches(obj)

        return match

    def _list_kind(self, target: _Target) -> tuple[str, str]:
        return f"{target.res.kind}List", target.res.api_version(target.version)

    # -- reads ---------------------------------------------------------------------------------

    async def _get(self, request: Request, target: _Target) -> Response:
        assert target.name is not None
        obj = self.store.get(target.res, target.namespace, target.name)
        if target.subresource == "scale":
            return json_response(self._scale_of(obj))
        if wants_table(request.headers.get("accept", "")):
            include = request.query_params.get("includeObject", "Metadata")
            rv = obj["metadata"]["resourceVersion"]
            return json_response(
                table(target.res, [self._present(target, obj)], resource_version=rv, include=include)
            )
        return json_response(self._present(target, obj))

    async def _list(self, request: Request, target: _Target) -> Response:
        params = request.query_params
        labels, fields = self._selectors(request, target.res)
        limit_text = params.get("limit")
        try:
            limit = int(limit_text) if limit_text else None
        except ValueError as err:
            raise bad_request(f"limit {limit_text!r} is not an integer") from err
        if limit is not None and limit < 0:
            raise bad_request("limit must not be negative")
        token = params.get("continue")
        rv_text = params.get("resourceVersion")
        rv_match = params.get("resourceVersionMatch")
        after = None
        at_rv: int | None = None
        if token:
            if rv_text not in (None, ""):
                raise bad_request("specifying resource version is not allowed when using continue")
            at_rv, after = _decode_continue(token)
        elif rv_text not in (None, "", "0"):
            try:
                wanted = int(str(rv_text))
            except ValueError as err:
                raise bad_request(f"resourceVersion {rv_text!r} is not valid") from err
            if rv_match == "Exact":
                at_rv = wanted
            elif wanted > self.store.rv:
                raise StatusError(
                    504, "Timeout", f"Too large resource version: {wanted}, current: {self.store.rv}"
                )
        elif rv_match == "Exact":
            raise bad_request("resourceVersionMatch=Exact requires a resourceVersion")
        page = self.store.list_objects(
            target.res,
            target.namespace,
            match=self._matcher(labels, fields),
            limit=limit,
            after=after,
            at_rv=at_rv,
        )
        continue_token = (
            _encode_continue(page.resource_version, page.continue_key)
            if page.continue_key is not None
            else None
        )
        if wants_table(request.headers.get("accept", "")):
            rows = [self._present(target, obj) for obj in page.items]
            include = request.query_params.get("includeObject", "Metadata")
            rv = str(page.resource_version)
            return json_response(
                table(target.res, rows, resource_version=rv, include=include, continue_token=continue_token)
            )
        items = [self._list_item(target, obj) for obj in page.items]
        meta: Obj = {"resourceVersion": str(page.resource_version)}
        if continue_token is not None:
            meta["continue"] = continue_token
            meta["remainingItemCount"] = page.remaining
        kind, api_version = self._list_kind(target)
        return json_response({"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items})

    # -- watch ---------------------------------------------------------------------------------

    async def _watch(self, request: Request, target: _Target) -> Response:
        params = request.query_params
        labels, fields = self._selectors(request, target.res)
        match = self._matcher(labels, fields)
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        send_initial_text = params.get("sendInitialEvents")
        rv_text = params.get("resourceVersion") or ""
        timeout_text = params.get("timeoutSeconds")
        try:
            if timeout_text:
                timeout = float(timeout_text)
            else:
                timeout = self.config.min_request_timeout * (1 + random.random())  # noqa: S311 - not a secret
        except ValueError as err:
            raise bad_request(f"timeoutSeconds {timeout_text!r} is not a number") from err
        if send_initial_text is not None:
            send_initial = send_initial_text in ("true", "1")
            if send_initial and params.get("resourceVersionMatch") != "NotOlderThan":
                raise invalid(
                    target.res,
                    "",
                    [
                        Cause(
                            "resourceVersionMatch",
                            "FieldValueForbidden",
                            "Forbidden: sendInitialEvents requires resourceVersionMatch=NotOlderThan",
                        )
                    ],
                )
        else:
            send_initial = rv_text in ("", "0")
        table_include = (
            params.get("includeObject", "Metadata")
            if wants_table(request.headers.get("accept", ""))
            else None
        )

        def present(obj: Obj) -> Obj:
            shown = self._present(target, obj)
            if table_include is None:
                return shown
            rv = str(obj["metadata"].get("resourceVersion", ""))
            return table(target.res, [shown], resource_version=rv, include=table_include)

        options = WatchOptions(
            resource_version=rv_text,
            send_initial=send_initial,
            mark_initial_end=send_initial and send_initial_text is not None,
            bookmarks=bookmarks,
            duration=timeout,
            bookmark_interval=self.config.bookmark_interval,
        )
        stream = open_watch(
            self.store,
            target.res,
            target.namespace,
            api_version=target.res.api_version(target.version),
            present=present,
            match=match,
            options=options,
        )
        return StreamingResponse(stream, media_type="application/json")

    # -- writes --------------------------------------------------------------------------------

    def _admit_create(self, res: ResourceType) -> Callable[[Obj], None]:
        def admit(obj: Obj) -> None:
            self._rules_check(res, obj["metadata"].get("name", ""), rules.validate_object(res, obj))

        return admit

    def _admit_update(self, res: ResourceType, subresource: str | None) -> Callable[[Obj, Obj], None]:
        def admit(new: Obj, old: Obj) -> None:
            self._rules_check(res, new["metadata"]["name"], rules.validate_update(res, new, old, subresource))

        return admit

    async def _create(self, request: Request, target: _Target) -> Response:
        dry_run = self._dry_run(request)
        obj = self._check_type(target, await self._body(request))
        name = obj["metadata"].get("name") or obj["metadata"].get("generateName") or ""
        self._schema_check(target, obj, name)
        res = target.res
        if res.kind == "TokenReview":
            return self._token_review(obj)
        stored = self._storage_form(target, obj)
        created = self.store.create(res, stored, dry_run=dry_run, admit=self._admit_create(res))
        log.debug("created", resource=res.group_resource, name=created["metadata"]["name"])
        return json_response(self._present(target, created), 201)

    def _token_review(self, obj: Obj) -> Response:
        spec = obj.get("spec") or {}
        review = {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": self.auth.review(spec),
        }
        return json_response(review, 201)

    @staticmethod
    def _finalize_secret(res: ResourceType, obj: Obj) -> None:
        # The API server folds stringData into data (base64) and never stores stringData.
        if res.kind != "Secret":
            return
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict) and string_data:
            data = obj.setdefault("data", {}) or {}
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            obj["data"] = data

    async def _update(self, request: Request, target: _Target) -> Response:
        assert target.name is not None
        dry_run = self._dry_run(request)
        body = await self._body(request)
        if target.subresource == "scale":
            return self._write_scale(target, body, dry_run=dry_run)
        obj = self._check_type(target, body)
        body_name = obj["metadata"].get("name")
        if body_name != target.name:
            raise _name_mismatch(body_name, target.name)
        self._schema_check(target, obj, target.name)
        res = target.res
        stored = self._storage_form(target, obj)
        if self.store.find(res, target.namespace, target.name) is None:
            if not res.create_on_update or target.subresource:
                raise not_found(res, target.name)
            stored["metadata"].pop("resourceVersion", None)
            created = self.store.create(res, stored, dry_run=dry_run, admit=self._admit_create(res))
            return json_response(self._present(target, created), 201)
        updated = self.store.update(
            res,
            stored,
            subresource=target.subresource,
            dry_run=dry_run,
            admit=self._admit_update(res, target.subresource),
        )
        return json_response(self._present(target, updated))

    async def _patch(self, request: Request, target: _Target) -> Response:
        assert target.name is not None
        dry_run = self._dry_run(request)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        patch_type = _PATCH_TYPES.get(content_type)
        if patch_type is None or patch_type == "apply-cbor":
            raise unsupported_media_type(content_type)
        raw = await self._raw_body(request)
        try:
            patch = yaml.safe_load(raw) if patch_type == "apply" else json.loads(raw)
        except (ValueError, yaml.YAMLError) as err:
            raise bad_request(
                f"the patch is not valid {'YAML' if patch_type == 'apply' else 'JSON'}: {err}"
            ) from err
        res = target.res
        current = self.store.find(res, target.namespace, target.name)
        if patch_type == "apply":
            if not request.query_params.get("fieldManager"):
                raise bad_request("PATCH of type apply requires the fieldManager parameter")
            if current is None and not target.subresource:
                return await self._apply_create(target, patch, dry_run=dry_run)
        if current is None:
            raise not_found(res, target.name)
        if target.subresource == "scale":
            base: Obj = self._scale_of(current)
        else:
            base = self._present(target, current)
        try:
            if patch_type == "merge":
                patched = apply_merge_patch(base, patch)
            elif patch_type == "json":
                patched = apply_json_patch(base, patch)
            else:
                if not isinstance(patch, dict):
                    raise PatchError("a strategic merge patch must be a JSON object")
                patched = apply_strategic_merge_patch(base, patch, self._patch_schema(base))
        except PatchError as err:
            raise StatusError(422, "Invalid", f"the patch could not be applied: {err}") from err
        # The patch result may share unpatched parts with the stored object; what follows
        # (defaults, server fields) writes into it, so it gets a document of its own.
        patched = clone(patched)
        if target.subresource == "scale":
            return self._write_scale(target, patched, dry_run=dry_run)
        if not isinstance(patched, dict):
            raise bad_request("the patched document is not a JSON object")
        meta = patched.get("metadata") or {}
        if meta.get("name") != target.name:
            raise _name_mismatch(meta.get("name"), target.name)
        obj = self._check_type(target, patched)
        self._schema_check(target, obj, target.name)
        stored = self._storage_form(target, obj)
        updated = self.store.update(
            res,
            stored,
            subresource=target.subresource,
            dry_run=dry_run,
            admit=self._admit_update(res, target.subresource),
        )
        return json_response(self._present(target, updated))

    def _patch_schema(self, obj: Obj) -> SchemaNode | None:
        if not self.catalog.sets:
            return None
        schema_set = self.catalog.sets[-1]
        kind = schema_set.kind(str(obj.get("apiVersion")), str(obj.get("kind")))
        if kind is None:
            return None
        return SchemaNode(kind.top, schema_set.resolve)

    async def _apply_create(self, target: _Target, patch: Any, *, dry_run: bool) -> Response:
        obj = self._check_type(target, patch)
        if obj["metadata"].get("name") != target.name:
            raise _name_mismatch(obj["metadata"].get("name"), target.name)
        self._schema_check(target, obj, target.name or "")
        res = target.res
        stored = self._storage_form(target, obj)
        created = self.store.create(res, stored, dry_run=dry_run, admit=self._admit_create(res))
        return json_response(self._present(target, created), 201)

    async def _delete(self, request: Request, target: _Target) -> Response:
        assert target.name is not None
        uid, rv, dry_run, orphan = await self._delete_options(request)
        obj, deleted = self.store.delete(
            target.res, target.namespace, target.name, uid=uid, resource_version=rv, dry_run=dry_run
        )
        # handlers/delete.go: 202 only when the deletion is pending and the client asked for
        # orphanDependents=false; everything else is 200 (changing that would break clients).
        return json_response(self._present(target, obj), 202 if not deleted and orphan is False else 200)

    async def _delete_options(self, request: Request) -> tuple[str | None, str | None, bool, bool | None]:
        """(uid precondition, resourceVersion precondition, dry run, orphanDependents)."""
        dry_run = self._dry_run(request)
        raw = await request.body()
        uid = rv = None
        orphan: bool | None = None
        if raw.strip():
            try:
                options = json.loads(raw)
            except ValueError as err:
                raise bad_request(f"DeleteOptions are not valid JSON: {err}") from err
            if not isinstance(options, dict):
                raise bad_request("DeleteOptions must be a JSON object")
            pre = options.get("preconditions") or {}
            uid, rv = pre.get("uid"), pre.get("resourceVersion")
            if "All" in (options.get("dryRun") or []):
                dry_run = True
            if isinstance(options.get("orphanDependents"), bool):
                orphan = options["orphanDependents"]
        return uid, rv, dry_run, orphan

    async def _delete_collection(self, request: Request, target: _Target) -> Response:
        labels, fields = self._selectors(request, target.res)
        _, _, dry_run, _ = await self._delete_options(request)
        match = self._matcher(labels, fields)
        deleted = []
        for obj in list(self.store.objects(target.res, target.namespace)):
            if not match(obj):
                continue
            meta = obj["metadata"]
            gone_obj, _ = self.store.delete(target.res, meta.get("namespace"), meta["name"], dry_run=dry_run)
            deleted.append(self._list_item(target, gone_obj))
        kind, api_version = self._list_kind(target)
        return json_response(
            {
                "kind": kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": deleted,
            }
        )

    # -- scale subresource ---------------------------------------------------------------------

    @staticmethod
    def _scale_of(obj: Obj) -> Obj:
        meta = obj["metadata"]
        spec = obj.get("spec") or {}
        match_labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": int(spec.get("replicas") or 0)},
            "status": {
                "replicas": int((obj.get("status") or {}).get("replicas") or 0),
                "selector": ",".join(f"{k}={v}" for k, v in sorted(match_labels.items())),
            },
        }

    def _write_scale(self, target: _Target, body: Any, *, dry_run: bool) -> Response:
        assert target.name is not None
        if not isinstance(body, dict):
            raise bad_request("a Scale must be a JSON object")
        body.setdefault("apiVersion", "autoscaling/v1")
        body.setdefault("kind", "Scale")
        if self.catalog.versions:
            problems = self.catalog.validate(body)
            if problems:
                raise invalid(
                    target.res, target.name, [Cause(e.path, e.reason, e.detail) for _, e in problems]
                )
        replicas = (body.get("spec") or {}).get("replicas", 0)
        if not isinstance(replicas, int) or replicas < 0:
            raise invalid(
                target.res,
                target.name,
                [
                    Cause(
                        "spec.replicas",
                        "FieldValueInvalid",
                        f"Invalid value: {replicas}: must be greater than or equal to 0",
                    )
                ],
            )
        current = self.store.get(target.res, target.namespace, target.name)
        updated_obj = dict(current)
        updated_obj["spec"] = {**(current.get("spec") or {}), "replicas": replicas}
        want_rv = (body.get("metadata") or {}).get("resourceVersion")
        updated_obj["metadata"] = {
            **current["metadata"],
            "resourceVersion": want_rv or current["metadata"]["resourceVersion"],
        }
        updated = self.store.update(target.res, updated_obj, dry_run=dry_run)
        return json_response(self._scale_of(updated))
