"""DeviceBudgets as the manager reads them: the spec of each (deploy/base/devicebudget-crd.yaml), kept
current by one informer (docs/budgets.md).

The CRD's schema and CEL rules refuse a malformed budget at admission (unknown fields, a limit
naming both or neither of ``deviceClassName`` and ``model``, a quantity that is none); what the
manager reads is therefore well formed, and an object that still does not read (an older CRD
version, a hand-edited status-less copy) is logged once and left out, never guessed at.

Without Kubernetes API access there are no budgets (the manager says so once at start); while the
API server does not serve ``devicebudgets`` (the CRD not installed) the view is empty, asks again
with a backoff, and says so once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from plumbing.backoff import Backoff
from plumbing.kube.client import ApiError, KubeClient, NotFound
from plumbing.kube.informer import Change, Informer, Origin
from plumbing.kube.resources import DEVICE_BUDGETS
from plumbing.logs import get_logger
from plumbing.quantity import QuantityError, quantity_value

__all__ = [
    "BudgetView",
    "DeviceBudget",
    "DeviceHoursLimit",
    "DeviceLimit",
    "LabelTree",
    "OwnerTree",
    "read_budget",
]

log = get_logger(__name__)


def _quantity(value: Any) -> Any:
    """A quantity (``160Gi``) or a plain number as its exact value; anything else is refused."""
    if value is None or isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise ValueError("a quantity, not a boolean")
    if isinstance(value, int | float):
        return Fraction(value)
    try:
        return quantity_value(str(value))
    except QuantityError as err:
        raise ValueError(str(err)) from None


Quantity = Annotated[Fraction, BeforeValidator(_quantity)]


class _Spec(BaseModel):
    # the CRD prunes unknown fields; a field of a newer version is not refused here
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class LabelTree(_Spec):
    key: str = Field(min_length=1)
    #: absent: each distinct value is a tree of its own, each capped alone
    value: str | None = None


class OwnerTree(_Spec):
    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    #: absent: every root of that kind is a tree of its own
    name: str | None = None

    @property
    def kind_key(self) -> str:
        """``group/Kind`` (``Kind`` for the core group): how :class:`fabric.bindings.trees.Root` names it."""
        group = self.api_version.rpartition("/")[0]
        return f"{group}/{self.kind}" if group else self.kind


class TreeSelector(_Spec):
    label: LabelTree | None = None
    owner: OwnerTree | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TreeSelector:
        if (self.label is None) == (self.owner is None):
            raise ValueError("spec.tree names exactly one of label and owner")
        return self


class DeviceLimit(_Spec):
    device_class_name: str | None = Field(default=None, alias="deviceClassName")
    model: str | None = None
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceLimit:
        if (self.device_class_name is None) == (self.model is None):
            raise ValueError("a devices limit names exactly one of deviceClassName and model")
        return self

    @property
    def name(self) -> str:
        """The limit as metrics and messages name it: ``devices:<class or model>``."""
        return f"devices:{self.device_class_name or self.model}"


class DeviceHoursLimit(_Spec):
    max: Quantity
    #: the rolling window, a Go duration of hours, minutes and seconds (``24h``, ``90m``)
    window: str = "24h"

    @model_validator(mode="after")
    def _a_duration(self) -> DeviceHoursLimit:
        _duration_seconds(self.window)  # refused as the budget is read, not at use
        return self

    @property
    def window_seconds(self) -> float:
        return _duration_seconds(self.window)


class Limits(_Spec):
    devices: list[DeviceLimit] = Field(default_factory=list)
    gpu_memory: Quantity | None = Field(default=None, alias="gpuMemory")
    cxl_memory: Quantity | None = Field(default=None, alias="cxlMemory")
    device_hours: DeviceHoursLimit | None = Field(default=None, alias="deviceHours")


class BudgetSpec(_Spec):
    tree: TreeSelector
    limits: Limits = Field(default_factory=Limits)
    enforcement: Literal["Enforce", "Warn"] = "Enforce"


class DeviceBudget(_Spec):
    namespace: str
    name: str
    uid: str = ""
    generation: int = 0
    spec: BudgetSpec
    #: the status as last read (the status writer compares against it)
    status: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def enforced(self) -> bool:
        return self.spec.enforcement == "Enforce"

    @property
    def selects(self) -> str:
        """How the budget names its trees, for a table: ``label KEY[=VALUE]``, ``owner KIND[/NAME]``."""
        label, owner = self.spec.tree.label, self.spec.tree.owner
        if label is not None:
            return f"label {label.key}" + (f"={label.value}" if label.value else "")
        if owner is not None:  # TreeSelector holds exactly one of the two
            return f"owner {owner.kind_key}" + (f"/{owner.name}" if owner.name else "")
        return "nothing"


#: the units of a window: the CRD's ``format: duration`` (kube-openapi strfmt ``ParseDuration``:
#: Go's units and days and weeks, short or long), down to seconds — a window is 1h to 744h
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_WINDOW_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(seconds?|minutes?|hours?|days?|weeks?|[smhdw])")


def _duration_seconds(text: str) -> float:
    """A window (``24h``, ``7d``, ``1h30m``, ``2 weeks``) in seconds; ValueError for anything else."""
    total, position = 0.0, 0
    for part in _WINDOW_PART.finditer(text):
        if part.start() != position:
            break
        total += float(part[1]) * _UNITS[part[2][0]]
        position = part.end()
    if not text or position != len(text):
        raise ValueError(f"window {text!r} is no duration of weeks, days, hours, minutes, seconds (24h)")
    return total


def read_budget(obj: dict[str, Any]) -> DeviceBudget:
    """The budget an API object holds; ValueError (pydantic's) naming what does not read."""
    meta = obj.get("metadata") or {}
    return DeviceBudget.model_validate(
        {
            "namespace": meta.get("namespace") or "",
            "name": meta.get("name") or "",
            "uid": meta.get("uid") or "",
            "generation": meta.get("generation") or 0,
            "spec": obj.get("spec") or {},
            "status": obj.get("status") or {},
        }
    )


class BudgetView:
    """Every DeviceBudget of the cluster, by namespace, from one informer."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.synced = asyncio.Event()
        self._by_key: dict[str, DeviceBudget] = {}
        self._refused: set[tuple[str, int]] = set()
        #: bumped on every change: the status writer and the metrics look again
        self.version = 0

    async def run(self) -> None:
        """Wait until the API server serves DeviceBudgets, then list and watch them until cancelled."""
        backoff = Backoff(initial=1.0, maximum=60.0)
        said = False
        while True:
            try:
                await self.kube.list(DEVICE_BUDGETS, limit=1)
                break
            except NotFound:
                if not said:
                    log.warning(
                        "the API server serves no DeviceBudgets (is deploy/base/devicebudget-crd.yaml "
                        "applied?); no budget is enforced until it does"
                    )
                    said = True
            except ApiError as err:
                log.warning("cannot list DeviceBudgets; retrying", error=str(err).splitlines()[0])
            self.synced.set()  # nothing to wait for: no budget is known
            await backoff.sleep()
        informer = Informer(self.kube, DEVICE_BUDGETS, on_changes=self._apply)
        runner = asyncio.create_task(informer.run(), name="budget-informer")
        try:
            await informer.synced.wait()
            self.synced.set()
            await runner
        finally:
            runner.cancel()

    def _apply(self, changes: Sequence[Change], origin: Origin) -> None:
        for change in changes:
            meta = change.object.get("metadata") or {}
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            if change.type == "DELETED":
                self._by_key.pop(key, None)
                continue
            try:
                self._by_key[key] = read_budget(change.object)
            except ValueError as err:
                self._by_key.pop(key, None)
                mark = (key, int(meta.get("generation") or 0))
                if mark not in self._refused:
                    self._refused.add(mark)
                    log.error("DeviceBudget does not read; not enforced", budget=key, error=str(err))
        self.version += 1

    def in_namespace(self, namespace: str) -> list[DeviceBudget]:
        return [b for b in self._by_key.values() if b.namespace == namespace]

    def all(self) -> list[DeviceBudget]:
        return sorted(self._by_key.values(), key=lambda b: b.key)

    def put(self, obj: dict[str, Any]) -> None:
        """Take ``obj`` as if the informer had listed it (tests without an API server)."""
        self._apply([Change("ADDED", obj)], "list")
        self.synced.set()
