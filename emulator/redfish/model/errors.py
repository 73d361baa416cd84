"""The error a Redfish request fails with, and the one place the fabric's errors become one.

:class:`RedfishError` carries an HTTP status and Redfish ``@Message.ExtendedInfo`` messages
(DSP0266 "Error responses"); the HTTP side (request parsing, the resource tree, the views)
raises it directly. The engine raises :class:`~emulator.errors.FabricError`\\ s instead, in the
fabric's own words; :func:`redfish_error` maps each to its Base registry MessageId and status,
for the HTTP answer and for a task's recorded result alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emulator.errors import (
    ChunkSizeRefused,
    DomainExhausted,
    EmulatorError,
    FabricError,
    GuestFailed,
    GuestTimedOut,
    InjectedFailure,
    Interrupted,
    PortIsDown,
    TargetBusy,
    TaskFinished,
    UnknownName,
)
from emulator.redfish.model.registries import message

__all__ = ["STATUS_OF_MESSAGE", "RedfishError", "error_body", "redfish_error"]

#: HTTP status of a Base MessageId a fault injects without naming a status; 400 for the others.
STATUS_OF_MESSAGE = {
    "ResourceInUse": 409,
    "ResourceExhaustion": 409,
    "ConditionInRelatedResource": 409,
    "PreconditionFailed": 412,
    "NoValidSession": 401,
    "InsufficientPrivilege": 403,
    "OperationNotAllowed": 405,
    "ResourceCannotBeDeleted": 405,
    "OperationTimeout": 504,
    "ServiceShuttingDown": 503,
    "InternalError": 500,
    "GeneralError": 500,
    "OperationFailed": 500,
}


@dataclass
class RedfishError(EmulatorError):
    """A request that fails with ``status`` and Redfish ``@Message.ExtendedInfo`` messages."""

    status: int
    messages: list[dict[str, Any]]
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.summary)

    @property
    def message_id(self) -> str:
        return str(self.messages[0]["MessageId"]) if self.messages else "Base.1.22.GeneralError"

    @property
    def summary(self) -> str:
        return "; ".join(str(m["Message"]) for m in self.messages) or "error"

    @classmethod
    def of(
        cls,
        status: int,
        key: str,
        *args: object,
        prefix: str = "Base",
        related: list[str] | None = None,
        detail: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> RedfishError:
        return cls(
            status, [message(key, *args, prefix=prefix, related=related, detail=detail)], headers or {}
        )


def error_body(err: RedfishError) -> dict[str, Any]:
    """The Redfish error response body (DSP0266 "Error responses")."""
    return {
        "error": {
            "code": err.message_id,
            "message": err.summary,
            "@Message.ExtendedInfo": err.messages,
        }
    }


def redfish_error(err: FabricError) -> RedfishError:
    """What ``err`` answers over Redfish: its Base MessageId, with the status it comes with."""
    detail = err.detail
    if isinstance(err, TargetBusy | TaskFinished):
        return RedfishError.of(409, "ResourceInUse", detail=detail)
    if isinstance(err, PortIsDown):
        return RedfishError.of(409, "ConditionInRelatedResource", detail=detail)
    if isinstance(err, UnknownName):
        return RedfishError.of(400, "PropertyValueNotInList", err.name, err.prop, detail=detail)
    if isinstance(err, InjectedFailure):
        status = err.status or STATUS_OF_MESSAGE.get(err.message_key, 400)
        return RedfishError.of(status, err.message_key, detail=detail)
    if isinstance(err, GuestTimedOut):
        return RedfishError.of(504, "OperationTimeout", detail=detail)
    if isinstance(err, GuestFailed):
        return RedfishError.of(500, "OperationFailed", detail=detail)
    if isinstance(err, Interrupted):
        return RedfishError.of(503, "ServiceShuttingDown", detail=detail)
    if isinstance(err, ChunkSizeRefused):
        # Base 1.22.1: PropertyValueIncorrect's arguments are (property, value), the other way
        # round from PropertyValueOutOfRange's (value, property)
        prop, related = "MemoryChunkSizeMiB", ["/MemoryChunkSizeMiB"]
        if err.misaligned:
            return RedfishError.of(
                400, "PropertyValueIncorrect", prop, err.size_mib, related=related, detail=detail
            )
        return RedfishError.of(
            400, "PropertyValueOutOfRange", err.size_mib, prop, related=related, detail=detail
        )
    if isinstance(err, DomainExhausted):
        # DSP0266 maps neither to a status; 409 Conflict: the request is sound, the domain's
        # present state cannot take it (another chunk's release may make room)
        if err.limit:
            return RedfishError.of(409, "CreateLimitReachedForResource", detail=detail)
        return RedfishError.of(409, "ResourceExhaustion", err.domain, detail=detail)
    return RedfishError.of(500, "OperationFailed", detail=detail)
