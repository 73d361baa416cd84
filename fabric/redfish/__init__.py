"""Talking to a Redfish service: the safe client, error mapping, task monitors and events."""

from fabric.redfish.client import (
    OutcomeUnknown,
    RedfishClient,
    RedfishResponse,
    RedfishSettings,
    RequestObserver,
)
from fabric.redfish.error_mapping import PreconditionFailed

__all__ = [
    "OutcomeUnknown",
    "PreconditionFailed",
    "RedfishClient",
    "RedfishResponse",
    "RedfishSettings",
    "RequestObserver",
]
