"""Binding backends — PCIe zones, composition ResourceBlocks, CXL Connections — and discovery."""

from fabric.backends.base import Backend, BindContext
from fabric.backends.discovery import BindingPlan, Discovery, StyleChoice
from fabric.backends.model import (
    BindingStyle,
    DeviceAttributes,
    DeviceRecord,
    FabricInfo,
    FabricSnapshot,
    HostRecord,
)

__all__ = [
    "Backend",
    "BindContext",
    "BindingPlan",
    "BindingStyle",
    "DeviceAttributes",
    "DeviceRecord",
    "Discovery",
    "FabricInfo",
    "FabricSnapshot",
    "HostRecord",
    "StyleChoice",
]
