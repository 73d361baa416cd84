"""Requests, replies and request-body validation with Redfish error messages.

Bodies are validated by pydantic models; each validation problem becomes one Base-registry
message naming the property (PropertyUnknown, PropertyMissing, PropertyValueTypeError,
PropertyValueNotInList — or their ``ActionParameter*`` forms for action parameters), all in
one 400 response, as DSP0266 asks ("Error responses": one message per problem).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.registries import message

__all__ = ["Reply", "Request", "parse_body"]

M = TypeVar("M", bound=BaseModel)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    client: str | None = None
    username: str | None = None
    session_id: str | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def text(self) -> str:
        """The body as text (a task's ``Payload.JsonBody`` records it), undecodable bytes replaced."""
        return self.body.decode("utf-8", "replace")

    @property
    def prefers_async(self) -> bool:
        """``Prefer: respond-async`` (RFC 7240), which DSP0266 lets a client use to ask for a task."""
        return "respond-async" in (self.header("prefer") or "").lower()

    def json(self) -> Any:
        if not self.body.strip():
            raise RedfishError.of(400, "MalformedJSON", detail="The request has no body; send a JSON object.")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            # ValueError beyond JSONDecodeError: a number of more digits than Python converts;
            # RecursionError: arrays nested deeper than the parser goes
            raise RedfishError.of(
                400, "MalformedJSON", detail=f"The request body is not valid JSON: {str(err)[:200]}."
            ) from None


@dataclass
class Reply:
    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: an already serialised body (cached resource payloads, ``$metadata``)
    raw: bytes | None = None
    content_type: str | None = None


def _prop_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
        else:
            parts.append(part)
    return "/".join(parts)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_body(model: type[M], data: Any, *, action: str | None = None) -> M:
    """Validate ``data`` into ``model``; raise a 400 with one message per problem.

    ``action`` (e.g. ``Zone.AddEndpoint``) selects the ActionParameter* messages. Properties
    starting with ``@`` (OData/Redfish annotations a client may echo back) are ignored.
    """
    if not isinstance(data, dict):
        raise RedfishError.of(400, "MalformedJSON", detail="The request body must be a JSON object.")
    data = {k: v for k, v in data.items() if not k.startswith("@")}
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RedfishError(400, [_problem(e, action) for e in err.errors(include_url=False)]) from None


def _problem(e: ErrorDetails, action: str | None) -> dict[str, Any]:
    """The Base message for one validation problem: a property's, or an action parameter's."""
    prop = _prop_path(e["loc"])
    pointer = "/" + prop
    kind = e["type"]
    value = e.get("input")
    if kind == "extra_forbidden":
        if action:
            return message("ActionParameterUnknown", action, prop, related=[pointer])
        return message("PropertyUnknown", prop, related=[pointer])
    if kind == "missing":
        if action:
            return message("ActionParameterMissing", action, prop, related=[pointer])
        return message("PropertyMissing", prop, related=[pointer])
    if kind in ("literal_error", "enum"):
        if action:
            return message("ActionParameterValueNotInList", _short(value), prop, action, related=[pointer])
        return message("PropertyValueNotInList", _short(value), prop, related=[pointer])
    if kind.endswith("_type") or kind in ("model_type", "model_attributes_type", "dict_type"):
        if action:
            return message("ActionParameterValueTypeError", _short(value), prop, action, related=[pointer])
        return message("PropertyValueTypeError", _short(value), prop, related=[pointer])
    detail = f"{prop}: {e['msg']}"
    if action:
        return message("ActionParameterValueError", prop, action, related=[pointer], detail=detail)
    return message("PropertyValueFormatError", _short(value), prop, related=[pointer], detail=detail)
