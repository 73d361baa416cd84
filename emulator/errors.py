"""The emulator's one exception tree: every error it raises on purpose derives from
:class:`EmulatorError`, so a caller catches the level it can handle (as with httpx)::

    EmulatorError
    ├── ConfigError (ValueError)    a file or option the emulator cannot start with
    │   ├── TopologyError           a topology file, every problem named (emulator.topology)
    │   └── JournalError            a state journal its snapshot cannot take (emulator.redfish.model.state)
    ├── GuestError (RuntimeError)   a QEMU host's guest did not do what was asked
    │   ├── QmpError                QEMU answered a QMP command with an error (emulator.qemu.qmp)
    │   ├── AgentError              the guest agent did not answer (emulator.qemu.guest)
    │   ├── ImageError              the guest image cannot be built here (emulator.qemu.image)
    │   └── HostUnplugError         the guest did not release a device (emulator.qemu.host)
    ├── FabricError                 the fabric refuses or fails an operation (the engine)
    │   ├── TargetBusy              a target is bound, or has an operation in flight
    │   ├── TaskFinished            a task that already ended cannot be cancelled
    │   ├── PortIsDown              the host's port to the target's switch is down
    │   ├── UnknownName             a fault names a device, host or switch the topology lacks
    │   ├── InjectedFailure         a FailOperations fault refused the operation
    │   ├── GuestFailed             a QEMU host's guest could not plug or unplug a device
    │   ├── GuestTimedOut           a QEMU host's guest did not release a device in time
    │   ├── Interrupted             a restart of the service ended a running task
    │   ├── ChunkSizeRefused        a memory chunk size its domain cannot carve (range, increment)
    │   └── DomainExhausted         a memory domain has too little free memory, or too many chunks
    └── RedfishError                a request refused with its HTTP status and Redfish messages
                                    (emulator.redfish.model.errors)

The engine knows nothing of HTTP: a :class:`FabricError` says what happened in the fabric's
words. It becomes a Redfish error — a Base registry MessageId with its HTTP status — in one
place, :func:`emulator.redfish.model.errors.redfish_error`, which the HTTP application and a
task's recorded result both use.
"""

from __future__ import annotations

__all__ = [
    "ChunkSizeRefused",
    "ConfigError",
    "DomainExhausted",
    "EmulatorError",
    "FabricError",
    "GuestError",
    "GuestFailed",
    "GuestTimedOut",
    "InjectedFailure",
    "Interrupted",
    "PortIsDown",
    "TargetBusy",
    "TaskFinished",
    "UnknownName",
]


class EmulatorError(Exception):
    """Root of every error the emulator raises on purpose."""


class ConfigError(EmulatorError, ValueError):
    """A topology, latency profile, credentials or state file, or an option, the emulator cannot
    start with; the message says what is wrong and where."""


class GuestError(EmulatorError, RuntimeError):
    """A QEMU host's guest (QMP, its agent, its image, a hot-unplug) did not do what was asked."""


class FabricError(EmulatorError):
    """The fabric refuses or fails an operation; ``detail`` says what happened, in one sentence."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TargetBusy(FabricError):
    """A target (or a zone's targets) is bound, or has an operation in flight."""


class TaskFinished(FabricError):
    """A task that already ended cannot be cancelled."""


class PortIsDown(FabricError):
    """The host's upstream port to the target's switch is down (a PortDown fault)."""


class UnknownName(FabricError):
    """A fault names a ``kind`` of thing (device, host, switch) the topology has none of by ``name``;
    ``prop`` is the fault's property that named it."""

    def __init__(self, kind: str, name: str, prop: str) -> None:
        super().__init__(f"There is no {kind} named {name!r}.")
        self.name = name
        self.prop = prop


class InjectedFailure(FabricError):
    """A FailOperations fault refused the operation, with the fault's Base ``message_key`` and
    ``status`` (None: the status that MessageId usually comes with)."""

    def __init__(self, detail: str, message_key: str, status: int | None) -> None:
        super().__init__(detail)
        self.message_key = message_key
        self.status = status


class GuestFailed(FabricError):
    """A QEMU host's guest could not plug or unplug a device (QMP or the connection failed)."""


class GuestTimedOut(FabricError):
    """A QEMU host's guest did not release a device in time; the binding stays."""


class Interrupted(FabricError):
    """A restart of the service ended a running task before it completed."""


class ChunkSizeRefused(FabricError):
    """A memory chunk of ``size_mib`` its domain cannot carve: below its minimum or above its size,
    or (``misaligned``) not the minimum plus a whole number of increments."""

    def __init__(self, detail: str, size_mib: int, *, misaligned: bool) -> None:
        super().__init__(detail)
        self.size_mib = size_mib
        self.misaligned = misaligned


class DomainExhausted(FabricError):
    """The memory domain at ``domain`` (its URI) cannot hold the chunk asked for: too little free
    memory, or (``limit``) as many chunks as it can hold."""

    def __init__(self, detail: str, domain: str, *, limit: bool = False) -> None:
        super().__init__(detail)
        self.domain = domain
        self.limit = limit
