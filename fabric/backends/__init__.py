"""The fabric over Redfish: binding backends — PCIe zones, composition ResourceBlocks, CXL
Connections —, discovery, and the watch that keeps the inventory current (:mod:`.watch`)."""

from fabric.backends.base import Backend, BindContext
from fabric.backends.discovery import BindingPlan, Discovery, StyleChoice

__all__ = ["Backend", "BindContext", "BindingPlan", "Discovery", "StyleChoice"]
