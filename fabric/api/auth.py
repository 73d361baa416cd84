"""Who may call the manager, for what, and for which node.

Roles:

* ``plugin`` — a node's kubelet plugin: reads the fabric's state, attaches and detaches *for its
  own node only* (403 otherwise);
* ``controller`` — the binding-condition controller / slice publisher: reads, and attaches and
  detaches for any node;
* ``operator`` — people and tools: read (``fabric-dra status``), and the only role that reads
  what tenants used (``fabric-dra usage``) and ``/metrics``, and that drains devices
  (``fabric-dra drain``: a drain with ``--evict`` deletes tenants' pods);
* ``metrics`` — a scraper (Prometheus): ``/metrics`` and nothing else.

What each role may do is one table, :data:`GRANTS` (docs/manager.md, "Who may read what"): device-
seconds by namespace and workload, in ``GET /api/v1/usage`` and in ``/metrics`` labels, are the
tenants' business, not a node's — a plugin token is on every node, and one node taken over must not
read the whole cluster's usage.

In a cluster a caller presents its service-account token and the manager asks the API server
(``authentication.k8s.io/v1`` TokenReview). A projected (bound) token of a pod carries the pod's
node in ``status.user.extra["authentication.kubernetes.io/node-name"]``; the plugin's node comes
from there, never from the request. Which service accounts are plugins or controllers, and which
groups are operators, is configuration. For local runs a static token file maps tokens to roles;
``--metrics-token-file`` names a file holding the one token of the ``metrics`` role (a Secret that
the ServiceMonitor presents too), re-read when it changes.
Tokens are compared in constant time and never logged; TokenReview answers are cached under a hash
of the token — an identity for ``cache_seconds``, a refusal (unknown token, or a user without a
role) for :data:`NEGATIVE_CACHE_SECONDS` only, so a fresh token works soon; callers presenting a
token while it is being reviewed share that one review. Each TokenReview is a
call to the API server that a client without any valid token can cause: reviews are rate-limited
per client address (:class:`ReviewBudget`; a cached answer costs nothing), beyond which the client
gets 429 ``TooManyRequests`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fabric.errors import ConfigError
from manager_api.errors import FabricUnavailable, PermissionDenied, TooManyRequests, Unauthenticated
from plumbing.kube.client import ApiError, KubeClient
from plumbing.kube.resources import TOKEN_REVIEWS
from plumbing.logs import get_logger
from plumbing.tokens import TokenError, bearer_token, read_token_file

__all__ = [
    "GRANTS",
    "NEGATIVE_CACHE_SECONDS",
    "NODE_NAME_EXTRA",
    "Access",
    "AllowAll",
    "Authenticator",
    "Chain",
    "Identity",
    "MetricsTokenFile",
    "ReviewBudget",
    "Role",
    "StaticTokens",
    "TokenReviewAuthenticator",
    "load_static_tokens",
]

log = get_logger(__name__)

#: the TokenReview ``user.extra`` key that carries the node of a pod-bound service-account token
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

#: how long a refused token stays refused without asking the API server again
NEGATIVE_CACHE_SECONDS = 2.0


class Role(StrEnum):
    PLUGIN = "plugin"
    CONTROLLER = "controller"
    OPERATOR = "operator"
    METRICS = "metrics"


class Access(StrEnum):
    """What a request does, as the grants speak of it."""

    #: the fabric's state: inventory, devices, nodes, operations
    READ = "read the fabric's state"
    #: attach, detach, reset reports and claim reports (a plugin: for its own node only)
    BIND = "attach or detach"
    #: ``GET /api/v1/usage``: device-seconds by namespace and workload
    USAGE = "read device-seconds by namespace and workload"
    #: ``GET /metrics``: the Prometheus series, tenant namespaces among their labels
    METRICS = "read /metrics"
    #: ``POST`` and ``DELETE /api/v1/drains``: take devices out of allocation, evict their pods
    DRAIN = "drain or undrain devices"


#: Who may do what: the one table of the manager's authorisation.
GRANTS: dict[Role, frozenset[Access]] = {
    Role.PLUGIN: frozenset({Access.READ, Access.BIND}),
    Role.CONTROLLER: frozenset({Access.READ, Access.BIND}),
    Role.OPERATOR: frozenset({Access.READ, Access.USAGE, Access.METRICS, Access.DRAIN}),
    Role.METRICS: frozenset({Access.METRICS}),
}


@dataclass(frozen=True, slots=True)
class Identity:
    role: Role
    user: str
    node: str | None = None  # plugins only
    #: ``--insecure-no-auth``: everything is allowed, whatever the role
    unrestricted: bool = False

    def may(self, access: Access) -> bool:
        return self.unrestricted or access in GRANTS[self.role]

    def check(self, access: Access) -> None:
        """Raise :class:`PermissionDenied` unless this caller's role grants ``access``."""
        if self.may(access):
            return
        allowed = [role.value for role, grants in GRANTS.items() if access in grants]
        raise PermissionDenied(
            f"{self.user} ({self.role} role) may not {access}: only the {' or '.join(allowed)} role may"
        )

    def may_bind_for(self, node: str) -> bool:
        if not self.may(Access.BIND):
            return False
        return self.role is not Role.PLUGIN or self.node == node

    def check_node(self, node: str) -> None:
        """A plugin reads a node's own view (its change feed) for its own node only: the devices
        of another node are that node's business, as its attaches are."""
        if self.role is Role.PLUGIN and self.node != node:
            raise PermissionDenied(
                f"{self.user} is the plugin of node {self.node} and may follow only its own node's "
                f"changes, not node {node}'s",
                node=node,
            )

    def check_bind(self, node: str) -> None:
        if self.may_bind_for(node):
            return
        if self.role is Role.PLUGIN:
            raise PermissionDenied(
                f"{self.user} is the plugin of node {self.node} and may attach or detach only for it, "
                f"not for node {node}",
                node=node,
            )
        raise PermissionDenied(
            f"{self.user} has read access only ({self.role} role); attach and detach need "
            "the plugin or controller role",
            node=node,
        )


class Authenticator(ABC):
    @abstractmethod
    async def authenticate(self, token: str, client: str | None = None) -> Identity | None:
        """The identity behind ``token``, or None when this authenticator does not know it;
        ``client`` is the caller's address."""


ANONYMOUS = Identity(Role.CONTROLLER, "anonymous (--insecure-no-auth)", unrestricted=True)


class AllowAll(Authenticator):
    """``--insecure-no-auth``: every caller is a controller, with or without a token. Development only."""

    async def authenticate(self, token: str, client: str | None = None) -> Identity | None:
        return ANONYMOUS


class _StaticEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=16, description="the bearer token (at least 16 characters)")
    role: Role
    node: str | None = Field(default=None, description="required for the plugin role")
    user: str | None = None

    @field_validator("token")
    @classmethod
    def _bearer_token(cls, token: str) -> str:
        # A token no client can put in an Authorization header would only ever be refused.
        try:
            if bearer_token(token, "the token") == token:
                return token
        except TokenError as err:
            raise ValueError(str(err)) from None
        raise ValueError("the token has white space around it")

    @model_validator(mode="after")
    def _node_for_plugins(self) -> _StaticEntry:
        if self.role is Role.PLUGIN and not self.node:
            raise ValueError("a plugin token needs the node it may attach for")
        if self.role is not Role.PLUGIN and self.node:
            raise ValueError("only plugin tokens are bound to a node")
        return self


class _StaticFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[_StaticEntry]


def load_static_tokens(path: Path) -> list[_StaticEntry]:
    """The ``--static-tokens`` file (YAML or JSON): ``tokens: [{token, role, node?, user?}]``; each
    token one RFC 6750 bearer token of at least 16 characters."""
    try:
        raw = yaml.safe_load(path.read_text())
        parsed = _StaticFile.model_validate(raw)
    except OSError as err:
        raise ConfigError(f"cannot read static tokens {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise ConfigError(f"static tokens {path} is not YAML/JSON") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"static tokens {path}: {where}: {first['msg']}") from None
    return parsed.tokens


class StaticTokens(Authenticator):
    def __init__(self, entries: Sequence[_StaticEntry]) -> None:
        self._entries = [(e.token.encode(), e) for e in entries]

    async def authenticate(self, token: str, client: str | None = None) -> Identity | None:
        given = token.encode()
        found: _StaticEntry | None = None
        for secret, entry in self._entries:
            if hmac.compare_digest(secret, given):  # keep comparing: constant time over the file
                found = entry
        if found is None:
            return None
        user = found.user or (f"plugin of {found.node}" if found.node else f"static {found.role}")
        return Identity(found.role, user, found.node)


class MetricsTokenFile(Authenticator):
    """``--metrics-token-file``: the token of the ``metrics`` role in a file — a mounted Secret that
    the scraper's configuration names too — looked at again at most once a second and read again
    when it changed (a Secret volume is updated in place). A file that is missing (an optional
    Secret not created yet) or holds no bearer token gives no token; why is logged once per change,
    never the content."""

    USER = "metrics scraper (--metrics-token-file)"

    def __init__(self, path: Path, *, recheck_seconds: float = 1.0) -> None:
        self.path = path
        self.recheck_seconds = recheck_seconds
        self._checked_at = -recheck_seconds
        self._seen: tuple[int, int, int] | None = None
        self._secret: bytes | None = None
        self._problem: str | None = ""

    def _current(self) -> bytes | None:
        now = time.monotonic()
        if now - self._checked_at < self.recheck_seconds:
            return self._secret
        self._checked_at = now
        try:
            st = self.path.stat()
            seen: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            seen = None
        if seen is not None and seen == self._seen:
            return self._secret
        self._seen = seen
        problem: str | None = None
        try:
            self._secret = read_token_file(self.path).encode()
        except TokenError as err:
            self._secret, problem = None, str(err)
        if problem != self._problem:
            if problem is None:
                log.info("metrics token read", file=str(self.path))
            else:
                log.warning(
                    "no metrics token: /metrics is for operators only until it is fixed", reason=problem
                )
            self._problem = problem
        return self._secret

    async def authenticate(self, token: str, client: str | None = None) -> Identity | None:
        secret = self._current()
        if secret is not None and hmac.compare_digest(secret, token.encode()):
            return Identity(Role.METRICS, self.USER)
        return None


class ReviewBudget:
    """A token bucket per client address: ``burst`` reviews at once, then ``rate`` per second.

    The table is bounded: beyond ``max_clients`` addresses, the full buckets (clients that have not
    asked for a while) are forgotten, and if none is full, the table starts afresh.
    """

    def __init__(self, rate: float = 5.0, burst: float = 20.0, max_clients: int = 10_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # address → (tokens, when)

    def take(self, client: str | None) -> None:
        """Spend one review for ``client``; raises :class:`TooManyRequests` when it has none left."""
        key = client or "unknown"
        now = time.monotonic()
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.rate
            raise TooManyRequests(
                f"too many token reviews from {key}: at most {self.rate:g} per second; retry later",
                retry_after=wait,
            )
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > self.max_clients:
            self._buckets = {
                k: (t, w)
                for k, (t, w) in self._buckets.items()
                if min(self.burst, t + (now - w) * self.rate) < self.burst
            }
            if len(self._buckets) > self.max_clients:
                self._buckets = {key: self._buckets[key]}


@dataclass(frozen=True, slots=True)
class _Review:
    until: float
    identity: Identity | None
    #: why an authenticated user was refused (PermissionDenied), remembered as the answer
    denied: str | None = None


class TokenReviewAuthenticator(Authenticator):
    def __init__(
        self,
        kube: KubeClient,
        *,
        plugin_accounts: Iterable[str],
        controller_accounts: Iterable[str],
        operator_groups: Iterable[str] = (),
        operator_users: Iterable[str] = (),
        audiences: Sequence[str] = (),
        cache_seconds: float = 30.0,
        budget: ReviewBudget | None = None,
    ) -> None:
        self.kube = kube
        self.plugin_users = {_service_account_user(a) for a in plugin_accounts}
        self.controller_users = {_service_account_user(a) for a in controller_accounts}
        self.operator_groups = set(operator_groups)
        self.operator_users = set(operator_users)
        self.audiences = list(audiences)
        self.cache_seconds = cache_seconds
        self.budget = budget or ReviewBudget()
        self._cache: dict[str, _Review] = {}
        self._pending: dict[str, asyncio.Future[_Review]] = {}

    async def authenticate(self, token: str, client: str | None = None) -> Identity | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is None or cached.until <= time.monotonic():
            pending = self._pending.get(key)
            if pending is None:
                # One review per token at a time: callers presenting it meanwhile share the answer.
                self.budget.take(client)
                pending = self._pending[key] = asyncio.ensure_future(self._remember(key, token))
                pending.add_done_callback(lambda _: self._pending.pop(key, None))
            cached = await asyncio.shield(pending)
        if cached.denied is not None:
            raise PermissionDenied(cached.denied)
        return cached.identity

    async def _remember(self, key: str, token: str) -> _Review:
        now = time.monotonic()
        negative = now + min(self.cache_seconds, NEGATIVE_CACHE_SECONDS)
        try:
            identity = await self._review(token)
        except PermissionDenied as err:
            review = _Review(negative, None, err.message)
        else:
            review = _Review(now + self.cache_seconds if identity else negative, identity)
        if len(self._cache) > 10_000:
            self._cache = {k: v for k, v in self._cache.items() if v.until > now}
            if len(self._cache) > 10_000:  # refusals go first: they are cheap to ask again
                self._cache = {k: v for k, v in self._cache.items() if v.identity is not None}
        self._cache[key] = review
        return review

    async def _review(self, token: str) -> Identity | None:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        try:
            review = await self.kube.create(TOKEN_REVIEWS, {"metadata": {}, "spec": spec})
        except ApiError as err:
            raise FabricUnavailable(
                f"cannot check the token with the Kubernetes API server (TokenReview): {err.reason}",
                retry_after=2.0,
            ) from None
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        groups = set(user.get("groups") or [])
        extra = user.get("extra") or {}
        if username in self.controller_users:
            return Identity(Role.CONTROLLER, username)
        if username in self.plugin_users:
            nodes = extra.get(NODE_NAME_EXTRA) or []
            node = nodes[0] if isinstance(nodes, list) and nodes else None
            if not node:
                raise PermissionDenied(
                    f"{username} presented a token that is not bound to a pod on a node "
                    f"(no {NODE_NAME_EXTRA}); mount a projected service-account token"
                )
            return Identity(Role.PLUGIN, username, str(node))
        if username in self.operator_users or groups & self.operator_groups:
            return Identity(Role.OPERATOR, username)
        raise PermissionDenied(f"{username} is authenticated but has no fabric-dra role")


class Chain(Authenticator):
    """The first authenticator that knows the token decides."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.authenticators = list(authenticators)

    async def authenticate(self, token: str, client: str | None = None) -> Identity | None:
        for authenticator in self.authenticators:
            identity = await authenticator.authenticate(token, client)
            if identity is not None:
                return identity
        return None

    async def require(self, authorization: str | None, *, client: str | None = None) -> Identity:
        if any(isinstance(a, AllowAll) for a in self.authenticators):
            return ANONYMOUS
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Unauthenticated(
                "missing bearer token: send 'Authorization: Bearer <service-account token>'"
            )
        token = authorization[7:].strip()
        if not token:
            raise Unauthenticated("empty bearer token")
        identity = await self.authenticate(token, client)
        if identity is None:
            raise Unauthenticated("the bearer token is not valid (unknown, expired or revoked)")
        return identity


def _service_account_user(account: str) -> str:
    """``namespace:name`` (or ``namespace/name``) → ``system:serviceaccount:namespace:name``."""
    if account.startswith("system:serviceaccount:"):
        return account
    namespace, _, name = account.replace("/", ":").partition(":")
    if not namespace or not name:
        raise ConfigError(f"service account {account!r} is not NAMESPACE:NAME")
    return f"system:serviceaccount:{namespace}:{name}"
