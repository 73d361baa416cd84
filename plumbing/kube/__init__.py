"""Kubernetes API access shared by every role: an asyncio client, resource names, typed DRA
views and Lease-based leader election.

Its rooms, from the ground up (``tests/unit/test_layers.py`` reads this list): ``resources`` (the
resource names and paths), ``dra`` (typed views of DRA objects, plain data), ``client`` (the
asyncio client and its errors), then side by side, never importing each other, what runs on the
client: ``informer`` (list + watch), ``leader`` (Lease election) and ``events`` (Kubernetes Events).
"""

from plumbing.kube.client import (
    AlreadyExists,
    ApiError,
    ApiUnavailable,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeClient,
    KubeConfig,
    NotFound,
    Unauthorized,
    WatchEvent,
    load_config,
)

FLOORS = ("resources", "dra", "client", ("informer", "leader", "events"))

__all__ = [
    "AlreadyExists",
    "ApiError",
    "ApiUnavailable",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeConfig",
    "NotFound",
    "Unauthorized",
    "WatchEvent",
    "load_config",
]
