"""Injected faults: the request bodies of ``POST /redfish/v1/Oem/FabricDRA/Faults``.

Each fault is one pydantic model, discriminated by ``Kind``. They persist with the fabric
state until removed (``DELETE .../Faults/{Id}``) or reset (``DELETE .../Faults``), except
``ExpireSessions``, which acts once. Counted faults (``Count``) remove themselves when used up.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from emulator.redfish.model.registries import REGISTRIES, all_message_defs

__all__ = [
    "DeviceHealth",
    "DropConnections",
    "ExpireSessions",
    "FailOperations",
    "FaultSpec",
    "HangTasks",
    "LinkDegraded",
    "LinkRemoved",
    "PCIeErrors",
    "PortDown",
    "SlowResponses",
    "Unavailable",
    "fault_adapter",
]


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FailOperations(_Fault):
    """The next ``Count`` binds (or unbinds, or resets) of ``Target`` fail with ``MessageId``.
    ``any`` is any bind or unbind; a reset (``#Processor.Reset``, ``#Drive.Reset``) fails only
    under ``Operation: reset``, and the DELETE of a carved memory chunk only under ``release``."""

    Kind: Literal["FailOperations"]
    Target: str | None = Field(default=None, description="device or memory chunk Id; any when absent")
    Operation: Literal["bind", "unbind", "reset", "release", "any"] = "bind"
    Count: int = Field(default=1, ge=1, le=1_000_000)
    MessageId: str = "OperationFailed"
    HttpStatus: int | None = Field(default=None, ge=400, le=599)

    @field_validator("MessageId")
    @classmethod
    def _known_message(cls, value: str) -> str:
        known = {d.key: d for d in all_message_defs() if d.prefix == "Base"}
        key = value.split(".")[-1]
        if key not in known:
            raise ValueError(f"{value!r} is not a Base {REGISTRIES['Base']} MessageId this service knows")
        if known[key].nargs:
            raise ValueError(f"{value!r} takes arguments; pick a MessageId without arguments")
        return key


class HangTasks(_Fault):
    """The next ``Count`` operations on ``Target`` run as tasks that never finish until reset."""

    Kind: Literal["HangTasks"]
    Target: str | None = None
    Count: int = Field(default=1, ge=1, le=1_000_000)


class DeviceHealth(_Fault):
    """A device's ``Status.Health`` (its PCIe device, function, endpoint, block ...)."""

    Kind: Literal["DeviceHealth"]
    Device: str
    Health: Literal["OK", "Warning", "Critical"] = "Critical"


class LinkDegraded(_Fault):
    """A device's PCIe link trains below what it negotiated: fewer lanes or a lower generation, as
    its ``PCIeInterface`` reports them (``LanesInUse``, ``PCIeType``; DMTF PCIeDevice v1.x) while
    ``MaxLanes``/``MaxPCIeType`` stay the device's."""

    Kind: Literal["LinkDegraded"]
    Device: str
    LanesInUse: int | None = Field(default=None, ge=1, le=32)
    PCIeType: Literal["Gen1", "Gen2", "Gen3", "Gen4", "Gen5", "Gen6"] | None = None


#: the counters of DMTF ``PCIeDevice.v1_8_0.PCIeErrors`` (served in ``PortMetrics.PCIeErrors``)
PCIE_ERROR_COUNTERS = (
    "CorrectableErrorCount",
    "NonFatalErrorCount",
    "FatalErrorCount",
    "L0ToRecoveryCount",
    "ReplayCount",
    "ReplayRolloverCount",
    "NAKSentCount",
    "NAKReceivedCount",
)

_COUNT = Field(default=0, ge=0, le=10**12)


class PCIeErrors(_Fault):
    """PCIe errors on a device's link: each count is added to the error counters of the switch's
    downstream port to the device (``PortMetrics.PCIeErrors``, PortMetrics v1_3_0+). The counters
    are the sums of the ``PCIeErrors`` faults in force on the device: inject another to make them
    grow; removing the faults clears them, as a port's counters are cleared on a reset."""

    Kind: Literal["PCIeErrors"]
    Device: str
    CorrectableErrorCount: int = _COUNT
    NonFatalErrorCount: int = _COUNT
    FatalErrorCount: int = _COUNT
    L0ToRecoveryCount: int = _COUNT
    ReplayCount: int = _COUNT
    ReplayRolloverCount: int = _COUNT
    NAKSentCount: int = _COUNT
    NAKReceivedCount: int = _COUNT


class PortDown(_Fault):
    """A host's upstream port goes down: binds to it fail, its bound devices vanish from its view."""

    Kind: Literal["PortDown"]
    Host: str
    Switch: str | None = Field(default=None, description="one switch; every switch of the host when absent")


class LinkRemoved(_Fault):
    """The cable of an inter-switch link is pulled: both its ports show ``LinkStatus: NoLink``
    (Port v1_2_0: "no physical link detected") and no longer name each other, and no bind is
    routed over it (a host then reaches what its own switches still join)."""

    Kind: Literal["LinkRemoved"]
    Switch: str
    Port: str = Field(description="the switch's InterswitchPort (ISL<n>) the cable is plugged into")


class SlowResponses(_Fault):
    """Every response (except this admin API) waits ``Seconds`` first."""

    Kind: Literal["SlowResponses"]
    Seconds: float = Field(gt=0, le=600)


class DropConnections(_Fault):
    """The next ``Count`` requests (all, when absent) lose their connection without a response."""

    Kind: Literal["DropConnections"]
    Count: int | None = Field(default=None, ge=1, le=1_000_000)


class Unavailable(_Fault):
    """Every request (except this admin API) gets 503 ServiceTemporarilyUnavailable."""

    Kind: Literal["Unavailable"]
    RetryAfterSeconds: int = Field(default=5, ge=1, le=3600)


class ExpireSessions(_Fault):
    """Every open session ends now (clients must log in again)."""

    Kind: Literal["ExpireSessions"]


FaultSpec = Annotated[
    FailOperations
    | HangTasks
    | DeviceHealth
    | LinkDegraded
    | PCIeErrors
    | PortDown
    | LinkRemoved
    | SlowResponses
    | DropConnections
    | Unavailable
    | ExpireSessions,
    Field(discriminator="Kind"),
]

fault_adapter: TypeAdapter[FaultSpec] = TypeAdapter(FaultSpec)
