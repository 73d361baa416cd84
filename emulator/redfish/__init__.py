"""A DMTF Redfish composable-fabric service in software.

PCIe switches with pooled GPUs, NVMe drives, NICs and FPGAs, a CXL fabric with memory chunks,
and hosts that devices are bound to through PCIe zones, the CompositionService, or CXL
connections — with sessions, ETags, tasks, Server-Sent Events, durable state, injectable
faults, and a per-host sysfs view of what is bound. See docs/emulator.md.
"""

from __future__ import annotations

from emulator.redfish.server import EmulatorService, ServeConfig, build_service, serve

__all__ = ["EmulatorService", "ServeConfig", "build_service", "serve"]
