"""Kubernetes API access shared by every role: an asyncio client, resource names, typed DRA
views and Lease-based leader election."""

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
