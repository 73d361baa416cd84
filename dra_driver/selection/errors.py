"""The one error of device selection: allocation on this node must stop."""

from __future__ import annotations

from dra_driver.errors import DriverError

__all__ = ["AllocationError"]


class AllocationError(DriverError):
    """Allocation on this node must stop (Kubernetes returns an error from ``Allocate``)."""
