"""The fabric manager's exceptions: two roots a caller catches at the level it can handle (as
with httpx), and the one place an error becomes its wire body.

``manager_api.errors.FabricError`` is the family every request can end with: each class has its
wire ``code`` and HTTP status, and the manager's clients (the plugin, the controller, the command
line) turn the body back into the same class. What the manager adds to it stays in that family::

    FabricError (manager_api.errors)
    ├── DeviceBusy
    │   └── PreconditionFailed       the resource changed between read and write (redfish.error_mapping)
    └── FabricUnavailable
        ├── OutcomeUnknown           a change was sent, no answer came back (redfish.error_mapping)
        ├── ForeignLink              the service linked outside itself (redfish.links)
        ├── LedgerError              the ledger cannot be read or written (state.ledger)
        └── UsageError               the usage record cannot be read or written (bindings.usage)

:class:`ManagerError` is the root of what never reaches the wire::

    ManagerError
    ├── ConfigError (ValueError)     settings, or a policy, the manager cannot start with
    │   └── WarmPolicyRefused        the warm policy matches no device of the fabric (bindings.warm)
    ├── Unresolved                   an operation cannot finish now; its entry is resumed later
    │                                (driver.attempts)
    ├── Refused                      the bounded reader refused an answer or an event (redfish.reader)
    └── BodyTooLarge (HTTPException) a request body past the cap while FastAPI reads it
                                     (api.request_guard; the framework answers it, 413)

One HTTP exchange with the Redfish service that failed below HTTP is plumbing's
``TransportError`` (:mod:`plumbing.http1`); the transport maps it to FabricUnavailable or
OutcomeUnknown.

Mapped once at each boundary: Redfish ``@Message.ExtendedInfo`` MessageIds to the family in
:mod:`fabric.redfish.error_mapping`; the family to its wire body here (:func:`error_body`), which
the API answers with the class's HTTP status and the operation log keeps.
"""

from __future__ import annotations

from manager_api import models as api
from manager_api.errors import FabricError

__all__ = ["ConfigError", "ManagerError", "error_body"]


class ManagerError(Exception):
    """Root of every error of the manager that never reaches the wire as such."""


class ConfigError(ManagerError, ValueError):
    """Settings, a file they name, or a policy the manager cannot start with; the message says what
    is wrong. A ValueError, as the command line reports every bad value."""


def error_body(err: FabricError) -> api.ErrorBody:
    """What a client is told of ``err``: its wire code, message and the facts it carries."""
    return api.ErrorBody(
        code=err.code,
        message=err.message,
        device=err.device,
        node=err.node,
        held_by=err.held_by,
        retry_after_seconds=err.retry_after if err.retriable else None,
        message_id=err.message_id,
    )
