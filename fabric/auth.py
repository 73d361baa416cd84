"""Who may call the manager, and for which node.

Roles:

* ``plugin`` — a node's kubelet plugin: reads the inventory, attaches and detaches *for its own
  node only* (403 otherwise);
* ``controller`` — the binding-condition controller / slice publisher: reads, and attaches and
  detaches for any node;
* ``operator`` — people and tools: read only (``fabric-dra status``).

In a cluster a caller presents its service-account token and the manager asks the API server
(``authentication.k8s.io/v1`` TokenReview). A projected (bound) token of a pod carries the pod's
node in ``status.user.extra["authentication.kubernetes.io/node-name"]``; the plugin's node comes
from there, never from the request. Which service accounts are plugins or controllers, and which
groups are operators, is configuration. For local runs a static token file maps tokens to roles.
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from manager_api.errors import FabricUnavailable, PermissionDenied, TooManyRequests, Unauthenticated
from plumbing.kube.client import ApiError, KubeClient
from plumbing.kube.resources import TOKEN_REVIEWS
from plumbing.logs import get_logger

__all__ = [
    "NEGATIVE_CACHE_SECONDS",
    "NODE_NAME_EXTRA",
    "AllowAll",
    "Authenticator",
    "Chain",
    "Identity",
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


@dataclass(frozen=True, slots=True)
class Identity:
    role: Role
    user: str
    node: str | None = None  # plugins only

    def may_bind_for(self, node: str) -> bool:
        if self.role is Role.CONTROLLER:
            return True
        return self.role is Role.PLUGIN and self.node == node

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


ANONYMOUS = Identity(Role.CONTROLLER, "anonymous (--insecure-no-auth)")


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
    """The ``--static-tokens`` file (YAML or JSON): ``tokens: [{token, role, node?, user?}]``."""
    try:
        raw = yaml.safe_load(path.read_text())
        parsed = _StaticFile.model_validate(raw)
    except OSError as err:
        raise ValueError(f"cannot read static tokens {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise ValueError(f"static tokens {path} is not YAML/JSON") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"static tokens {path}: {where}: {first['msg']}") from None
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
        raise ValueError(f"service account {account!r} is not NAMESPACE:NAME")
    return f"system:serviceaccount:{namespace}:{name}"
