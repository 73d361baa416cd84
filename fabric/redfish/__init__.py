"""Talking to a Redfish service: the client facade over its transport, sessions and task monitors
(:mod:`fabric.redfish.client`), error mapping, and the event stream.

Its rooms, from the ground up; a module imports only its own room or those listed before it
(``tests/unit/test_layers.py`` reads this list):

* ``error_mapping``  Redfish MessageIds to :mod:`manager_api.errors`, once;
* ``links``          service-provided URIs resolved against the service root, and kept to it;
* ``reader``         the one bounded reader of every byte that comes back (answers, events);
* ``settings``       how to reach the service (URL, TLS, authentication, timeouts);
* ``transport``      every request leaves through ``Transport.send``, over :mod:`plumbing.http1`
                     (HTTP/1.1 over asyncio streams: connections, heads, raw bodies);
* ``sessions``       the Redfish session (X-Auth-Token), re-created when it expires;
* ``tasks``          task monitors followed to their end;
* ``client``         the facade the backends use;
* ``events``         the Server-Sent Events stream.
"""

from fabric.redfish.client import RedfishClient
from fabric.redfish.error_mapping import OutcomeUnknown, PreconditionFailed
from fabric.redfish.settings import RedfishSettings
from fabric.redfish.transport import RedfishResponse, RequestObserver

FLOORS = (
    "error_mapping",
    "links",
    "reader",
    "settings",
    "transport",
    "sessions",
    "tasks",
    "client",
    "events",
)

__all__ = [
    "OutcomeUnknown",
    "PreconditionFailed",
    "RedfishClient",
    "RedfishResponse",
    "RedfishSettings",
    "RequestObserver",
]
