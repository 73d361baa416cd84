"""Redfish error bodies → :mod:`manager_api.errors`, in one place.

A Redfish service explains a failure with ``@Message.ExtendedInfo``: a list of Message objects whose
``MessageId`` is ``<RegistryPrefix>.<MajorVersion>.<MinorVersion>[.<Errata>].<MessageKey>``
(DSP0266 1.20, "Error responses"; DSP0228 Message schema). Only the prefix and the key carry meaning
for us; the version in between varies between services and releases, so it is dropped before lookup.
Call sites never look at MessageIds or status codes: they catch the classes this module returns.
The two errors only a Redfish conversation has (:class:`PreconditionFailed`, :class:`OutcomeUnknown`)
are declared here too, so that code above the Redfish client catches them without importing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    BindRefused,
    DeviceBusy,
    DeviceNotFound,
    DeviceUnhealthy,
    FabricError,
    FabricUnavailable,
    NotFoundError,
    Unauthenticated,
)
from plumbing.terminal import one_line

__all__ = [
    "OutcomeUnknown",
    "PreconditionFailed",
    "RedfishMessage",
    "error_for_response",
    "error_for_task",
    "message_key",
    "messages_of",
    "one_line",
]


class PreconditionFailed(DeviceBusy):
    """The resource changed between our read and our write (HTTP 412/428 or a stale ETag parameter).

    Nothing was done: the caller re-reads and decides again. On the wire it is a retriable DeviceBusy.
    """


class OutcomeUnknown(FabricUnavailable):
    """A mutation was sent but no answer came back (connection lost, read timeout, task monitor gone).

    The service may or may not have acted on it. Never resend blindly: read the fabric and decide.
    """


RedfishMessage = Mapping[str, Any]

#: (RegistryPrefix, MessageKey) → the error it means for a bind or unbind.
_BY_MESSAGE: dict[tuple[str, str], type[FabricError]] = {
    ("Base", "ResourceInUse"): DeviceBusy,
    ("Base", "ResourceAlreadyExists"): DeviceBusy,
    ("Base", "ResourceCreationConflict"): DeviceBusy,
    ("Base", "ResourceInStandby"): DeviceBusy,
    ("Composition", "ResourceBlockInUse"): DeviceBusy,
    ("Composition", "SpecifiedResourceAlreadyReserved"): DeviceBusy,
    ("Composition", "ConstrainedResourceAlreadyReserved"): DeviceBusy,
    ("Composition", "NoResourceMatch"): DeviceBusy,
    ("Base", "ResourceNotFound"): DeviceNotFound,
    ("Base", "ResourceMissingAtURI"): DeviceNotFound,
    ("Base", "InvalidURI"): NotFoundError,
    ("Composition", "ResourceBlockNotFound"): DeviceNotFound,
    ("Base", "ServiceTemporarilyUnavailable"): FabricUnavailable,
    ("Base", "ServiceShuttingDown"): FabricUnavailable,
    ("Base", "ServiceInUnknownState"): FabricUnavailable,
    ("Base", "CouldNotEstablishConnection"): FabricUnavailable,
    ("Base", "ServiceDisabled"): FabricUnavailable,
    ("Base", "SessionLimitExceeded"): FabricUnavailable,
    ("Base", "OperationTimeout"): AttachTimeout,
    ("Base", "NoValidSession"): Unauthenticated,
    ("Base", "AuthenticationTokenRequired"): Unauthenticated,
    ("Base", "AccessUnauthorized"): Unauthenticated,
    ("Base", "PreconditionFailed"): PreconditionFailed,
    ("Base", "PreconditionRequired"): PreconditionFailed,
    # A parameter or property value the service will never accept for this device and host: what
    # a real switch answers for a device behind a switch that is not cabled to the host.
    ("Base", "ActionParameterValueError"): BindRefused,
    ("Base", "ActionParameterValueNotInList"): BindRefused,
    ("Base", "PropertyValueError"): BindRefused,
    ("Base", "PropertyValueNotInList"): BindRefused,
    ("ResourceEvent", "ResourceStatusChangedCritical"): DeviceUnhealthy,
    ("Composition", "ResourceBlockInvalid"): DeviceUnhealthy,
}

#: When no MessageId is known, the HTTP status decides.
_BY_STATUS: dict[int, type[FabricError]] = {
    401: Unauthenticated,
    404: NotFoundError,
    409: DeviceBusy,
    412: PreconditionFailed,
    428: PreconditionFailed,
    429: FabricUnavailable,
    502: FabricUnavailable,
    503: FabricUnavailable,
    504: FabricUnavailable,
}

#: Messages that are pure information, never the reason of a failure.
_BENIGN = {"Success", "Created", "NoOperation", "PropertyValueModified", "TaskCompletedOK", "TaskStarted"}


def message_key(message_id: str) -> tuple[str, str]:
    """``Base.1.22.1.ResourceInUse`` → ``("Base", "ResourceInUse")``; the version is irrelevant."""
    parts = message_id.split(".")
    if len(parts) < 2:
        return ("", message_id)
    return (parts[0], parts[-1])


def messages_of(body: Mapping[str, Any] | None) -> list[RedfishMessage]:
    """Every Message object of an error body, an ``@Message.ExtendedInfo`` annotation or a Task."""
    if not body:
        return []
    found: list[RedfishMessage] = []
    error = body.get("error")
    if isinstance(error, Mapping):
        found.extend(_as_messages(error.get("@Message.ExtendedInfo")))
        if not found and error.get("code"):
            found.append({"MessageId": str(error["code"]), "Message": str(error.get("message") or "")})
    found.extend(_as_messages(body.get("@Message.ExtendedInfo")))
    found.extend(_as_messages(body.get("Messages")))  # a Task resource
    return found


def _as_messages(value: object) -> Iterable[RedfishMessage]:
    if isinstance(value, list):
        return [m for m in value if isinstance(m, Mapping) and m.get("MessageId")]
    return []


def _classify(messages: list[RedfishMessage]) -> tuple[type[FabricError] | None, RedfishMessage | None]:
    for message in messages:
        cls = _BY_MESSAGE.get(message_key(str(message["MessageId"])))
        if cls is not None:
            return cls, message
    for message in messages:
        if message_key(str(message["MessageId"]))[1] not in _BENIGN:
            return None, message
    return None, None


def _describe(message: RedfishMessage | None) -> str:
    if message is None:
        return ""
    text = one_line(str(message.get("Message") or ""), 400)
    resolution = one_line(str(message.get("Resolution") or ""), 300)
    mid = one_line(str(message.get("MessageId")), 100)
    detail = f"{text} ({mid})" if text else mid
    return f"{detail}; {resolution}" if resolution and resolution.lower() != "none." else detail


def error_for_response(
    status: int,
    body: Mapping[str, Any] | None,
    *,
    method: str,
    uri: str,
    retry_after: float | None = None,
) -> FabricError:
    """The :class:`FabricError` a failed Redfish request stands for."""
    messages = messages_of(body)
    cls, message = _classify(messages)
    if cls is None:
        cls = _BY_STATUS.get(status)
    if cls is None:
        # A GET that fails server-side is the service's trouble; a mutation it rejects (400, 405,
        # 500, ...) is a refused bind: the payload never comes from the caller verbatim.
        cls = FabricUnavailable if status >= 500 and method == "GET" else BindFailed
    detail = _describe(message) or f"HTTP {status}"
    text = f"Redfish {method} {uri} failed: {detail}"
    return cls(
        text,
        retry_after=retry_after,
        message_id=one_line(str(message["MessageId"]), 100) if message is not None else None,
    )


def error_for_task(task: Mapping[str, Any], *, uri: str, action: str) -> FabricError:
    """The error a finished-but-failed Task (TaskState Exception/Killed/Cancelled, or TaskStatus
    Critical) stands for."""
    messages = messages_of(task)
    cls, message = _classify(messages)
    state = str(task.get("TaskState") or "Exception")
    if cls is None:
        cls = BindFailed
    status = one_line(str(task.get("TaskStatus") or "unknown"), 40)
    detail = _describe(message) or f"TaskState {one_line(state, 40)}, TaskStatus {status}"
    return cls(
        f"Redfish task {uri} for {action} ended {one_line(state, 40)}: {detail}",
        message_id=one_line(str(message["MessageId"]), 100) if message is not None else None,
    )
