"""Talking to a Redfish service: the client facade over its transport, sessions and task monitors
(:mod:`fabric.redfish.client`), error mapping, and the event stream."""

from fabric.redfish.client import RedfishClient
from fabric.redfish.error_mapping import OutcomeUnknown, PreconditionFailed
from fabric.redfish.settings import RedfishSettings
from fabric.redfish.transport import RedfishResponse, RequestObserver

__all__ = [
    "OutcomeUnknown",
    "PreconditionFailed",
    "RedfishClient",
    "RedfishResponse",
    "RedfishSettings",
    "RequestObserver",
]
