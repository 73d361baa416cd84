"""``meta.k8s.io/v1`` Tables, what ``kubectl get`` asks for (``Accept: ...;as=Table``): the
columns the real server prints for each kind, with ``AGE`` as kubectl shows it; a custom resource's
are its CRD's ``additionalPrinterColumns`` (:mod:`.customresources.printcolumns`)."""

from __future__ import annotations

import time
from calendar import timegm
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kube_standin.apiserver.customresources.printcolumns import printer_columns
from kube_standin.apiserver.registry import ResourceType

__all__ = ["age_of", "human_duration", "table", "wants_table"]

Obj = Mapping[str, Any]
Column = tuple[str, str, Callable[[Obj], Any]]


def wants_table(accept: str) -> bool:
    return any("as=table" in part.replace(" ", "").lower() for part in accept.split(","))


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = (s % 3600) // 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years = hours // (24 * 365)
    if years < 8:
        rest = (hours // 24) % 365
        return f"{years}y{rest}d" if rest else f"{years}y"
    return f"{years}y"


def _age(obj: Obj) -> str:
    return age_of((obj.get("metadata") or {}).get("creationTimestamp"))


def age_of(stamp: Any) -> str:
    """The time since an RFC 3339 timestamp, as kubectl shows ``AGE``."""
    if not stamp:
        return "<unknown>"
    created = timegm(time.strptime(str(stamp)[:19], "%Y-%m-%dT%H:%M:%S"))
    return human_duration(time.time() - created)


def _dig(obj: Obj, *path: str) -> Any:
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _claim_state(obj: Obj) -> str:
    status = obj.get("status") or {}
    states = []
    if status.get("allocation"):
        states.append("allocated")
    if status.get("reservedFor"):
        states.append("reserved")
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        states.append("deleted")
    return ",".join(states) or "pending"


_EXTRA: dict[str, list[Column]] = {
    "ResourceSlice": [
        ("Node", "string", lambda o: _dig(o, "spec", "nodeName") or ""),
        ("Driver", "string", lambda o: _dig(o, "spec", "driver") or ""),
        ("Pool", "string", lambda o: _dig(o, "spec", "pool", "name") or ""),
    ],
    "ResourceClaim": [("State", "string", _claim_state)],
    "Pod": [
        ("Status", "string", lambda o: _dig(o, "status", "phase") or ""),
        ("Node", "string", lambda o: _dig(o, "spec", "nodeName") or "<none>"),
    ],
    "Namespace": [("Status", "string", lambda o: _dig(o, "status", "phase") or "")],
    "Node": [("Status", "string", lambda o: "Ready")],
    "Lease": [("Holder", "string", lambda o: _dig(o, "spec", "holderIdentity") or "")],
    "Deployment": [
        (
            "Ready",
            "string",
            lambda o: f"{_dig(o, 'status', 'readyReplicas') or 0}/{_dig(o, 'spec', 'replicas') or 0}",
        )
    ],
    "ConfigMap": [("Data", "integer", lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}))],
    "Secret": [
        ("Type", "string", lambda o: o.get("type") or ""),
        ("Data", "integer", lambda o: len(o.get("data") or {})),
    ],
}


def _columns(res: ResourceType) -> list[Column]:
    name: Column = ("Name", "string", lambda o: (o.get("metadata") or {}).get("name", ""))
    if res.custom is not None:
        return [name, *printer_columns(res.custom.printer_columns, age_of)]
    age: Column = ("Age", "string", _age)
    return [name, *_EXTRA.get(res.kind, []), age]


def _row(columns: list[Column], obj: Obj, include: str) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": [fn(obj) for _, _, fn in columns]}
    if include == "Object":
        row["object"] = obj
    elif include != "None":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {},
        }
    return row


def table(
    res: ResourceType,
    objects: Sequence[Obj],
    *,
    resource_version: str,
    include: str = "Metadata",
    continue_token: str | None = None,
) -> dict[str, Any]:
    """A Table of ``objects`` (``include``: ``includeObject`` of the request)."""
    columns = _columns(res)
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": 0,
            }
            for name, kind, _ in columns
        ],
        "rows": [_row(columns, obj, include) for obj in objects],
    }
