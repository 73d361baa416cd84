"""Test hooks of the API test server: injected failures and per-resource request counts.

Both are driven over HTTP under ``/testing/v1/`` (see docs/testing.md), so a test talks to
the server process the same way the code under test does.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.status import StatusError, bad_request
from kube_standin.apiserver.store import Store
from plumbing.logs import get_logger

__all__ = [
    "TESTING_PREFIX",
    "WRITE_VERBS",
    "FaultInjector",
    "FaultRule",
    "RequestCounter",
    "TestHookEndpoints",
]

TESTING_PREFIX = "/testing/v1"

log = get_logger(__name__)

Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
WRITE_VERBS: frozenset[str] = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class FaultRule(BaseModel):
    """Answer the next ``count`` matching requests with an error (and/or after a delay)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    resource: str = Field(description="plural resource name, e.g. resourceslices; '*' for any")
    group: str | None = Field(default=None, description="API group; omitted matches any group")
    verbs: list[str] = Field(
        default_factory=lambda: ["write"],
        description="verbs to fail; 'write' = create, update, patch, delete, deletecollection; '*' = all",
    )
    subresource: str | None = Field(default=None, description="'' for the main resource only, 'status', ...")
    namespace: str | None = None
    name: str | None = None
    count: int = Field(default=1, ge=1)
    #: with a code below 400 only the delay applies, then the request proceeds normally.
    code: int = Field(default=500, ge=100, le=599)
    reason: str | None = None
    message: str | None = None
    delay_seconds: float = Field(default=0.0, ge=0.0, le=600.0, alias="delaySeconds")
    retry_after_seconds: int | None = Field(default=None, ge=0, alias="retryAfterSeconds")
    #: set by the server when the rule is armed (ignored in requests).
    id: int = 0
    remaining: int = 0

    def matches(self, info: RequestInfo) -> bool:
        if self.resource not in ("*", info.resource):
            return False
        if self.group is not None and self.group != info.group:
            return False
        # '' in a rule means "none": the main resource, or a cluster-scoped object.
        if self.subresource is not None and self.subresource != (info.subresource or ""):
            return False
        if self.namespace is not None and self.namespace != (info.namespace or ""):
            return False
        if self.name is not None and self.name != (info.name or ""):
            return False
        verbs = set(self.verbs)
        if "*" in verbs:
            return True
        if "write" in verbs and info.verb in WRITE_VERBS:
            return True
        return info.verb in verbs

    @property
    def default_reason(self) -> str:
        return self.reason or {
            409: "Conflict",
            429: "TooManyRequests",
            500: "InternalError",
            503: "ServiceUnavailable",
            504: "Timeout",
            403: "Forbidden",
            404: "NotFound",
        }.get(self.code, "InternalError")


class FaultInjector:
    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)

    def add(self, rule: FaultRule) -> FaultRule:
        armed = rule.model_copy(update={"id": next(self._ids), "remaining": rule.count})
        self._rules.append(armed)
        return armed

    def rules(self) -> list[FaultRule]:
        return list(self._rules)

    def clear(self) -> int:
        count = len(self._rules)
        self._rules.clear()
        return count

    def take(self, info: RequestInfo) -> FaultRule | None:
        """The first armed rule matching ``info``, consuming one of its shots."""
        for rule in self._rules:
            if rule.matches(info):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._rules.remove(rule)
                return rule
        return None


class RequestCounter:
    """Requests received per ``group/resource[/subresource]`` and verb, whatever their outcome,
    plus changes actually committed per storage key."""

    def __init__(self) -> None:
        self.requests: dict[str, Counter[str]] = {}
        self.changes: Counter[str] = Counter()

    def count(self, info: RequestInfo, *, dry_run: bool = False) -> None:
        """Count one request; a dry run is counted as ``<verb> (dryRun)``, not as a write: it
        changes nothing, and "no write on an unchanged resync" must not count a feature probe."""
        verb = f"{info.verb} (dryRun)" if dry_run else info.verb
        self.requests.setdefault(info.resource_key, Counter())[verb] += 1

    def snapshot(self) -> dict[str, Any]:
        writes = {
            key: sum(n for verb, n in verbs.items() if verb in WRITE_VERBS)
            for key, verbs in self.requests.items()
        }
        return {
            "requests": {key: dict(verbs) for key, verbs in sorted(self.requests.items())},
            "writes": {key: n for key, n in sorted(writes.items()) if n},
            "changes": dict(sorted(self.changes.items())),
        }

    def reset(self) -> None:
        self.requests.clear()
        self.changes.clear()


class TestHookEndpoints:
    """The HTTP side of the hooks, under ``/testing/v1/`` (no authentication)."""

    __test__ = False  # not a pytest test class

    def __init__(self, faults: FaultInjector, counter: RequestCounter, store: Store) -> None:
        self.faults = faults
        self.counter = counter
        self.store = store

    async def handle(self, request: Request, path: str) -> Response:
        method = request.method
        if path == "requests":
            if method == "GET":
                return json_response(self.counter.snapshot())
            if method == "DELETE":
                self.counter.reset()
                return json_response({"reset": True})
        elif path == "faults":
            if method == "GET":
                return json_response({"faults": [r.model_dump(by_alias=True) for r in self.faults.rules()]})
            if method == "POST":
                try:
                    rule = FaultRule.model_validate_json(await request.body())
                except ValueError as err:
                    raise bad_request(f"invalid fault rule: {err}") from err
                armed = self.faults.add(rule)
                log.info(
                    "fault armed", resource=rule.resource, verbs=rule.verbs, count=rule.count, code=rule.code
                )
                return json_response(armed.model_dump(by_alias=True), 201)
            if method == "DELETE":
                return json_response({"cleared": self.faults.clear()})
        elif path == "compact" and method == "POST":
            raw = await request.body()
            target_rv = None
            if raw.strip():
                try:
                    target_rv = json.loads(raw).get("resourceVersion")
                except (ValueError, AttributeError) as err:
                    raise bad_request(f"invalid compact request: {err}") from err
            compacted = self.store.compact(int(target_rv) if target_rv is not None else None)
            return json_response(
                {"compactedResourceVersion": str(compacted), "resourceVersion": str(self.store.rv)}
            )
        elif path == "close-watches" and method == "POST":
            return json_response({"closed": self.store.close_watchers()})
        raise StatusError(404, "NotFound", f"no test hook {method} {TESTING_PREFIX}/{path}")
