"""JSON responses in the API server's wire format (compact JSON, ``application/json``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from kube_standin.apiserver.status import StatusError

__all__ = ["json_line", "json_response", "status_response"]


def json_line(body: Any) -> bytes:
    """One watch event: compact JSON and a newline."""
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":")),
        status_code=status,
        media_type="application/json",
        headers=dict(headers or {}),
    )


def status_response(err: StatusError, headers: Mapping[str, str] | None = None) -> Response:
    return json_response(err.to_status(), err.code, headers)
