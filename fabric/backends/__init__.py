"""Binding backends — PCIe zones, composition ResourceBlocks, CXL Connections — and discovery."""

from fabric.backends.base import Backend, BindContext
from fabric.backends.discovery import BindingPlan, Discovery, StyleChoice
from fabric.state.model import (
    DeviceRecord,
    DiscoveredAttributes,
    FabricInfo,
    FabricSnapshot,
    HostRecord,
)

__all__ = [
    "Backend",
    "BindContext",
    "BindingPlan",
    "DeviceRecord",
    "DiscoveredAttributes",
    "Discovery",
    "FabricInfo",
    "FabricSnapshot",
    "HostRecord",
    "StyleChoice",
]
