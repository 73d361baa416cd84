"""One bind or unbind as the engine runs it, whatever Redfish style it arrived in, and its outcome."""

from __future__ import annotations

from dataclasses import dataclass, field

from emulator.redfish.model.state import OperationKind, TaskRecord
from manager_api.devices import BindingStyle

__all__ = ["Operation", "Outcome", "fmt_targets"]


@dataclass
class Operation:
    """One bind or unbind request, whatever Redfish style it arrived in."""

    kind: OperationKind
    style: BindingStyle
    fabric: str
    host: str
    targets: list[str]
    method: str
    uri: str
    body: str = ""
    name: str | None = None
    description: str | None = None
    #: zone the targets join (bind) or leave; None for CXL connections
    zone: str | None = None
    connection: str | None = None
    access: list[str] = field(default_factory=list)
    create_zone: bool = False
    delete_zone: bool = False
    create_connection: bool = False
    delete_connection: bool = False
    #: final response: status, and the resource a 201 points at
    success_status: int = 204
    location: str | None = None

    @property
    def binds(self) -> bool:
        return self.kind == OperationKind.BIND


@dataclass
class Outcome:
    status: int
    location: str | None = None
    task: TaskRecord | None = None


def fmt_targets(targets: list[str]) -> str:
    return ", ".join(targets)
