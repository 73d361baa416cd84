"""One exception family for everything that can go wrong binding a device.

The Redfish client maps ``@Message.ExtendedInfo`` MessageIds to these classes in one place
(:mod:`fabric.redfish`), the manager's REST API turns them into :class:`manager_api.models.ErrorBody`
with an HTTP status, and :class:`manager_api.client.ManagerClient` turns those bodies back
into the same classes — so callers on every side catch the same types, never strings.

    FabricError
    ├── InvalidRequest          422  a request that can never succeed as written
    ├── NotFoundError
    │   ├── DeviceNotFound      404
    │   └── NodeNotFound        404
    ├── DeviceBusy              409  held by another node or claim, or an operation is running (retriable)
    ├── DeviceUnhealthy         409  the fabric reports the device Critical
    ├── BudgetExceeded          409  the claim's agent tree holds what a DeviceBudget allows (never
    │                                asked again at once: the kubelet or the scheduler tries again)
    ├── AuthError
    │   ├── Unauthenticated     401
    │   └── PermissionDenied    403
    ├── NotLeader               503  this manager replica is a follower (retriable)
    ├── FabricUnavailable       503  the Redfish service is unreachable or failing (retriable)
    ├── ResyncRequired          410  a change feed's cursor is older than the history the manager
    │                                holds, or of another manager incarnation: read it all again
    ├── AttachTimeout           504  the fabric did not finish in time; the operation goes on (retriable)
    ├── AttachStillRunning           a client gave up asking about an attach still running (never
    │                                on the wire: :mod:`manager_api.attaching` raises it)
    └── BindFailed              502  the fabric refused or failed the bind/unbind
        └── BindRefused         502  the fabric refuses this device/node pair for good (a device
                                     behind a switch not cabled to the host): never retriable
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AttachStillRunning",
    "AttachTimeout",
    "AuthError",
    "BindFailed",
    "BindRefused",
    "BudgetExceeded",
    "DeviceBusy",
    "DeviceNotFound",
    "DeviceUnhealthy",
    "FabricError",
    "FabricUnavailable",
    "InvalidRequest",
    "NodeBindingLimit",
    "NodeNotFound",
    "NotFoundError",
    "NotLeader",
    "PermissionDenied",
    "ResyncRequired",
    "TooManyRequests",
    "Unauthenticated",
    "error_class",
]


class FabricError(Exception):
    """Base of every fabric-dra error; ``code`` names it on the wire, ``http_status`` maps it."""

    code: ClassVar[str] = "FabricError"
    http_status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        device: str | None = None,
        node: str | None = None,
        held_by: str | None = None,
        retry_after: float | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.device = device
        self.node = node
        self.held_by = held_by
        self.retry_after = retry_after
        #: the Redfish MessageId this error was mapped from, when it came from the fabric
        self.message_id = message_id


class InvalidRequest(FabricError):
    code = "InvalidRequest"
    http_status = 422


class NotFoundError(FabricError):
    code = "NotFound"
    http_status = 404


class DeviceNotFound(NotFoundError):
    code = "DeviceNotFound"


class NodeNotFound(NotFoundError):
    code = "NodeNotFound"


class DeviceBusy(FabricError):
    code = "DeviceBusy"
    http_status = 409
    retriable = True


class NodeBindingLimit(FabricError):
    """The node holds as many devices as one node may (``--max-bindings-per-node``)."""

    code = "NodeBindingLimit"
    http_status = 409


class DeviceUnhealthy(FabricError):
    code = "DeviceUnhealthy"
    http_status = 409


class BudgetExceeded(FabricError):
    """A DeviceBudget of the claim's namespace caps the claim's agent tree, and the tree holds (or,
    with this claim, would hold) more than it allows (docs/budgets.md, "Enforcement").

    409, not 429: a 429 says the caller asks too often and may ask again after ``Retry-After``; here
    asking again changes nothing until the tree releases something, which can be hours. Not
    retriable on the wire, so neither the plugin nor the controller asks again within one call: the
    controller fails the binding at once (the scheduler picks again later), the plugin fails the
    prepare (the kubelet retries it with its own backoff)."""

    code = "BudgetExceeded"
    http_status = 409


class AuthError(FabricError):
    code = "AuthError"
    http_status = 401


class Unauthenticated(AuthError):
    code = "Unauthenticated"
    http_status = 401


class PermissionDenied(AuthError):
    code = "PermissionDenied"
    http_status = 403


class TooManyRequests(AuthError):
    """A client asked for more token reviews than its share (:mod:`fabric.api.auth`)."""

    code = "TooManyRequests"
    http_status = 429
    retriable = True


class NotLeader(FabricError):
    code = "NotLeader"
    http_status = 503
    retriable = True


class FabricUnavailable(FabricError):
    code = "FabricUnavailable"
    http_status = 503
    retriable = True


class ResyncRequired(FabricError):
    """``GET /api/v1/inventory/changes?since=V``: the changes since ``V`` are no longer known (the
    bounded history moved past it, or ``V`` counts in another manager incarnation's epoch). The
    consumer reads the whole inventory once and follows the changes from there (as a Kubernetes
    watch answers 410 Gone "too old resource version" and its informer lists again)."""

    code = "ResyncRequired"
    http_status = 410


class AttachTimeout(FabricError):
    code = "AttachTimeout"
    http_status = 504
    retriable = True


class AttachStillRunning(FabricError):
    """The fabric was still attaching when the caller's patience ran out; the manager goes on with
    the operation, and the same request later picks it up (idempotent per claim UID + device)."""

    code = "AttachStillRunning"


class BindFailed(FabricError):
    code = "BindFailed"
    http_status = 502


class BindRefused(BindFailed):
    """The fabric refuses to bind this device to this host, and asking again gets the same answer:
    a Redfish 400 ``ActionParameterValueError`` / ``PropertyValueError`` on a bind (a real switch's
    answer for a device behind a switch that is not cabled to the host), or the manager's own
    inventory saying the host does not reach the device. The allocation cannot work on this node."""

    code = "BindRefused"


_BY_CODE: dict[str, type[FabricError]] = {}


def _index(cls: type[FabricError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _index(sub)


_index(FabricError)


def error_class(code: str) -> type[FabricError]:
    """The class for a wire ``code``; unknown codes map to the base class."""
    return _BY_CODE.get(code, FabricError)
