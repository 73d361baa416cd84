"""An asyncio client for the Kubernetes API server, shared by every role.

Configuration (kubeconfig, in-cluster service account) is read here, a kubeconfig beyond the
plain ones with the official ``kubernetes`` library. Requests go over :mod:`plumbing.http1`
(HTTP/1.1 on asyncio streams, the manager client's and the Redfish transport's wire), not httpx:
a kubelet plugin reads each claim and PATCHes its status through this client, and an httpx
request cost it 2 to 3 ms of CPU on a loaded machine, the same exchange over asyncio streams
about 0.2 ms (docs/performance.md, issue 37). Objects are plain JSON dicts; typed views live
beside their users (see :mod:`plumbing.kube.dra`).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

from plumbing.errors import PlumbingError
from plumbing.http1 import Answer, TransportError, Wire, proxy_for
from plumbing.httplimits import CLIENT_KEEPALIVE_EXPIRY
from plumbing.kube.resources import Resource
from plumbing.logs import get_logger

__all__ = [
    "MAX_ANSWER_BYTES",
    "AlreadyExists",
    "ApiError",
    "ApiUnavailable",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeConfig",
    "NotFound",
    "PatchType",
    "Unauthorized",
    "WatchEvent",
    "load_config",
]

log = get_logger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: seconds to connect to the API server (TCP and TLS), as the httpx client this one replaced had
CONNECT_TIMEOUT = 10.0
#: the most one answer (or one watch event) may hold. An object is at most ~1.5 MiB (etcd's request
#: limit, kube-apiserver's --max-request-bytes default 3 MiB); the largest answers are list pages
#: (500 items by :meth:`KubeClient.list_all`): 500 ResourceSlices of 128 devices are ~30 MiB.
MAX_ANSWER_BYTES = 128 << 20
PatchType = Literal["merge", "strategic", "json", "apply"]
_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


class ApiError(PlumbingError):
    """The API server answered with an error Status."""

    def __init__(self, status: int, reason: str, message: str, body: Mapping[str, Any] | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = dict(body or {})


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """A write lost an optimistic-concurrency race (stale resourceVersion)."""


class AlreadyExists(ApiError):
    pass


class Invalid(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class Gone(ApiError):
    """The resourceVersion a watch asked for is too old: list again."""


class ApiUnavailable(ApiError):
    """The API server could not be reached or answered 5xx/429; worth retrying."""


def _error_for(status: int, body: Mapping[str, Any]) -> ApiError:
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or "")
    if status == 404:
        return NotFound(status, reason or "NotFound", message, body)
    if status == 409:
        cls: type[ApiError] = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(status, reason or "Conflict", message, body)
    if status == 422:
        return Invalid(status, reason or "Invalid", message, body)
    if status == 401:
        return Unauthorized(status, reason or "Unauthorized", message, body)
    if status == 403:
        return Forbidden(status, reason or "Forbidden", message, body)
    if status == 410:
        return Gone(status, reason or "Expired", message, body)
    if status >= 500 or status == 429:
        return ApiUnavailable(status, reason or "ServerError", message, body)
    return ApiError(status, reason or "Error", message, body)


@dataclass
class KubeConfig:
    """Where the API server is and how to authenticate to it."""

    server: str
    ca_file: str | None = None
    verify: bool = True
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    namespace: str = "default"
    #: bound service-account tokens rotate; the file is re-read this often.
    token_refresh_seconds: float = 60.0
    _token_read_at: float = field(default=0.0, repr=False)

    def bearer_token(self) -> str | None:
        if self.token_file and time.monotonic() - self._token_read_at > self.token_refresh_seconds:
            self.token = Path(self.token_file).read_text().strip()
            self._token_read_at = time.monotonic()
        return self.token


def _plain_kubeconfig(path: str, context: str | None) -> KubeConfig | None:
    """A kubeconfig that names only a server, files and a token, read without the ``kubernetes``
    library (≈ 12 MiB of memory in every role that would import it just for this). Anything else —
    exec or auth-provider plugins, embedded ``*-data``, several files in ``$KUBECONFIG`` — returns
    None and goes through the library."""
    import yaml

    if os.pathsep in path:
        return None
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None

    def named(section: str, name: str | None) -> dict[str, Any] | None:
        for item in doc.get(section) or []:
            if isinstance(item, dict) and item.get("name") == name:
                body = item.get(section.rstrip("s"))
                return body if isinstance(body, dict) else {}
        return None

    ctx = named("contexts", context or doc.get("current-context"))
    if ctx is None:
        return None
    cluster = named("clusters", ctx.get("cluster"))
    user = named("users", ctx.get("user")) or {}
    simple_cluster = {"server", "certificate-authority", "insecure-skip-tls-verify"}
    simple_user = {"token", "tokenFile", "client-certificate", "client-key"}
    if not cluster or not cluster.get("server") or set(cluster) - simple_cluster or set(user) - simple_user:
        return None
    base = Path(path).parent

    def resolved(value: Any) -> str | None:
        return str(base / value) if isinstance(value, str) and value else None

    return KubeConfig(
        server=str(cluster["server"]).rstrip("/"),
        ca_file=resolved(cluster.get("certificate-authority")),
        verify=not cluster.get("insecure-skip-tls-verify", False),
        token=user.get("token") or None,
        token_file=resolved(user.get("tokenFile")),
        cert_file=resolved(user.get("client-certificate")),
        key_file=resolved(user.get("client-key")),
        namespace=str(ctx.get("namespace") or "default"),
    )


def load_config(kubeconfig: str | None = None, context: str | None = None) -> KubeConfig:
    """In-cluster configuration when running in a pod (and no kubeconfig is given), else a kubeconfig.

    The kubeconfig path defaults to ``$KUBECONFIG`` or ``~/.kube/config``; exec plugins,
    client certificates and embedded CA data work as with kubectl.
    """
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
        return KubeConfig(
            server=f"https://{host}:{port}",
            ca_file=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
            token_file=str(SERVICE_ACCOUNT_DIR / "token"),
            namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
        )

    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    plain = _plain_kubeconfig(path, context)
    if plain is not None:
        return plain

    from kubernetes import client as k8s_client  # blocking library: only used to parse kubeconfig
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=path, context=context, client_configuration=cfg)  # type: ignore[no-untyped-call]
    token = None
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if auth:
        token = auth.removeprefix("Bearer ").strip()
    _, active = k8s_config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    if context:
        contexts, _ = k8s_config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
        active = next((c for c in contexts if c["name"] == context), active)
    namespace = (active or {}).get("context", {}).get("namespace") or "default"
    return KubeConfig(
        server=cfg.host.rstrip("/"),
        ca_file=cfg.ssl_ca_cert,
        verify=bool(cfg.verify_ssl),
        token=token,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        namespace=namespace,
    )


def _tls_context(config: KubeConfig) -> ssl.SSLContext | None:
    """How to check the API server (its CA, its name) and what client certificate to show."""
    if not config.server.startswith("https"):
        return None
    if config.verify:
        context = ssl.create_default_context(cafile=config.ca_file)
    else:
        log.warning("TLS verification of the API server is off", server=config.server)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


def _status_body(data: bytes) -> dict[str, Any]:
    """An error answer's Status object, or its first words when it is none (a proxy's page)."""
    try:
        body = json.loads(data)
    except ValueError:
        return {"message": data[:500].decode(errors="replace")}
    return body if isinstance(body, dict) else {}


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: dict[str, Any]


class KubeClient:
    """CRUD, patch and watch on any :class:`Resource`, raising :class:`ApiError` subclasses.

    Requests go over :class:`plumbing.http1.Wire` (HTTP/1.1 on asyncio streams). ``timeout`` is
    the connect-free part of one request: its answer must make progress within it (the read
    timeout) and arrive whole within four times it (the deadline); ``request_timeout`` bounds one
    request whole, a free connection's wait and the connect included. An answer is read up to
    ``max_answer_bytes`` and only in the identity coding (none other is asked for); larger, or
    coded, it is refused as :class:`ApiUnavailable`.
    """

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: float = 30.0,
        user_agent: str = "fabric-dra",
        max_connections: int = 64,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.config = config
        self.max_answer_bytes = max_answer_bytes
        #: seconds a watch may outlast its timeoutSeconds before the client cuts it (a server
        #: that stopped talking without closing)
        self.watch_slack = 30.0
        #: the path the API server is served under (none, or a proxy's such as Rancher's
        #: /k8s/clusters/<id>), before each request's
        self._prefix = urlsplit(config.server).path.rstrip("/")
        self._wire = Wire(
            config.server,
            tls=_tls_context(config),
            proxy=proxy_for(config.server),
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=timeout,
            deadline=4 * timeout,
            max_connections=max_connections,
            # idle connections expire before the API test server closes them (a ledger PUT sent on
            # a connection being closed failed the 10,000-binding run with a ReadError)
            keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY,
            tls_advice=lambda reason: (
                f"TLS handshake with the API server failed ({reason}); check the cluster's CA "
                "(the kubeconfig's certificate-authority, or the service account's ca.crt)"
            ),
            user_agent=user_agent,
        )

    async def aclose(self) -> None:
        self._wire.abort()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _fields(self, content_type: str | None = None) -> dict[str, str]:
        fields = {"Accept": "application/json"}
        if content_type is not None:
            fields["Content-Type"] = content_type
        token = self.config.bearer_token()
        if token:
            fields["Authorization"] = f"Bearer {token}"
        return fields

    def _target(self, path: str, params: Mapping[str, Any] | None) -> str:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        return f"{self._prefix}{path}?{urlencode(clean)}" if clean else f"{self._prefix}{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = None,
    ) -> dict[str, Any]:
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        fields = self._fields(content_type if content is not None else None)
        target = self._target(path, params)
        try:
            if request_timeout is None:
                status, data = await self._exchange(method, target, fields, content, None)
            else:
                async with asyncio.timeout(request_timeout):
                    status, data = await self._exchange(method, target, fields, content, request_timeout)
        except TransportError as err:
            raise ApiUnavailable(0, "Unreachable", f"{method} {path}: {err}") from err
        except TimeoutError:
            raise ApiUnavailable(
                0, "Timeout", f"{method} {path}: no whole answer within {request_timeout:g} s"
            ) from None
        if status >= 400:
            raise _error_for(status, _status_body(data))
        if not data:
            return {}
        try:
            result = json.loads(data)
        except ValueError:
            raise ApiUnavailable(status, "BadAnswer", f"{method} {path}: the answer is no JSON") from None
        return result if isinstance(result, dict) else {"items": result}

    async def _exchange(
        self, method: str, target: str, fields: dict[str, str], body: bytes | None, within: float | None
    ) -> tuple[int, bytes]:
        timing = None if within is None else (min(CONNECT_TIMEOUT, within), within)
        answer = await self._wire.open(method, target, fields, body, http_timeout=timing, deadline=within)
        try:
            return answer.status, await answer.whole(self.max_answer_bytes)
        finally:
            answer.close()

    # -- CRUD ---------------------------------------------------------------------------------

    async def get(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
        *,
        request_timeout: float | None = None,
    ) -> dict[str, Any]:
        return await self.request(
            "GET", res.path(namespace, name, subresource), request_timeout=request_timeout
        )

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """One page of a list; see :meth:`list_all` for every page."""
        return await self.request(
            "GET",
            res.path(namespace),
            params={
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
                "limit": limit,
                "continue": continue_token,
                "resourceVersion": resource_version,
            },
        )

    async def list_all(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Every item of a list, following ``continue`` tokens; returns (items, resourceVersion)."""
        items: builtins.list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self.list(
                res,
                namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_token=token,
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    async def create(
        self,
        res: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        request_timeout: float | None = None,
    ) -> dict[str, Any]:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        return await self.request(
            "POST",
            res.path(ns),
            params={"fieldManager": field_manager},
            body=self._typed(res, obj),
            request_timeout=request_timeout,
        )

    async def replace(
        self,
        res: Resource,
        obj: Mapping[str, Any],
        *,
        subresource: str | None = None,
        request_timeout: float | None = None,
    ) -> dict[str, Any]:
        """PUT the object; its ``metadata.resourceVersion`` makes this a compare-and-swap."""
        meta = obj.get("metadata") or {}
        return await self.request(
            "PUT",
            res.path(meta.get("namespace"), meta["name"], subresource),
            body=self._typed(res, obj),
            request_timeout=request_timeout,
        )

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            params={"fieldManager": field_manager, "force": None if force is None else str(force).lower()},
            body=patch,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Delete, optionally only if the object still has this UID / resourceVersion."""
        body: dict[str, Any] | None = None
        if uid or resource_version:
            preconditions = {k: v for k, v in {"uid": uid, "resourceVersion": resource_version}.items() if v}
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def delete_ignore_missing(self, res: Resource, name: str, namespace: str | None = None) -> bool:
        try:
            await self.delete(res, name, namespace)
        except NotFound:
            return False
        return True

    # -- watch --------------------------------------------------------------------------------

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """Stream changes after ``resource_version``; raises :class:`Gone` when it is too old.

        The stream ends after ``timeout_seconds`` (server side); callers loop, resuming from
        the last resourceVersion they saw (bookmarks included).
        """
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "timeoutSeconds": timeout_seconds,
        }
        target = self._target(res.path(namespace), params)
        # The server ends the stream after timeout_seconds; the client gives it watch_slack more,
        # between two events (bookmarks included) and whole, then cuts it.
        bound = timeout_seconds + self.watch_slack
        try:
            answer = await self._wire.open(
                "GET",
                target,
                self._fields(),
                stream=True,
                http_timeout=(CONNECT_TIMEOUT, bound),
                deadline=bound,
            )
        except TransportError as err:
            raise ApiUnavailable(0, "Unreachable", f"watch {res.plural}: {err}") from err
        try:
            if answer.status >= 400:
                try:
                    data = await answer.whole(self.max_answer_bytes)
                except TransportError as err:
                    raise ApiUnavailable(0, "Unreachable", f"watch {res.plural}: {err}") from err
                raise _error_for(answer.status, _status_body(data))
            async for line in self._lines(answer, res):
                try:
                    event = json.loads(line)
                except ValueError:
                    raise ApiUnavailable(
                        0, "BadAnswer", f"watch {res.plural}: an event that is no JSON"
                    ) from None
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise _error_for(int(obj.get("code") or 500), obj)
                yield WatchEvent(kind, obj)
        finally:
            answer.close()

    async def _lines(self, answer: Answer, res: Resource) -> AsyncIterator[bytes]:
        """The stream's non-empty lines (one JSON event each), none longer than the answer cap."""
        if answer.headers.get("content-encoding", "identity").lower() != "identity":
            raise ApiUnavailable(0, "Unreachable", f"watch {res.plural}: a coded stream, none was asked for")
        pending = b""
        while True:
            try:
                piece = await answer.read()
            except TransportError as err:
                raise ApiUnavailable(0, "Unreachable", f"watch {res.plural}: {err}") from err
            if not piece:
                if pending.strip():
                    yield pending
                return
            *lines, pending = (pending + piece).split(b"\n")
            if len(pending) > self.max_answer_bytes:
                raise ApiUnavailable(
                    0,
                    "Unreachable",
                    f"watch {res.plural}: an event larger than {self.max_answer_bytes} bytes",
                )
            for line in lines:
                if line.strip():
                    yield line

    @staticmethod
    def _typed(res: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(obj)
        out.setdefault("apiVersion", res.api_version)
        out.setdefault("kind", res.kind)
        return out
