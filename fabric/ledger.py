"""The manager's ledger: *why* a device is bound (claim UID) and which operations are in flight.

The fabric is the truth for what is bound where; the ledger records intent. An attach writes its
entry (state ``attaching``) durably *before* the first request to the fabric, and a detach moves the
entry to ``detaching`` durably before unbinding, so after a crash at any point the manager knows
what it was doing and finishes or rolls it back (:mod:`fabric.reconcile`), instead of forgetting a
binding or making it twice.

The outcome of an operation (``bound``, or the entry removed after an unbind) is written without
anyone waiting for it (:meth:`Ledger.commit_soon`): its intent is durable already, and a restart
that finds ``attaching`` or ``detaching`` finishes the record from the fabric's state.

Two stores: a JSON file in ``--state-dir`` (written with :func:`plumbing.fsutil.atomic_write`:
temp file, fsync, rename) and, in a cluster, a ConfigMap replaced with its ``resourceVersion`` so a
deposed leader's stale write fails instead of overwriting the new leader's. Writes are group-committed:
concurrent operations that change the ledger at the same time share one write.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from manager_api.errors import FabricUnavailable, NotLeader
from plumbing.fsutil import atomic_write
from plumbing.kube.client import AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.resources import CONFIGMAPS
from plumbing.logs import get_logger

__all__ = [
    "ConfigMapLedgerStore",
    "FileLedgerStore",
    "Ledger",
    "LedgerDocument",
    "LedgerEntry",
    "LedgerError",
    "LedgerState",
    "LedgerStore",
]

log = get_logger(__name__)
_DATA_KEY = "ledger.json"


class LedgerState(StrEnum):
    ATTACHING = "attaching"  # intent to bind recorded; the fabric may or may not have done it yet
    BOUND = "bound"  # the fabric confirmed the binding
    DETACHING = "detaching"  # intent to unbind recorded (a detach, or the rollback of a failed attach)


class LedgerEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str
    device_key: str = Field(description="Redfish URI of the device when the entry was made")
    node: str
    host: str = Field(description="Redfish ComputerSystem Id behind the node")
    claim_uid: str
    state: LedgerState
    operation_id: str
    #: detaching because the attach failed, not because the claim asked
    rollback: bool = False
    #: a Redfish task monitor whose outcome is still unknown
    task_monitor: str | None = None
    error: str | None = None
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class LedgerDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["FabricDraLedger"] = "FabricDraLedger"
    version: Literal[1] = 1
    entries: dict[str, LedgerEntry] = Field(default_factory=dict)


class LedgerError(FabricUnavailable):
    """The ledger could not be read or written; nothing touches the fabric without it."""


class LedgerStore(ABC):
    @abstractmethod
    async def load(self) -> LedgerDocument: ...

    @abstractmethod
    async def save(self, document: LedgerDocument) -> None:
        """Write ``document``; it is encoded before the first ``await`` (its entries are live)."""

    @abstractmethod
    def describe(self) -> str: ...


class FileLedgerStore(LedgerStore):
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "ledger.json"

    def describe(self) -> str:
        return str(self.path)

    async def load(self) -> LedgerDocument:
        def read() -> LedgerDocument:
            if not self.path.exists():
                return LedgerDocument()
            return LedgerDocument.model_validate_json(self.path.read_bytes())

        try:
            return await asyncio.to_thread(read)
        except (OSError, ValidationError, ValueError) as err:
            raise LedgerError(f"cannot read the ledger {self.path}: {_first_line(err)}") from None

    async def save(self, document: LedgerDocument) -> None:
        payload = document.model_dump_json(indent=1)
        try:
            await asyncio.to_thread(atomic_write, self.path, payload, mode=0o600)
        except OSError as err:
            raise LedgerError(f"cannot write the ledger {self.path}: {err}") from None


class ConfigMapLedgerStore(LedgerStore):
    """One ConfigMap, replaced as a compare-and-swap on its ``resourceVersion``."""

    def __init__(self, client: KubeClient, *, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self._resource_version: str | None = None

    def describe(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    async def load(self) -> LedgerDocument:
        try:
            obj = await self.client.get(CONFIGMAPS, self.name, self.namespace)
        except NotFound:
            self._resource_version = None
            return LedgerDocument()
        except ApiError as err:
            raise LedgerError(f"cannot read the ledger {self.describe()}: {err}") from None
        self._resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        raw = (obj.get("data") or {}).get(_DATA_KEY)
        if not raw:
            return LedgerDocument()
        try:
            return LedgerDocument.model_validate_json(raw)
        except (ValidationError, ValueError) as err:
            raise LedgerError(f"the ledger {self.describe()} is corrupt: {_first_line(err)}") from None

    async def save(self, document: LedgerDocument) -> None:
        data = {_DATA_KEY: document.model_dump_json(indent=1)}
        metadata: dict[str, object] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/name": "fabric-dra", "app.kubernetes.io/component": "manager"},
        }
        for attempt in (1, 2):
            try:
                if self._resource_version is None:
                    saved = await self.client.create(
                        CONFIGMAPS, {"metadata": metadata, "data": data}, self.namespace
                    )
                else:
                    metadata["resourceVersion"] = self._resource_version
                    saved = await self.client.replace(CONFIGMAPS, {"metadata": metadata, "data": data})
            except (Conflict, AlreadyExists):
                # Written by someone else since we read it: a deposed leader's last write landing
                # after we took over. This replica's view wins (the fabric decides what is bound);
                # a second conflict means another replica is writing now, so step back.
                if attempt == 2:
                    raise NotLeader(
                        f"the ledger {self.describe()} is being changed by another manager replica",
                        retry_after=2.0,
                    ) from None
                log.warning("ledger changed by another replica; overwriting it", ledger=self.describe())
                await self._refresh_version()
                continue
            except ApiError as err:
                raise LedgerError(f"cannot write the ledger {self.describe()}: {err}") from None
            self._resource_version = str((saved.get("metadata") or {}).get("resourceVersion") or "")
            return

    async def _refresh_version(self) -> None:
        try:
            current = await self.client.get(CONFIGMAPS, self.name, self.namespace)
        except NotFound:
            self._resource_version = None
            return
        except ApiError as err:
            raise LedgerError(f"cannot read the ledger {self.describe()}: {err}") from None
        self._resource_version = str((current.get("metadata") or {}).get("resourceVersion") or "")


class Ledger:
    """The in-memory ledger of this replica, saved through a :class:`LedgerStore`."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._entries: dict[str, LedgerEntry] = {}
        self._changes = 0
        self._saved = 0
        self._write_lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None

    async def load(self) -> None:
        document = await self.store.load()
        self._entries = dict(document.entries)
        self._changes = self._saved = 0
        log.info("ledger loaded", ledger=self.store.describe(), entries=len(self._entries))

    def get(self, device: str) -> LedgerEntry | None:
        return self._entries.get(device)

    def entries(self) -> list[LedgerEntry]:
        return list(self._entries.values())

    def put(self, entry: LedgerEntry) -> None:
        entry.updated_at = datetime.now(UTC)
        self._entries[entry.device] = entry
        self._changes += 1

    def remove(self, device: str) -> None:
        if self._entries.pop(device, None) is not None:
            self._changes += 1

    async def commit(self) -> None:
        """Return once every change made so far is durable (one write may cover many callers)."""
        wanted = self._changes
        async with self._write_lock:
            if self._saved >= wanted:
                return
            covered = self._changes
            # No deep copy of every entry: both stores encode the document before their first
            # await, so no change can slip in half-way (and a later change in the same write
            # would only be saved early).
            document = LedgerDocument.model_construct(entries=dict(self._entries))
            await self.store.save(document)
            self._saved = covered

    def commit_soon(self) -> None:
        """Write the changes made so far without anyone waiting for it: for the outcome of an
        operation whose intent is already durable (a restart finishes the record from the
        fabric's state). It joins the next write; every later :meth:`commit` covers it too."""
        if self._background is None or self._background.done():
            self._background = asyncio.get_running_loop().create_task(self._commit_in_background())

    async def _commit_in_background(self) -> None:
        while self._saved < self._changes:
            try:
                await self.commit()
            except FabricUnavailable as err:
                log.warning("ledger write failed; the next write carries the change", error=err.message)
                return


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
