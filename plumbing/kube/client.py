"""An asyncio client for the Kubernetes API server, shared by every role.

Configuration (kubeconfig, in-cluster service account) is loaded with the official
``kubernetes`` client; requests go through ``httpx`` on the event loop. Objects are
plain JSON dicts; typed views live beside their users (see :mod:`plumbing.kube.dra`).
"""

from __future__ import annotations

import builtins
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from plumbing.errors import PlumbingError
from plumbing.httplimits import CLIENT_KEEPALIVE_EXPIRY
from plumbing.kube.resources import Resource
from plumbing.logs import get_logger

__all__ = [
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


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: dict[str, Any]


class KubeClient:
    """CRUD, patch and watch on any :class:`Resource`, raising :class:`ApiError` subclasses."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: float = 30.0,
        user_agent: str = "fabric-dra",
        max_connections: int = 64,
    ) -> None:
        self.config = config
        verify: ssl.SSLContext | bool = False
        if config.server.startswith("https"):
            if config.verify:
                verify = ssl.create_default_context(cafile=config.ca_file)
                if config.cert_file:
                    verify.load_cert_chain(config.cert_file, config.key_file)
            else:
                log.warning("TLS verification of the API server is off", server=config.server)
                verify = ssl.create_default_context()
                verify.check_hostname = False
                verify.verify_mode = ssl.CERT_NONE
                if config.cert_file:
                    verify.load_cert_chain(config.cert_file, config.key_file)
        self._http = httpx.AsyncClient(
            base_url=config.server,
            verify=verify,
            timeout=httpx.Timeout(timeout, connect=10.0),
            # idle connections expire before the API test server closes them (a ledger PUT sent on
            # a connection being closed failed the 10,000-binding run with a ReadError)
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY,
            ),
            headers={"User-Agent": user_agent, "Accept": "application/json"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        token = self.config.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

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
        content = None if body is None else json.dumps(body).encode()
        headers = self._headers({"Content-Type": content_type} if content is not None else None)
        clean_params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = await self._http.request(
                method,
                path,
                params=clean_params,
                content=content,
                headers=headers,
                timeout=request_timeout if request_timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as err:
            raise ApiUnavailable(0, "Unreachable", f"{method} {path}: {err!r}") from err
        if response.status_code >= 400:
            try:
                status_body = response.json()
            except ValueError:
                status_body = {"message": response.text[:500]}
            raise _error_for(response.status_code, status_body if isinstance(status_body, dict) else {})
        if not response.content:
            return {}
        result = response.json()
        return result if isinstance(result, dict) else {"items": result}

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
        clean = {k: v for k, v in params.items() if v is not None}
        try:
            async with self._http.stream(
                "GET",
                res.path(namespace),
                params=clean,
                headers=self._headers(),
                timeout=httpx.Timeout(timeout_seconds + 30.0, connect=10.0),
            ) as response:
                if response.status_code >= 400:
                    body = await response.aread()
                    try:
                        status_body = json.loads(body)
                    except ValueError:
                        status_body = {"message": body[:500].decode(errors="replace")}
                    raise _error_for(response.status_code, status_body)
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        raise _error_for(int(obj.get("code") or 500), obj)
                    yield WatchEvent(kind, obj)
        except httpx.HTTPError as err:
            raise ApiUnavailable(0, "Unreachable", f"watch {res.plural}: {err!r}") from err

    @staticmethod
    def _typed(res: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(obj)
        out.setdefault("apiVersion", res.api_version)
        out.setdefault("kind", res.kind)
        return out
