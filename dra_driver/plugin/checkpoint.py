"""The plugin's on-disk record of prepared claims: one versioned, checksummed JSON file.

Written atomically (temp file, fsync, rename, fsync dir) through :func:`plumbing.fsutil.atomic_write`.
Concurrent changes are *group-committed*: every caller of :meth:`CheckpointStore.commit` returns
once a write that contains its change is durable, and changes made while a write is in flight
go into the next one — 50 claims prepared at once cost a handful of fsyncs, not 100.

Two plugin pods may share the file during a rolling update (``POD_UID``): each write happens under
an exclusive ``flock`` and only if the file is still the one this process last saw; otherwise the
process re-reads it, keeps its own uncommitted entries on top, and writes again.

A file that does not parse, fails its checksum or has an unknown version raises
:class:`CheckpointCorrupt`; the caller quarantines it (:meth:`CheckpointStore.quarantine`) and rebuilds
the record from the CDI specs and the fabric's bindings (see :mod:`dra_driver.plugin.reconcile`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin import cdi
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import HostDevice
from dra_driver.plugin.hostmemory import MemoryMode, MemoryRecord
from dra_driver.plugin.partitioner import Partition
from plumbing.fsutil import atomic_write
from plumbing.logs import get_logger

__all__ = [
    "CHECKPOINT_VERSION",
    "CheckpointCorrupt",
    "CheckpointData",
    "CheckpointStore",
    "ClaimEntry",
    "ClaimState",
    "PreparedDevice",
]

log = get_logger(__name__)

CHECKPOINT_VERSION = 1
_KIND = "FabricDraPluginCheckpoint"


class CheckpointCorrupt(KubeletPluginError):
    """The checkpoint file cannot be trusted; the message says why."""


class ClaimState(StrEnum):
    #: the claim's devices may be (being) attached; CDI specs are not final
    PREPARE_STARTED = "PrepareStarted"
    #: attached, visible, CDI specs written: the kubelet got the answer
    PREPARE_COMPLETED = "PrepareCompleted"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


#: what a device of a GPU partition or a memory share adds to its record, left out when unset
_SHARING_FIELDS = (
    "share_id",
    "parent",
    "partition_profile",
    "partition_start",
    "partition",
    "memory_mode",
    "memory",
)


class PreparedDevice(DeviceFacts):
    """A device of a prepared claim: its facts (:class:`DeviceFacts`, stored under their names) and
    how far this node got with it."""

    request_names: list[str] = Field(default_factory=list)
    #: the fabric manager reported the device attached to this node for this claim
    attached: bool = False
    host: HostDevice | None = None
    cdi_device_ids: list[str] = Field(default_factory=list)
    #: a GPU partition's device: the placement this claim makes (recorded before it is made, so a
    #: crash in between finds it again as this claim's) and the partition made (once made)
    partition_profile: str | None = None
    partition_start: int | None = None
    partition: Partition | None = None
    #: a memory pool's share: how the claim asked for its memory (devdax or kmem)
    memory_mode: MemoryMode | None = None
    #: a memory pool's share: how its memory was handed over (once done)
    memory: MemoryRecord | None = None

    @model_serializer(mode="wrap")
    def _without_unset_shares(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A device of neither a partition nor a share is stored as before those existed: a node
        keeps its claims across an upgrade byte for byte, and a downgrade reads them still."""
        data: dict[str, Any] = handler(self)
        for name in _SHARING_FIELDS:
            if data.get(name, 0) is None:
                del data[name]
        return data

    def spec_device(self, claim_uid: str) -> cdi.SpecDevice:
        """What the claim's CDI spec says of this device."""
        return cdi.SpecDevice(
            claim_uid=claim_uid,
            request_names=tuple(self.request_names),
            host=self.host,
            partition=self.partition,
            memory=self.memory,
            **self.facts(),
        )


class ClaimEntry(_Record):
    uid: str
    namespace: str = ""
    name: str = ""
    state: ClaimState
    devices: list[PreparedDevice] = Field(default_factory=list)
    cdi_spec_files: list[str] = Field(default_factory=list)
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class CheckpointData(_Record):
    version: Literal[1] = 1
    driver: str
    node: str
    claims: dict[str, ClaimEntry] = Field(default_factory=dict)


def _canonical_text(data: dict[str, Any]) -> str:
    """The form the checksum is computed over: sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _canonical(data: dict[str, Any]) -> bytes:
    return _canonical_text(data).encode()


def _entry_json(entry: ClaimEntry) -> str:
    return _canonical_text(entry.model_dump(mode="json", by_alias=True))


class _EncodedEntries:
    """The canonical JSON of each claim entry, kept while the entry object is the same one.

    Entries are replaced, never changed in place (``put`` stores a copy), so a commit encodes only
    the entries changed since the last one: with many claims prepared on a node a commit stays
    cheap instead of growing with every claim.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[ClaimEntry, str]] = {}

    def canonical(self, data: CheckpointData) -> str:
        """``_canonical(data.model_dump(...))``, built from the cached pieces."""
        parts = []
        fresh: dict[str, tuple[ClaimEntry, str]] = {}
        for uid in sorted(data.claims):
            entry = data.claims[uid]
            cached = self._cache.get(uid)
            text = cached[1] if cached is not None and cached[0] is entry else _entry_json(entry)
            fresh[uid] = (entry, text)
            parts.append(f"{json.dumps(uid)}:{text}")
        self._cache = fresh
        return (
            f'{{"claims":{{{",".join(parts)}}},"driver":{json.dumps(data.driver)},'
            f'"node":{json.dumps(data.node)},"version":{data.version}}}'
        )

    def encode(self, data: CheckpointData) -> bytes:
        """The file's bytes: kind, version, checksum over the canonical data, the data itself."""
        canonical = self.canonical(data)
        checksum = hashlib.sha256(canonical.encode()).hexdigest()
        return (
            f'{{"kind":"{_KIND}","version":{CHECKPOINT_VERSION},"checksum":"sha256:{checksum}",'
            f'"data":{canonical}}}'
        ).encode()


def _decode(raw: bytes, path: Path) -> CheckpointData:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorrupt(f"{path} is not valid JSON ({err})") from err
    if not isinstance(doc, dict) or doc.get("kind") != _KIND:
        raise CheckpointCorrupt(f"{path} is not a fabric-dra plugin checkpoint")
    if doc.get("version") != CHECKPOINT_VERSION:
        raise CheckpointCorrupt(
            f"{path} has checkpoint version {doc.get('version')!r}; this plugin reads {CHECKPOINT_VERSION}"
        )
    body = doc.get("data")
    if not isinstance(body, dict):
        raise CheckpointCorrupt(f"{path} has no data section")
    expected = f"sha256:{hashlib.sha256(_canonical(body)).hexdigest()}"
    if doc.get("checksum") != expected:
        raise CheckpointCorrupt(f"{path} fails its checksum (the file was damaged or edited by hand)")
    try:
        return CheckpointData.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CheckpointCorrupt(f"{path} breaks the checkpoint schema at {where}: {first['msg']}") from err


_Signature = tuple[int, int, int]


def _signature(path: Path) -> _Signature | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class CheckpointStore:
    """The in-memory checkpoint, committed to ``path`` on demand."""

    def __init__(self, path: Path, *, driver: str, node: str, durable: bool = True) -> None:
        self.path = path
        self.driver = driver
        self.node = node
        self.durable = durable
        self._lock_path = path.with_name(path.name + ".lock")
        self._data = CheckpointData(driver=driver, node=node)
        self._sig: _Signature | None = None
        self._dirty: set[str] = set()
        self._inflight: set[str] = set()
        self._requested = 0
        self._flushed = 0
        self._want_durable = False
        self._flush_task: asyncio.Future[None] | None = None
        self._encoded = _EncodedEntries()
        self.writes = 0

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the file (absent: empty). Raises :class:`CheckpointCorrupt`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temp_files()
        with self._flock(fcntl.LOCK_SH):
            sig = _signature(self.path)
            if sig is None:
                self._data = CheckpointData(driver=self.driver, node=self.node)
            else:
                data = _decode(self.path.read_bytes(), self.path)
                if data.node != self.node or data.driver != self.driver:
                    raise CheckpointCorrupt(
                        f"{self.path} belongs to driver {data.driver} on node {data.node}, "
                        f"not {self.driver} on {self.node}"
                    )
                self._data = data
            self._sig = sig

    def quarantine(self) -> Path | None:
        """Move a corrupt file aside (kept for inspection) and start empty."""
        target = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            target = None  # type: ignore[assignment]
        self._data = CheckpointData(driver=self.driver, node=self.node)
        self._sig = None
        self._dirty = set(self._data.claims)
        return target

    def _remove_stale_temp_files(self) -> None:
        prefix = f".{self.path.name}."
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.path.parent):
                if name.startswith(prefix) and name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path.parent / name)

    @contextlib.contextmanager
    def _flock(self, op: int) -> Any:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, op)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def refresh(self) -> None:
        """Pick up what another plugin instance wrote since we last looked (cheap: one stat)."""
        if _signature(self.path) == self._sig:
            return
        with self._flock(fcntl.LOCK_SH):
            sig = _signature(self.path)
            if sig == self._sig:
                return
            if sig is None:
                theirs = CheckpointData(driver=self.driver, node=self.node)
            else:
                try:
                    theirs = _decode(self.path.read_bytes(), self.path)
                except CheckpointCorrupt as err:
                    log.error(
                        "checkpoint of another plugin instance is unreadable; keeping ours", error=str(err)
                    )
                    return
            self._merge(theirs)
            self._sig = sig

    def _merge(self, theirs: CheckpointData) -> None:
        mine = self._dirty | self._inflight
        merged = {uid: entry for uid, entry in theirs.claims.items() if uid not in mine}
        merged |= {uid: self._data.claims[uid] for uid in mine if uid in self._data.claims}
        self._data = CheckpointData(driver=self.driver, node=self.node, claims=merged)

    # -- reading and changing ------------------------------------------------------------------

    def get(self, uid: str) -> ClaimEntry | None:
        return self._data.claims.get(uid)

    def claims(self) -> dict[str, ClaimEntry]:
        return dict(self._data.claims)

    def put(self, entry: ClaimEntry) -> None:
        self._data.claims[entry.uid] = entry.model_copy(update={"updated_at": datetime.now(UTC)})
        self._dirty.add(entry.uid)

    def delete(self, uid: str) -> None:
        if self._data.claims.pop(uid, None) is not None:
            self._dirty.add(uid)

    # -- committing ----------------------------------------------------------------------------

    async def commit(self, *, durable: bool = True) -> None:
        """Return once every change made before this call is on disk.

        ``durable=False`` skips the fsyncs (the rename is still atomic, and visible to the next
        process after a crash of this one): for records that only guard against a process crash,
        because after a power loss the fabric's bindings tell reconcile what they said.
        """
        self._requested += 1
        wanted = self._requested
        if durable:
            self._want_durable = True
        while self._flushed < wanted:
            if self._flush_task is None or self._flush_task.done():
                self._flush_task = asyncio.ensure_future(self._flush())
            await asyncio.shield(self._flush_task)

    def commit_now(self) -> None:
        """Blocking commit for startup and shutdown, when no event loop work is pending."""
        target = self._requested = self._requested + 1
        while True:
            self.refresh()
            payload, sig = self._encoded.encode(self._data), self._sig
            if self._write(payload, sig):
                break
        self._dirty.clear()
        self._flushed = target

    async def _flush(self) -> None:
        target = self._requested
        durable, self._want_durable = self.durable and self._want_durable, False
        pending, self._dirty = self._dirty, set()
        self._inflight |= pending
        try:
            while True:
                self.refresh()
                payload, expected = self._encoded.encode(self._data), self._sig
                # fsync blocks for a disk round trip: off the event loop; a plain rename is cheap.
                written = (
                    await asyncio.to_thread(self._write, payload, expected, True)
                    if durable
                    else self._write(payload, expected, False)
                )
                if written:
                    break
        except BaseException:
            self._want_durable = self._want_durable or durable
            self._dirty |= pending
            raise
        finally:
            self._inflight -= pending
        self._flushed = max(self._flushed, target)

    def _write(self, payload: bytes, expected: _Signature | None, durable: bool = True) -> bool:
        """Write if the file is still what we last saw; False means: refresh and try again."""
        with self._flock(fcntl.LOCK_EX):
            if _signature(self.path) != expected:
                return False
            atomic_write(self.path, payload, mode=0o600, durable=durable and self.durable)
            self._sig = _signature(self.path)
            self.writes += 1
            return True
