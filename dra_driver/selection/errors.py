"""The one error of device selection: allocation on this node must stop."""

from __future__ import annotations

__all__ = ["AllocationError"]


class AllocationError(Exception):
    """Allocation on this node must stop (Kubernetes returns an error from ``Allocate``)."""
