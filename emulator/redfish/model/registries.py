"""Redfish messages the emulator speaks (the error that carries them: :mod:`emulator.redfish.model.errors`).

MessageIds follow DSP0266 ("RegistryPrefix.Major.Minor.MessageKey") and name keys of DMTF's
published registries (Base 1.22, ResourceEvent 1.4, TaskEvent 1.0, Fabric 1.0, Composition
1.1); a test checks every key and its argument count against the registry files. The message
texts are our own wording of what happened, with the arguments filled in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "REGISTRIES",
    "MessageDef",
    "Severity",
    "all_message_defs",
    "message",
    "message_def",
]

Severity = Literal["OK", "Warning", "Critical"]

#: Registry prefix → (version of the registry this service implements).
REGISTRIES: dict[str, str] = {
    "Base": "1.22.1",
    "ResourceEvent": "1.4.3",
    "TaskEvent": "1.0.5",
    "Fabric": "1.0.3",
    "Composition": "1.1.3",
}


@dataclass(frozen=True)
class MessageDef:
    prefix: str
    key: str
    severity: Severity
    text: str
    resolution: str
    nargs: int

    @property
    def message_id(self) -> str:
        major, minor, _ = REGISTRIES[self.prefix].split(".")
        return f"{self.prefix}.{major}.{minor}.{self.key}"


def _defs(prefix: str, rows: list[tuple[str, Severity, int, str, str]]) -> dict[str, MessageDef]:
    return {key: MessageDef(prefix, key, sev, text, res, n) for key, sev, n, text, res in rows}


_NONE = "None."
_RETRY = "Retry the request later."

_MESSAGES: dict[str, dict[str, MessageDef]] = {
    "Base": _defs(
        "Base",
        [
            ("Success", "OK", 0, "The request completed successfully.", _NONE),
            ("Created", "OK", 0, "The resource was created.", _NONE),
            ("GeneralError", "Critical", 0, "A general error occurred.", "See the other messages."),
            ("InternalError", "Critical", 0, "The request failed because of an internal error.", _RETRY),
            (
                "MalformedJSON",
                "Critical",
                0,
                "The request body is not valid JSON.",
                "Send a valid JSON body.",
            ),
            (
                "EmptyJSON",
                "Warning",
                0,
                "The request body is an empty JSON object.",
                "Send the properties to change.",
            ),
            ("PropertyUnknown", "Warning", 1, "%1 is not a property of this resource.", "Remove %1."),
            ("PropertyMissing", "Warning", 1, "The required property %1 is missing.", "Add %1 and resend."),
            ("PropertyNotWritable", "Warning", 1, "%1 is read-only.", "Remove %1 from the request."),
            (
                "PropertyValueTypeError",
                "Warning",
                2,
                "'%1' has the wrong type for %2.",
                "Send a value of the type the schema gives for %2.",
            ),
            (
                "PropertyValueNotInList",
                "Warning",
                2,
                "'%1' is not an allowed value of %2.",
                "Use an allowed value.",
            ),
            (
                "PropertyValueOutOfRange",
                "Warning",
                2,
                "'%1' is outside the supported range of %2.",
                "Use a value in range.",
            ),
            ("PropertyValueError", "Warning", 1, "The value of %1 is not valid here.", "Correct %1."),
            (
                "PropertyValueIncorrect",
                "Warning",
                2,
                "The value '%2' of %1 is not acceptable.",
                "Correct the value of %1.",
            ),
            (
                "ResourceExhaustion",
                "Critical",
                1,
                "'%1' cannot satisfy the request: not enough of it is free.",
                "Free some of it, or ask for less.",
            ),
            (
                "PropertyValueFormatError",
                "Warning",
                2,
                "'%1' is not in a format %2 accepts.",
                "Correct the value of %2.",
            ),
            (
                "ActionNotSupported",
                "Critical",
                1,
                "%1 is not an action of this resource.",
                "Use a listed action.",
            ),
            (
                "ActionParameterMissing",
                "Critical",
                2,
                "%1 needs the parameter %2.",
                "Add %2 to the request body.",
            ),
            ("ActionParameterUnknown", "Warning", 2, "%1 has no parameter %2.", "Remove %2."),
            (
                "ActionParameterValueTypeError",
                "Warning",
                3,
                "'%1' has the wrong type for parameter %2 of %3.",
                "Correct %2.",
            ),
            (
                "ActionParameterValueError",
                "Warning",
                2,
                "The value of parameter %1 of %2 is not valid here.",
                "Correct %1.",
            ),
            (
                "ActionParameterValueNotInList",
                "Warning",
                3,
                "'%1' is not an allowed value of parameter %2 of %3.",
                "Use an allowed value.",
            ),
            ("ResourceNotFound", "Critical", 2, "There is no %1 named '%2'.", "Check the URI or link."),
            ("InvalidURI", "Critical", 1, "%1 is not a resource of this service.", "Check the URI."),
            (
                "ResourceInUse",
                "Warning",
                0,
                "The resource is in use or in transition.",
                "Release the resource or wait for its operation to finish, then retry.",
            ),
            (
                "ResourceCannotBeDeleted",
                "Critical",
                0,
                "This resource cannot be deleted.",
                "Do not delete this resource.",
            ),
            (
                "OperationNotAllowed",
                "Critical",
                0,
                "The HTTP method is not allowed here.",
                "Use a method in Allow.",
            ),
            (
                "PreconditionFailed",
                "Critical",
                0,
                "The ETag does not match the resource's current ETag.",
                "Read the resource again and retry with its current ETag.",
            ),
            (
                "PreconditionRequired",
                "Critical",
                0,
                "The request did not provide the required precondition such as an If-Match header.",
                "Try the operation again using an If-Match header and the resource's current ETag.",
            ),
            (
                "NoValidSession",
                "Critical",
                0,
                "The request has no valid session or credentials.",
                "Log in (POST to the Sessions collection) or use Basic authentication.",
            ),
            (
                "InsufficientPrivilege",
                "Critical",
                0,
                "The account lacks the privilege for this request.",
                "Use an account with the privilege.",
            ),
            ("OperationFailed", "Warning", 0, "The operation failed in the fabric.", "Retry the operation."),
            (
                "OperationTimeout",
                "Warning",
                0,
                "The operation timed out in the fabric.",
                "Retry the operation.",
            ),
            (
                "ServiceTemporarilyUnavailable",
                "Critical",
                1,
                "The service is temporarily unavailable; retry in %1 seconds.",
                "Wait the given seconds and retry.",
            ),
            (
                "ServiceShuttingDown",
                "Critical",
                0,
                "The operation ended because the service shut down.",
                "Read the resource's state after the service is back, then retry if needed.",
            ),
            (
                "ConditionInRelatedResource",
                "Warning",
                0,
                "A condition in a related resource prevents the request.",
                "See the related resource and resolve its condition.",
            ),
            (
                "QueryParameterUnsupported",
                "Warning",
                1,
                "The query parameter %1 is not supported.",
                "Remove %1.",
            ),
            ("QueryNotSupported", "Warning", 0, "Querying is not supported here.", "Remove the query."),
            (
                "QueryNotSupportedOnOperation",
                "Warning",
                0,
                "Querying is not supported with the requested operation.",
                "Remove the query parameters and resubmit the request.",
            ),
            (
                "QueryParameterValueFormatError",
                "Warning",
                2,
                "The value %1 for the parameter %2 has the wrong format.",
                "Correct the value of %2.",
            ),
            (
                "QueryParameterOutOfRange",
                "Warning",
                3,
                "The value %1 for the query parameter %2 is out of range %3.",
                "Use a value of %2 within %3.",
            ),
            (
                "CreateLimitReachedForResource",
                "Critical",
                0,
                "No more resources can be created here.",
                _RETRY,
            ),
            (
                "HeaderInvalid",
                "Critical",
                1,
                "The header '%1' is not valid.",
                "Correct the header.",
            ),
            (
                "EventBufferExceeded",
                "Warning",
                0,
                "Events were lost because the event buffer overflowed.",
                "Read the resources again to resynchronise.",
            ),
            ("PayloadTooLarge", "Critical", 0, "The request body is too large.", "Send a smaller body."),
        ],
    ),
    "ResourceEvent": _defs(
        "ResourceEvent",
        [
            ("ResourceCreated", "OK", 0, "The resource was created.", _NONE),
            ("ResourceRemoved", "OK", 0, "The resource was removed.", _NONE),
            ("ResourceChanged", "OK", 0, "One or more properties of the resource changed.", _NONE),
            ("ResourceStatusChangedOK", "OK", 2, "The health of '%1' changed to %2.", _NONE),
            (
                "ResourceStatusChangedWarning",
                "Warning",
                2,
                "The health of '%1' changed to %2.",
                "Check the resource.",
            ),
            (
                "ResourceStatusChangedCritical",
                "Critical",
                2,
                "The health of '%1' changed to %2.",
                "Stop using the resource and repair it.",
            ),
        ],
    ),
    "TaskEvent": _defs(
        "TaskEvent",
        [
            ("TaskStarted", "OK", 1, "Task '%1' started.", _NONE),
            ("TaskCompletedOK", "OK", 1, "Task '%1' completed.", _NONE),
            ("TaskAborted", "Critical", 1, "Task '%1' ended with errors.", "See the task's other messages."),
            ("TaskCancelled", "Warning", 1, "Task '%1' was cancelled before it completed.", _NONE),
            ("TaskProgressChanged", "OK", 2, "Task '%1' is %2 percent complete.", _NONE),
        ],
    ),
    "Fabric": _defs(
        "Fabric",
        [
            ("UpstreamLinkEstablished", "OK", 2, "Switch '%1' upstream port '%2' is up.", _NONE),
            (
                "UpstreamLinkDropped",
                "Warning",
                2,
                "Switch '%1' upstream port '%2' went down.",
                "Check the cable.",
            ),
            ("ZoneCreated", "OK", 2, "Zone '%1' was created in fabric '%2'.", _NONE),
            ("ZoneRemoved", "OK", 2, "Zone '%1' was removed from fabric '%2'.", _NONE),
            ("ZoneModified", "OK", 2, "Zone '%1' in fabric '%2' changed.", _NONE),
            ("ConnectionCreated", "OK", 2, "Connection '%1' was created in fabric '%2'.", _NONE),
            ("ConnectionRemoved", "OK", 2, "Connection '%1' was removed from fabric '%2'.", _NONE),
        ],
    ),
    "Composition": _defs(
        "Composition",
        [
            (
                "ResourceBlockCompositionStateChanged",
                "OK",
                1,
                "The composition state of resource block '%1' changed.",
                _NONE,
            ),
        ],
    ),
}


def message_def(prefix: str, key: str) -> MessageDef:
    return _MESSAGES[prefix][key]


def all_message_defs() -> list[MessageDef]:
    return [d for defs in _MESSAGES.values() for d in defs.values()]


def _fill(template: str, args: list[str]) -> str:
    # Replace from the highest index down so %1 does not eat the start of %10.
    for n in range(len(args), 0, -1):
        template = template.replace(f"%{n}", args[n - 1])
    return template


def message(
    key: str,
    *args: object,
    prefix: str = "Base",
    related: list[str] | None = None,
    detail: str | None = None,
) -> dict[str, Any]:
    """A ``Message.v1_3_0`` object for ``prefix.key`` with its arguments filled in.

    ``detail`` replaces the generic text with what actually happened (e.g. which host holds a
    device); MessageId, arguments and severity stay those of the registry entry.
    """
    d = _MESSAGES[prefix][key]
    str_args = [str(a) for a in args]
    if len(str_args) != d.nargs:
        raise ValueError(f"{d.message_id} takes {d.nargs} arguments, got {len(str_args)}")
    body: dict[str, Any] = {
        "@odata.type": "#Message.v1_3_0.Message",
        "MessageId": d.message_id,
        "Message": detail or _fill(d.text, str_args),
        "MessageArgs": str_args,
        "MessageSeverity": d.severity,
        "Resolution": _fill(d.resolution, str_args),
    }
    if related:
        body["RelatedProperties"] = related
    return body
