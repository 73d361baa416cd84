"""The manager's own path for the calls of every claim (:mod:`fabric.api.claim_calls`) is the same
API as FastAPI's routes: the same requests, sent through the app with it and through the app
without it, get the same answers — status, body and headers — whether they are served, refused by
the caller's rights or the binder, or malformed (those it hands to FastAPI). And it does serve the
well-formed ones itself: a request FastAPI answered instead would pass the comparison unnoticed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from fabric.api.app import build_app
from fabric.api.auth import Chain, Role, StaticTokens, _StaticEntry
from fabric.api.claim_calls import ClaimCalls
from fabric.api.context import AppContext
from fabric.state.metrics import ManagerMetrics
from fabric.state.operation_log import OperationLog
from fabric.state.reports import PluginReports
from tests.support.uids import claim_uid
from tests.unit.fabric.fakes import Harness, make_harness

TOKENS = {
    "controller": "controller-token-0123456789",
    "plugin": "plugin-token-node-0-0123456789",
    "operator": "operator-token-0123456789",
}
CLAIM = claim_uid("claim-calls")
#: answers differ in these only: when, and the connection
_VOLATILE_HEADERS = {"date", "connection"}


@dataclass
class Apps:
    harness: Harness
    ctx: AppContext
    with_path: FastAPI
    without: FastAPI
    #: requests ClaimCalls handed on to FastAPI
    handed_on: list[str]


def _entries() -> list[_StaticEntry]:
    return [
        _StaticEntry(token=TOKENS["controller"], role=Role.CONTROLLER),
        _StaticEntry(token=TOKENS["plugin"], role=Role.PLUGIN, node="node-0"),
        _StaticEntry(token=TOKENS["operator"], role=Role.OPERATOR),
    ]


@pytest.fixture
async def apps(tmp_path: Path) -> Apps:
    h = await make_harness(tmp_path, hosts=2, devices=3)
    ctx = AppContext(
        inventory=h.inventory,
        attachments=h.attachments,
        operations=OperationLog(),
        reports=PluginReports(ttl=60.0),
        auth=Chain([StaticTokens(_entries())]),
        metrics=ManagerMetrics(),
        is_leader=lambda: h.leader[0],
        not_ready=lambda: None,
    )
    with_path = build_app(ctx)
    without = build_app(ctx)
    without.user_middleware = [m for m in without.user_middleware if m.cls is not ClaimCalls]  # type: ignore[comparison-overlap]
    assert len(without.user_middleware) == len(with_path.user_middleware) - 1
    handed_on: list[str] = []
    await _send(with_path, "GET", "/healthz", "operator")  # builds the middleware stack
    _count_handed_on(with_path, handed_on)
    return Apps(h, ctx, with_path, without, handed_on)


def _count_handed_on(app: FastAPI, handed_on: list[str]) -> None:
    """Wrap what the app's ClaimCalls hands requests on to, noting each request it hands on."""
    layer: Any = app.middleware_stack
    while not isinstance(layer, ClaimCalls):
        layer = layer.app  # each Starlette middleware keeps the next as ``app``
    inner: Callable[..., Awaitable[None]] = layer.app

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        handed_on.append(f"{scope['method']} {scope['path']}?{scope['query_string'].decode()}")
        await inner(scope, receive, send)

    layer.app = counted


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: Any


async def _send(
    app: FastAPI,
    method: str,
    path: str,
    role: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as client:
        sent = {"Authorization": f"Bearer {TOKENS[role]}", **(headers or {})}
        if body is not None and not any(k.lower() == "content-type" for k in sent):
            sent["Content-Type"] = "application/json"
        response = await client.request(method, path, content=body, headers=sent)
    kept = tuple(sorted((k, v) for k, v in response.headers.items() if k not in _VOLATILE_HEADERS))
    try:
        parsed: Any = response.json()
    except ValueError:
        parsed = response.text
    return Answer(response.status_code, kept, parsed)


def _attach_body(device: str = "gpu0", node: str = "node-0", **more: Any) -> bytes:
    return json.dumps({"device": device, "node": node, "claimUid": CLAIM, **more}).encode()


def _detach_path(device: str = "gpu0", query: str | None = None) -> str:
    return f"/api/v1/attachments/{device}?" + (
        query if query is not None else f"claimUid={CLAIM}&node=node-0"
    )


def _changes_path(apps: Apps, query: str = "") -> str:
    inventory = apps.harness.inventory
    inventory.flush()
    return (
        f"/api/v1/inventory/changes?epoch={inventory.history.epoch}&since={inventory.version}"
        f"&timeoutSeconds=0{query}"
    )


async def _both(apps: Apps, method: str, path: str, role: str, **kw: Any) -> tuple[Answer, Answer]:
    return (
        await _send(apps.with_path, method, path, role, **kw),
        await _send(apps.without, method, path, role, **kw),
    )


async def test_well_formed_calls_are_served_by_the_path_and_answered_as_the_routes_answer(apps: Apps) -> None:
    # attach (then again, idempotent, through FastAPI): the same attachment, done
    served, routed = await _both(
        apps, "POST", "/api/v1/attachments?waitSeconds=5", "plugin", body=_attach_body()
    )
    assert served.status == 200 and served.body["state"] == "attached", served
    assert served == routed
    changes = _changes_path(apps, "&node=node-0")
    served, routed = await _both(apps, "GET", changes, "plugin")
    assert served.status == 200 and served.body["node"] == "node-0"
    assert served == routed
    # detach, a change each time: through the path, then (attached again) through FastAPI
    detach = _detach_path(query=f"claimUid={CLAIM}&node=node-0&waitSeconds=5")
    served = await _send(apps.with_path, "DELETE", detach, "plugin")
    again = await _send(
        apps.with_path, "POST", "/api/v1/attachments?waitSeconds=5", "plugin", body=_attach_body()
    )
    assert again.status == 200 and again.body["state"] == "attached", again
    routed = await _send(apps.without, "DELETE", detach, "plugin")
    assert served.status == 200 and served.body["state"] == "detached", served
    # two detaches, two operations: the same answer but for the operation's id
    assert served.body.pop("operationId").startswith("op-")
    assert routed.body.pop("operationId").startswith("op-")
    assert served == routed
    assert apps.handed_on == []
    assert apps.harness.fabric.bound == {}


@pytest.mark.parametrize(
    ("method", "what", "role", "body"),
    [
        ("POST", "attach for another node, as a node's plugin", "plugin", _attach_body(node="node-1")),
        ("POST", "attach as an operator (read-only)", "operator", _attach_body()),
        ("POST", "attach of a device the fabric does not have", "controller", _attach_body(device="gpu9")),
        ("DELETE", "detach for another node, as a node's plugin", "plugin", None),
        ("GET", "another node's changes, as a node's plugin", "plugin", None),
    ],
    ids=[
        "attach-other-node",
        "attach-operator",
        "attach-unknown-device",
        "detach-other-node",
        "changes-other-node",
    ],
)
async def test_calls_the_rights_or_the_binder_refuse_get_the_routes_refusal(
    apps: Apps, method: str, what: str, role: str, body: bytes | None
) -> None:
    path = {
        "POST": "/api/v1/attachments",
        "DELETE": _detach_path(query=f"claimUid={CLAIM}&node=node-1"),
        "GET": _changes_path(apps, "&node=node-1"),
    }[method]
    served, routed = await _both(apps, method, path, role, body=body)
    assert served.status in (403, 404), (what, served)
    assert served == routed, what
    assert apps.handed_on == [], f"{what}: refused by FastAPI, not by the path"


async def test_a_cursor_the_history_no_longer_holds_is_refused_alike(apps: Apps) -> None:
    path = "/api/v1/inventory/changes?epoch=999&since=0&timeoutSeconds=0"
    served, routed = await _both(apps, "GET", path, "controller")
    assert served.status == 410 and served.body["code"] == "ResyncRequired", served
    assert served == routed
    assert apps.handed_on == []


ATTACH = "/api/v1/attachments"
HANDED_ON = [
    # (what, method, path, body, headers, FastAPI's status)
    ("negative wait", "POST", f"{ATTACH}?waitSeconds=-1", _attach_body(), None, 422),
    ("wait not a number", "POST", f"{ATTACH}?waitSeconds=soon", _attach_body(), None, 422),
    ("wait empty", "POST", f"{ATTACH}?waitSeconds=", _attach_body(), None, 422),
    ("wait NaN", "POST", f"{ATTACH}?waitSeconds=nan", _attach_body(), None, 422),
    ("wait infinite", "POST", f"{ATTACH}?waitSeconds=inf", _attach_body(), None, 422),
    ("wait past the cap", "POST", f"{ATTACH}?waitSeconds=41", _attach_body(), None, 422),
    ("wait twice", "POST", f"{ATTACH}?waitSeconds=1&waitSeconds=-1", _attach_body(), None, 422),
    ("body not JSON", "POST", ATTACH, b"{device: gpu0", None, 422),
    ("body not UTF-8", "POST", ATTACH, b'{"device": "\xff"}', None, 422),
    ("body a list", "POST", ATTACH, b"[]", None, 422),
    ("body null", "POST", ATTACH, b"null", None, 422),
    ("body empty", "POST", ATTACH, b"", None, 422),
    ("body missing the claim", "POST", ATTACH, b'{"device": "gpu0", "node": "node-0"}', None, 422),
    ("body with a field not in the contract", "POST", ATTACH, _attach_body(colour="blue"), None, 422),
    ("device not a DNS label", "POST", ATTACH, _attach_body(device="GPU_0"), None, 422),
    (
        "share without its size",
        "POST",
        ATTACH,
        _attach_body(shareId="0b6f8a2e-1d2c-4c1e-9d7e-2a4b5c6d7e8f"),
        None,
        422,
    ),
    ("body NaN", "POST", ATTACH, b'{"device": "gpu0", "node": "node-0", "claimUid": NaN}', None, 422),
    ("text body", "POST", ATTACH, _attach_body(), {"Content-Type": "text/plain"}, 422),
    (
        "JSON with a charset",
        "POST",
        f"{ATTACH}?waitSeconds=0",
        _attach_body(device="gpu2"),
        {"Content-Type": "application/json; charset=utf-8"},
        202,
    ),
    ("device path not a DNS label", "DELETE", _detach_path(device="GPU0"), None, None, 422),
    ("device path two segments", "DELETE", _detach_path(device="gpu0/x"), None, None, 404),
    ("trailing slash", "DELETE", "/api/v1/attachments/?claimUid=x", None, None, 307),
    ("detach without the claim", "DELETE", _detach_path(query="node=node-0"), None, None, 422),
    ("detach without the node", "DELETE", _detach_path(query=f"claimUid={CLAIM}"), None, None, 422),
    ("claim not a UID", "DELETE", _detach_path(query="claimUid=claim-a&node=node-0"), None, None, 422),
    (
        "node not a DNS subdomain",
        "DELETE",
        _detach_path(query=f"claimUid={CLAIM}&node=Node_0"),
        None,
        None,
        422,
    ),
    (
        "share not a UUID",
        "DELETE",
        _detach_path(query=f"claimUid={CLAIM}&node=node-0&shareId=x"),
        None,
        None,
        422,
    ),
    (
        "node twice",
        "DELETE",
        _detach_path(query=f"claimUid={CLAIM}&node=node-0&node=node-1"),
        None,
        None,
        200,
    ),
    ("changes without an epoch", "GET", "/api/v1/inventory/changes?since=0", None, None, 422),
    ("changes since a fraction", "GET", "/api/v1/inventory/changes?epoch=1&since=1.5", None, None, 422),
    (
        "changes waiting too long",
        "GET",
        "/api/v1/inventory/changes?epoch=1&since=0&timeoutSeconds=301",
        None,
        None,
        422,
    ),
    ("changes of a bad node", "GET", "/api/v1/inventory/changes?epoch=1&since=0&node=-x", None, None, 422),
    ("attach by GET", "GET", ATTACH, None, None, 405),
    ("changes by POST", "POST", "/api/v1/inventory/changes?epoch=1&since=0", b"{}", None, 405),
]


@pytest.mark.parametrize(
    ("what", "method", "path", "body", "headers", "status"), HANDED_ON, ids=[m[0] for m in HANDED_ON]
)
async def test_what_the_path_does_not_serve_is_handed_to_fastapi(
    apps: Apps,
    what: str,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str] | None,
    status: int,
) -> None:
    """Malformed requests (422 from FastAPI: the same body naming the field), and the few FastAPI
    accepts that the path leaves to it rather than settle them itself (a parameter given twice, a
    charset on the JSON type, a trailing slash's redirect)."""
    served, routed = await _both(apps, method, path, "controller", body=body, headers=headers)
    assert served.status == status, (what, served)
    assert served == routed, what
    assert len(apps.handed_on) == 1, f"{what}: answered by the path itself"
    if status == 422:
        assert served.body["code"] == "InvalidRequest", served
        assert apps.harness.fabric.bound == {}


async def test_a_follower_leaves_every_call_to_fastapi(apps: Apps) -> None:
    apps.harness.leader[0] = False
    served, routed = await _both(apps, "POST", ATTACH, "controller", body=_attach_body())
    assert served.status == 503 and served.body["code"] == "NotLeader", served
    assert served == routed
    assert len(apps.handed_on) == 1
