"""Drains: devices an operator takes out of allocation for maintenance (``fabric-dra drain``).

A drain names a device, a switch or a node; it covers, at every moment, the devices of the inventory
it names — a switch's devices (``Device.switch``, or ``<pool>/<switch>``), or the devices a node holds
through its fabric ports (bound, attaching, detaching or warm there, or holding a partition or a
memory share of it) — so a device that a discovery pass finds behind a drained switch is drained too.
The inventory shows each covered device's :class:`~manager_api.models.DeviceDrain`; the controller
publishes it as a taint ``<driver>/drain`` (docs/controller.md, "Drains").

The manager keeps drains because it is the one that knows switches, ports and which node holds what;
a drain is written to the store before it is answered, beside the ledger and in a store of the same
kind (``drains.json`` in ``--state-dir``, or one ConfigMap replaced with its ``resourceVersion``, so a
deposed leader's write fails instead of overwriting the new leader's). A new leader loads them with
the ledger. The set stays small — an operator's list, not one entry per device.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from fabric.state.configmap_doc import ConfigMapDocument
from manager_api import models as api
from manager_api.errors import FabricUnavailable
from plumbing.fsutil import atomic_write
from plumbing.kube.client import ApiError, KubeClient
from plumbing.logs import get_logger

__all__ = [
    "ConfigMapDrainStore",
    "DrainBook",
    "DrainError",
    "DrainStore",
    "FileDrainStore",
    "covers",
    "drain_record_name",
]

log = get_logger(__name__)
_DATA_KEY = "drains.json"
#: the binding states in which a device is its node's (a node drain covers it)
_HELD = frozenset(
    {api.BindingState.BOUND, api.BindingState.ATTACHING, api.BindingState.DETACHING, api.BindingState.WARM}
)


class DrainError(FabricUnavailable):
    """The drains could not be read or written."""


def drain_record_name(ledger_name: str) -> str:
    """The ConfigMap of the drains beside the ledger ``ledger_name`` (RBAC names it)."""
    return f"{ledger_name}-drains"


class _Record(BaseModel):
    """The stored form: the drains as the API shows them, without the devices they cover now."""

    drains: list[api.Drain]


def covers(drain: api.Drain, device: api.Device) -> bool:
    """Whether ``drain`` covers ``device`` now."""
    if drain.target is api.DrainTarget.DEVICE:
        return device.name == drain.name
    if drain.target is api.DrainTarget.SWITCH:
        return device.switch is not None and drain.name in (device.switch, f"{device.pool}/{device.switch}")
    nodes = {device.node} if device.state in _HELD else set()
    nodes.update(p.node for p in device.partitions)
    if device.memory_pool is not None:
        nodes.update(s.node for s in device.memory_pool.shares)
    return drain.name in nodes


class DrainStore(ABC):
    @abstractmethod
    async def load(self) -> list[api.Drain]: ...

    @abstractmethod
    async def save(self, drains: list[api.Drain]) -> None: ...

    @abstractmethod
    def describe(self) -> str: ...


def _encode(drains: Iterable[api.Drain]) -> str:
    record = _Record(drains=[d.model_copy(update={"devices": []}) for d in drains])
    return record.model_dump_json(by_alias=True, exclude_defaults=True)


def _decode(raw: str | bytes, where: str) -> list[api.Drain]:
    try:
        return _Record.model_validate_json(raw).drains
    except (ValidationError, ValueError) as err:
        raise DrainError(f"the drains {where} are corrupt: {str(err).splitlines()[0]}") from None


class FileDrainStore(DrainStore):
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / _DATA_KEY

    def describe(self) -> str:
        return str(self.path)

    async def load(self) -> list[api.Drain]:
        try:
            raw = await asyncio.to_thread(lambda: self.path.read_bytes() if self.path.exists() else None)
        except OSError as err:
            raise DrainError(f"cannot read the drains {self.path}: {err}") from None
        return [] if raw is None else _decode(raw, str(self.path))

    async def save(self, drains: list[api.Drain]) -> None:
        try:
            await asyncio.to_thread(atomic_write, self.path, _encode(drains), mode=0o600)
        except OSError as err:
            raise DrainError(f"cannot write the drains {self.path}: {err}") from None


class ConfigMapDrainStore(DrainStore):
    """One ConfigMap, replaced with its ``resourceVersion`` (a stale leader's write is refused)."""

    def __init__(self, client: KubeClient, *, name: str, namespace: str) -> None:
        self.document = ConfigMapDocument(client, name=name, namespace=namespace)

    def describe(self) -> str:
        return self.document.describe()

    async def load(self) -> list[api.Drain]:
        try:
            obj = await self.document.read()
        except ApiError as err:
            raise DrainError(f"cannot read the drains {self.describe()}: {err}") from None
        raw = ((obj or {}).get("data") or {}).get(_DATA_KEY)
        return _decode(raw, self.describe()) if raw else []

    async def save(self, drains: list[api.Drain]) -> None:
        try:
            await self.document.write({"data": {_DATA_KEY: _encode(drains)}})
        except ApiError as err:
            # A conflict too: another leader wrote since this one read; it answers nothing it did not keep.
            raise DrainError(f"cannot write the drains {self.describe()}: {err}") from None


class DrainBook:
    """The drains in force, kept in ``store``; ``listeners`` are called after every change."""

    def __init__(self, store: DrainStore) -> None:
        self.store = store
        self._drains: dict[str, api.Drain] = {}
        self._lock = asyncio.Lock()
        self.listeners: list[Callable[[], None]] = []
        #: bumped on every change, so cached renderings of devices are redone
        self.version = 0

    async def load(self) -> None:
        drains = await self.store.load()
        self._drains = {d.key: d for d in drains}
        self._changed()
        if drains:
            log.info("drains loaded", drains=sorted(self._drains), store=self.store.describe())

    def all(self) -> list[api.Drain]:
        return sorted(self._drains.values(), key=lambda d: (d.target, d.name))

    def get(self, target: api.DrainTarget, name: str) -> api.Drain | None:
        return self._drains.get(f"{target}/{name}")

    async def put(self, request: api.DrainRequest, by: str) -> tuple[api.Drain, bool]:
        """Drain what ``request`` names (stored before it returns); whether anything changed. The
        same drain again changes nothing; a new reason or effect replaces it, keeping its start."""
        effect = api.DrainEffect.NO_EXECUTE if request.evict else api.DrainEffect.NO_SCHEDULE
        async with self._lock:
            old = self.get(request.target, request.name)
            if old is not None and (old.reason, old.effect) == (request.reason, effect):
                return old, False
            drain = api.Drain(
                target=request.target,
                name=request.name,
                reason=request.reason,
                effect=effect,
                since=old.since if old is not None else datetime.now(UTC),
                by=by,
            )
            await self._save({**self._drains, drain.key: drain})
        log.warning(
            "drain started" if old is None else "drain changed",
            target=str(drain.target),
            name=drain.name,
            reason=drain.reason,
            effect=str(drain.effect),
            by=by,
        )
        return drain, True

    async def remove(self, target: api.DrainTarget, name: str, by: str) -> api.Drain | None:
        """End a drain (stored before it returns); the drain that ended, or None when there was none."""
        async with self._lock:
            old = self.get(target, name)
            if old is None:
                return None
            await self._save({k: v for k, v in self._drains.items() if k != old.key})
        log.info("drain ended", target=str(target), name=name, by=by)
        return old

    async def _save(self, drains: dict[str, api.Drain]) -> None:
        await self.store.save(list(drains.values()))
        self._drains = drains
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        for listener in self.listeners:
            listener()

    def drain_of(self, device: api.Device) -> api.DeviceDrain | None:
        """What the drains covering ``device`` make of it: the strongest effect (NoExecute over
        NoSchedule) with its reason, the earliest start, every drain's name; None when none does."""
        found = [d for d in self._drains.values() if covers(d, device)]
        if not found:
            return None
        strongest = min(found, key=lambda d: (d.effect is not api.DrainEffect.NO_EXECUTE, d.since))
        return api.DeviceDrain(
            reason=strongest.reason,
            effect=strongest.effect,
            since=min(d.since for d in found),
            drains=sorted(d.key for d in found),
        )

    def with_devices(self, drain: api.Drain, devices: Iterable[api.Device]) -> api.Drain:
        """``drain`` with the names of the devices it covers among ``devices``."""
        return drain.model_copy(update={"devices": sorted(d.name for d in devices if covers(drain, d))})
