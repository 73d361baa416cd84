"""How an attach or detach runs: how long it keeps trying, how long a Redfish task may run, how
often it is sent, and how soon an unfinished one is resumed."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OperationSettings"]


@dataclass(frozen=True, slots=True)
class OperationSettings:
    #: how long one operation keeps trying while the fabric is unreachable or a task runs
    operation_timeout: float = 120.0
    #: how long one Redfish task may run before it is cancelled and the operation rolled back
    task_timeout: float = 60.0
    #: binds (or unbinds) sent for one operation at most, each after a read showed it not done
    max_attempts: int = 3
    #: pause before re-reading after a request whose outcome is unknown
    settle_seconds: float = 0.5
    #: how often unfinished ledger entries are resumed
    retry_seconds: float = 5.0
