"""The manager's ledger: *why* a device is bound (claim UID) and which operations are in flight.

The fabric is the truth for what is bound where; the ledger records intent. An attach writes its
entry (state ``attaching``) durably *before* the first request to the fabric, and a detach moves the
entry to ``detaching`` durably before unbinding, so after a crash at any point the manager knows
what it was doing and finishes or rolls it back (:mod:`fabric.bindings.reconcile`), instead of forgetting a
binding or making it twice.

The outcome of an operation (``bound``, or the entry removed after an unbind) is written without
anyone waiting for it (:meth:`Ledger.commit_soon`): its intent is durable already, and a restart
that finds ``attaching`` or ``detaching`` finishes the record from the fabric's state.

Two stores: a JSON file in ``--state-dir`` (written with :func:`plumbing.fsutil.atomic_write`:
temp file, fsync, rename) and, in a cluster, :data:`LEDGER_SHARDS` ConfigMaps
(:class:`ConfigMapLedgerStore`), each replaced with its ``resourceVersion`` so a deposed leader's
stale write fails instead of overwriting the new leader's. Shards, not one object: a real API server
refuses ConfigMap data over 1 MiB (about 3,000 entries), and a write must not cost more with every
binding. Writes are group-committed: operations that change the ledger at the same time share one
write (of the shards whose entries they changed).

An entry held by no claim (:data:`WARM_HOLDER`) belongs to the warm pool (:mod:`fabric.bindings.warm`): it
is attached and detached like a claim's, and settles in ``warm`` (bound to its node) instead of
``bound``; :meth:`Ledger.warm_held_on` finds a node's.

Each node may hold at most :attr:`Ledger.max_entries_per_node` entries (:meth:`Ledger.admit`), so no
node's token can take the ledger, or the pool, for itself.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from manager_api.errors import FabricUnavailable, NodeBindingLimit, NotLeader
from plumbing.backoff import Backoff
from plumbing.fsutil import atomic_write
from plumbing.kube.client import AlreadyExists, ApiError, ApiUnavailable, Conflict, KubeClient, NotFound
from plumbing.kube.resources import CONFIGMAPS
from plumbing.logs import get_logger
from plumbing.names import is_label_value

__all__ = [
    "DEFAULT_MAX_ENTRIES_PER_NODE",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_WRITE_DEADLINE",
    "LEDGER_LABEL",
    "LEDGER_SHARDS",
    "MIGRATED_ANNOTATION",
    "PARTITIONS_HOLDER",
    "WARM_HOLDER",
    "ConfigMapLedgerStore",
    "FileLedgerStore",
    "Ledger",
    "LedgerDocument",
    "LedgerEntry",
    "LedgerError",
    "LedgerState",
    "LedgerStore",
    "PartitionHold",
    "ResetState",
    "ShareRecord",
    "shard_names",
    "shard_of",
    "share_key",
]

log = get_logger(__name__)
#: the key of the ledger document in each ConfigMap (a shard, or the single one of earlier releases)
_DATA_KEY = "ledger.json"
#: labels the shards of one ledger (its value: the ledger's name)
LEDGER_LABEL = "fabric-dra.io/ledger"
#: on the emptied single ConfigMap of earlier releases: where its entries went
MIGRATED_ANNOTATION = "fabric-dra.io/migrated-to"
#: the number of ConfigMaps the ledger is spread over. A ConfigMap holds 1 MiB of data
#: (``ValidateConfigMap``, k8s.io/kubernetes pkg/apis/core/validation) and an entry takes about
#: 310 bytes, so 256 shards hold about 850,000 entries. What a write costs grows with its shard:
#: at 10,000 bindings a shard holds ~40 entries (12 KB), at 100,000 ~390 (120 KB). Fixed: a
#: device's shard must not move between releases.
LEDGER_SHARDS = 256
#: digits of a shard's number in its name (``<name>-000`` … ``<name>-255``)
_SHARD_DIGITS = len(str(LEDGER_SHARDS - 1))
#: shard reads and writes in flight at once: a load reads all of them, and the client's
#: connections are shared with the Lease's renewal, which must not queue behind them
_SHARD_REQUESTS = 16
#: refuse to write a shard above this (the server's limit is 1,048,576 bytes of data)
_SHARD_DATA_LIMIT = 1024 * 1024
#: how long one shard's write keeps trying through timeouts, 5xx/429 answers and conflicts with
#: its own earlier attempt: the intent write runs inside an attach's REST request, whose callers
#: wait 20 s or more (the plugin's attach), so a slow API server is ridden out within it
DEFAULT_WRITE_DEADLINE = 15.0
#: one request of a shard write at most (a PUT of a shard takes milliseconds on a sane server):
#: the next attempt is made within the deadline instead of waiting the client's 30 s out
DEFAULT_REQUEST_TIMEOUT = 5.0
#: conflicts of one shard write with another writer (not with its own timed-out attempt) before
#: it steps back (client-go's RetryOnConflict re-reads and retries the same way; a second conflict
#: with someone else means another replica writes now)
_FOREIGN_CONFLICTS = 2
#: the pauses between attempts (doubling, with jitter)
_RETRY_INITIAL = 0.05
_RETRY_MAXIMUM = 1.0
#: far above what one node is ever given (a node of 8 GPUs and a few CXL memory devices cut into
#: chunks holds tens), far below what would let one node take a pool of thousands of devices
DEFAULT_MAX_ENTRIES_PER_NODE = 512


#: the longest error message an entry keeps: the fabric writes it, and it must not fill a shard
ERROR_MAX_LENGTH = 1024


def _cap_error(message: str | None) -> str | None:
    if message is None or len(message) <= ERROR_MAX_LENGTH:
        return message
    return message[: ERROR_MAX_LENGTH - 1] + "…"


class LedgerState(StrEnum):
    ATTACHING = "attaching"  # intent to bind recorded; the fabric may or may not have done it yet
    BOUND = "bound"  # the fabric confirmed the binding
    DETACHING = "detaching"  # intent to unbind recorded (a detach, or the rollback of a failed attach)
    #: bound to a node with no claim, kept ready for the next claim there (:mod:`fabric.bindings.warm`)
    WARM = "warm"

    @property
    def settled(self) -> bool:
        """No operation in flight: the fabric holds the binding the entry names."""
        return self in (LedgerState.BOUND, LedgerState.WARM)


#: the ``claim_uid`` of an entry held for the warm pool: no claim UID is empty (the API refuses one)
WARM_HOLDER = ""
#: the ``claim_uid`` of a GPU's entry while it serves partitions: its holders are the entry's
#: ``partitions`` (no claim UID is this: the API takes UUIDs only)
PARTITIONS_HOLDER = "partitions"


def share_key(pool: str, share_id: str) -> str:
    """The ledger key of a share of memory pool ``pool``: ``<pool>/<shareID>`` (a device name is a
    DNS label, so no device's key has a slash)."""
    return f"{pool}/{share_id}"


class PartitionHold(BaseModel):
    """One partition of a GPU held by one claim (the GPU's node is the entry's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str
    claim_uid: str


class ShareRecord(BaseModel):
    """A share of a memory pool: the chunk carved for it and the Connection that gives it to the
    node, each recorded durably as soon as the fabric made it (docs/manager.md "Partitions and
    shares")."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pool: str = Field(description="the pool's device name")
    share_id: str
    memory_bytes: int = Field(description="what the allocation consumed")
    chunk_mib: int = Field(description="the chunk's size asked of the fabric (rounded up per the domain)")
    chunk: str | None = Field(default=None, description="@odata.id of the chunk, once made")
    connection: str | None = Field(default=None, description="@odata.id of the memory Connection, once made")


class ResetState(StrEnum):
    """Whether a warm device is clean for the next claim (docs/manager.md "Hygiene between
    tenants"). A warm entry without one (written before resets were recorded) is not."""

    PENDING = "pending"  # served a claim; not to be handed to another before its reset
    DONE = "done"  # hot-added for the pool, or reset since its last claim


class LedgerEntry(BaseModel):
    # validate_assignment: an error set on a live entry is capped too
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
    error: Annotated[str | None, AfterValidator(_cap_error)] = None
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    #: the namespace of the claim that holds the device, or held it last (a warm device's last tenant)
    namespace: str | None = None
    #: a warm device's: done once hot-added for the pool or reset, pending when a claim gave it
    #: back; none while a claim holds it (and on warm entries of earlier ledgers: reset them)
    reset: ResetState | None = None
    #: a GPU serving partitions (``claim_uid`` is :data:`PARTITIONS_HOLDER`): who holds which
    partitions: list[PartitionHold] = Field(default_factory=list)
    #: a share of a memory pool (the entry's key is :func:`share_key`): its chunk and Connection
    share: ShareRecord | None = None

    @property
    def partition_held(self) -> bool:
        """The GPU is bound to its node for partitions, not for one claim."""
        return self.claim_uid == PARTITIONS_HOLDER

    @property
    def clean(self) -> bool:
        """No reset due: hot-added for the pool, or reset since its last claim."""
        return self.reset is ResetState.DONE

    @property
    def warm_held(self) -> bool:
        """Held for the warm pool (being attached to warm up, warm, or being detached from warm),
        not for a claim."""
        return self.claim_uid == WARM_HOLDER


class LedgerDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["FabricDraLedger"] = "FabricDraLedger"
    version: Literal[1] = 1
    entries: dict[str, LedgerEntry] = Field(default_factory=dict)


#: an empty document's JSON up to its entries' opening brace: ``{"kind":…,"entries":{``
_DOCUMENT_HEAD = LedgerDocument().model_dump_json().removesuffix("}}")


class LedgerError(FabricUnavailable):
    """The ledger could not be read or written; nothing touches the fabric without it."""


class LedgerStore(ABC):
    @abstractmethod
    async def load(self) -> dict[str, LedgerEntry]:
        """Every entry, by device."""

    @abstractmethod
    async def save(self, entries: Mapping[str, LedgerEntry], changed: Collection[str]) -> None:
        """Make durable what each device in ``changed`` now is in ``entries`` (absent: removed).

        ``entries`` is the whole live ledger (a store of one document writes all of it); the
        store encodes what it writes before its first ``await``, as the entries keep changing."""

    @abstractmethod
    def describe(self) -> str: ...


class FileLedgerStore(LedgerStore):
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "ledger.json"

    def describe(self) -> str:
        return str(self.path)

    async def load(self) -> dict[str, LedgerEntry]:
        def read() -> LedgerDocument:
            if not self.path.exists():
                return LedgerDocument()
            return LedgerDocument.model_validate_json(self.path.read_bytes())

        try:
            return dict((await asyncio.to_thread(read)).entries)
        except (OSError, ValidationError, ValueError) as err:
            raise LedgerError(f"cannot read the ledger {self.path}: {_first_line(err)}") from None

    async def save(self, entries: Mapping[str, LedgerEntry], changed: Collection[str]) -> None:
        payload = LedgerDocument.model_construct(entries=dict(entries)).model_dump_json(indent=1)
        try:
            await asyncio.to_thread(atomic_write, self.path, payload, mode=0o600)
        except OSError as err:
            raise LedgerError(f"cannot write the ledger {self.path}: {err}") from None


class ConfigMapLedgerStore(LedgerStore):
    """The ledger in :data:`LEDGER_SHARDS` ConfigMaps ``<name>-000`` … ``<name>-255``, a device's
    entry in the shard :func:`shard_of` names; each shard written as a compare-and-swap on its
    ``resourceVersion``, and only the shards whose entries changed.

    Fixed names, so that RBAC can name every object the manager changes (deploy/base/manager-rbac.yaml
    lists them); a fixed number, so that a device's shard never moves. The ConfigMap ``<name>``
    itself is the ledger of earlier releases (every entry in one object): :meth:`load` moves its
    entries into the shards and empties it (:meth:`_migrate`).
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        write_deadline: float = DEFAULT_WRITE_DEADLINE,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.write_deadline = write_deadline
        self.request_timeout = request_timeout
        #: shard writes that needed more than one attempt, and attempts that failed (metrics, tests)
        self.retried_writes = 0
        self.failed_attempts = 0
        self._versions: dict[int, str] = {}
        #: the devices of each shard (a write carries its shard's entries, found here)
        self._members: list[set[str]] = [set() for _ in range(LEDGER_SHARDS)]
        #: each entry's JSON as last written: a write encodes only the entries that changed and
        #: joins the others' (encoding a shard's 150 entries at 10,000 bindings took 2 ms a write)
        self._encoded: dict[str, str] = {}
        self._requests = asyncio.Semaphore(_SHARD_REQUESTS)

    def describe(self) -> str:
        last = LEDGER_SHARDS - 1
        return f"configmaps {self.namespace}/{self.shard_name(0)}..{last:0{_SHARD_DIGITS}d}"

    def shard_name(self, shard: int) -> str:
        return shard_names(self.name)[shard]

    async def load(self) -> dict[str, LedgerEntry]:
        shards = await asyncio.gather(*(self._read_shard(i) for i in range(LEDGER_SHARDS)))
        entries: dict[str, LedgerEntry] = {}
        # Nothing encoded here: a shard's entries are encoded when it is first written (a restart
        # reads 10,000 entries and then writes a few of them).
        self._encoded = {}
        for shard, found in enumerate(shards):
            self._members[shard] = set(found)
            entries.update(found)
        await self._migrate(entries)
        return entries

    async def _read_shard(self, shard: int) -> dict[str, LedgerEntry]:
        name = self.shard_name(shard)
        deadline = time.monotonic() + self.write_deadline
        backoff = Backoff(_RETRY_INITIAL, _RETRY_MAXIMUM)
        while True:
            try:
                async with self._requests:
                    obj = await self.client.get(
                        CONFIGMAPS, name, self.namespace, request_timeout=self._timeout(deadline)
                    )
                break
            except NotFound:
                self._versions.pop(shard, None)
                return {}
            except ApiUnavailable as err:
                if not await self._pause(backoff, deadline):
                    raise LedgerError(
                        f"cannot read the ledger configmap {self.namespace}/{name} within "
                        f"{self.write_deadline:g} s: {err}"
                    ) from None
            except ApiError as err:
                raise LedgerError(
                    f"cannot read the ledger configmap {self.namespace}/{name}: {err}"
                ) from None
        self._versions[shard] = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        document = self._parse(obj, name)
        misplaced = sorted(d for d in document.entries if shard_of(d) != shard)
        if misplaced:
            raise LedgerError(
                f"the ledger configmap {self.namespace}/{name} holds entries of another shard: "
                f"{', '.join(misplaced[:5])}"
            )
        return dict(document.entries)

    def _parse(self, obj: Mapping[str, Any], name: str) -> LedgerDocument:
        raw = (obj.get("data") or {}).get(_DATA_KEY)
        try:
            return LedgerDocument.model_validate_json(raw) if raw else LedgerDocument()
        except (ValidationError, ValueError) as err:
            raise LedgerError(
                f"the ledger configmap {self.namespace}/{name} is corrupt: {_first_line(err)}"
            ) from None

    async def _migrate(self, entries: dict[str, LedgerEntry]) -> None:
        """Move the entries of an earlier release's single ConfigMap into the shards.

        Crash-safe: the old object is emptied only after every entry it holds is in its shard,
        and only if it is unchanged since it was read, so a crash or a race at any point leaves
        every entry readable in one place or the other, and the next load finishes the move. An
        entry already in a shard stays as it is: shards are only written by this release. The
        old object is emptied, not deleted, so the manager needs no right to delete ConfigMaps."""
        try:
            old = await self.client.get(CONFIGMAPS, self.name, self.namespace)
        except NotFound:
            return
        except ApiError as err:
            raise LedgerError(
                f"cannot read the ledger configmap {self.namespace}/{self.name}: {err}"
            ) from None
        legacy = self._parse(old, self.name).entries
        if not legacy:
            return
        moved = {device: entry for device, entry in legacy.items() if device not in entries}
        entries.update(moved)
        await self.save(entries, list(moved))
        metadata = dict(old.get("metadata") or {})
        annotations = {**(metadata.get("annotations") or {}), MIGRATED_ANNOTATION: self.describe()}
        emptied = {
            "metadata": {**metadata, "annotations": annotations},
            "data": {_DATA_KEY: LedgerDocument().model_dump_json(indent=1)},
        }
        try:
            await self.client.replace(CONFIGMAPS, emptied)
        except (Conflict, NotFound):
            raise LedgerError(
                f"the ledger configmap {self.namespace}/{self.name} changed while it was migrated; "
                "migrating again"
            ) from None
        except ApiError as err:
            raise LedgerError(
                f"cannot empty the migrated ledger configmap {self.namespace}/{self.name}: {err}"
            ) from None
        log.info(
            "ledger migrated to its shards",
            ledger=self.describe(),
            entries=len(legacy),
            moved=len(moved),
        )

    async def save(self, entries: Mapping[str, LedgerEntry], changed: Collection[str]) -> None:
        touched: set[int] = set()
        for device in changed:
            shard = shard_of(device)
            touched.add(shard)
            entry = entries.get(device)
            if entry is not None:
                self._members[shard].add(device)
                self._encoded[device] = _entry_json(entry)
            else:
                self._members[shard].discard(device)
                self._encoded.pop(device, None)
        # Encoded here, before the first await: the entries keep changing.
        bodies = [(shard, self._body(shard, entries)) for shard in sorted(touched)]
        results = await asyncio.gather(*(self._write(s, body) for s, body in bodies), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _encoding(self, device: str, entries: Mapping[str, LedgerEntry]) -> str:
        """The entry's JSON as last written, or encoded now (an entry loaded and not written since)."""
        encoded = self._encoded.get(device)
        if encoded is None:
            encoded = self._encoded[device] = _entry_json(entries[device])
        return encoded

    def _body(self, shard: int, entries: Mapping[str, LedgerEntry]) -> dict[str, Any]:
        members = sorted(self._members[shard])
        # A LedgerDocument, joined from the entries' JSON (tests/unit/fabric/test_ledger.py reads it back).
        joined = ",".join(f"{json.dumps(d)}:{self._encoding(d, entries)}" for d in members)
        payload = _DOCUMENT_HEAD + joined + "}}"
        if len(payload) > _SHARD_DATA_LIMIT:
            # Refused here with a message an operator can act on, rather than by the server.
            raise LedgerError(
                f"the ledger configmap {self.namespace}/{self.shard_name(shard)} would hold "
                f"{len(members)} entries ({len(payload)} bytes), beyond a ConfigMap's 1 MiB"
            )
        labels = {"app.kubernetes.io/name": "fabric-dra", "app.kubernetes.io/component": "manager"}
        if is_label_value(self.name):  # (a name of more than 63 characters is no label value)
            labels[LEDGER_LABEL] = self.name
        return {
            "metadata": {"name": self.shard_name(shard), "namespace": self.namespace, "labels": labels},
            "data": {_DATA_KEY: payload},
        }

    async def _write(self, shard: int, body: dict[str, Any]) -> None:
        async with self._requests:
            await self._write_shard(shard, body)

    async def _write_shard(self, shard: int, body: dict[str, Any]) -> None:
        """One shard replaced (or created) as a compare-and-swap on its resourceVersion, riding out
        a slow or failing API server within :attr:`write_deadline`:

        * a timeout, an unreachable server, 5xx or 429: tried again after a pause (:class:`Backoff`);
          such an attempt may have been stored all the same;
        * 409 Conflict (or AlreadyExists) right after such an attempt: most likely that attempt,
          stored after all — the shard's version is read again and the write made once more (the
          same content; this replica's view wins, the fabric decides what is bound);
        * a conflict with another writer (a deposed leader's last write landing after this replica
          took over): overwritten once; the second means another replica writes now, so this one
          steps back (:class:`NotLeader`);
        * anything else the server refuses (422, 403, 413...): at once, as it will not change.
        """
        name = self.shard_name(shard)
        deadline = time.monotonic() + self.write_deadline
        backoff = Backoff(_RETRY_INITIAL, _RETRY_MAXIMUM)
        foreign = attempts = 0
        maybe_stored = False  # the last attempt failed in a way that may have been stored
        last: ApiError | None = None

        def out_of_time() -> LedgerError:
            # said with the server's last answer: an attempt squeezed into the deadline's last
            # few milliseconds would only report its own timeout
            return LedgerError(
                f"cannot write the ledger configmap {self.namespace}/{name} within "
                f"{self.write_deadline:g} s ({attempts} attempts): {last}"
            )

        while True:
            if attempts and time.monotonic() >= deadline:
                raise out_of_time()
            attempts += 1
            cut_short = self._timeout(deadline) < self.request_timeout  # by the deadline
            try:
                await self._put_shard(shard, body, deadline)
            except NotFound as err:
                self._versions.pop(shard, None)  # deleted behind our back: created afresh
                maybe_stored, last = False, err
            except (Conflict, AlreadyExists) as err:
                self.failed_attempts += 1
                if not maybe_stored:
                    foreign += 1
                    if foreign >= _FOREIGN_CONFLICTS:
                        raise NotLeader(
                            f"the ledger configmap {self.namespace}/{name} is being changed by "
                            "another manager replica",
                            retry_after=2.0,
                        ) from None
                    log.warning("ledger shard changed by another replica; overwriting it", ledger=name)
                maybe_stored, last = False, err
                if not await self._refresh_version(shard, deadline):
                    raise out_of_time() from None
            except ApiUnavailable as err:
                # tried again as it was: if this attempt was stored after all, the next one
                # conflicts with it, and that conflict is known for what it is
                self.failed_attempts += 1
                maybe_stored = True
                if not (cut_short and err.reason == "Timeout" and last is not None):
                    last = err  # (a timeout the deadline imposed says less than the answer before it)
                if not await self._pause(backoff, deadline):
                    raise out_of_time() from None
            except ApiError as err:
                raise LedgerError(
                    f"cannot write the ledger configmap {self.namespace}/{name}: {err}"
                ) from None
            else:
                if attempts > 1:
                    self.retried_writes += 1
                    log.info("ledger shard written after retries", ledger=name, attempts=attempts)
                return

    async def _put_shard(self, shard: int, body: dict[str, Any], deadline: float) -> None:
        version = self._versions.get(shard)
        timeout = self._timeout(deadline)
        if version is None:
            saved = await self.client.create(CONFIGMAPS, body, self.namespace, request_timeout=timeout)
        else:
            metadata = {**body["metadata"], "resourceVersion": version}
            saved = await self.client.replace(
                CONFIGMAPS, {**body, "metadata": metadata}, request_timeout=timeout
            )
        self._versions[shard] = str((saved.get("metadata") or {}).get("resourceVersion") or "")

    def _timeout(self, deadline: float) -> float:
        return max(0.05, min(self.request_timeout, deadline - time.monotonic()))

    @staticmethod
    async def _pause(backoff: Backoff, deadline: float) -> bool:
        """Wait before the next attempt; False when the deadline leaves no room for one."""
        left = deadline - time.monotonic()
        if left <= 0.05:
            return False
        await asyncio.sleep(min(backoff.next(), left - 0.05))
        return True

    async def _refresh_version(self, shard: int, deadline: float | None = None) -> bool:
        """Read the shard's current resourceVersion (none: it does not exist); False when it
        could not be read before ``deadline``."""
        name = self.shard_name(shard)
        deadline = deadline if deadline is not None else time.monotonic() + self.write_deadline
        backoff = Backoff(_RETRY_INITIAL, _RETRY_MAXIMUM)
        while True:
            try:
                current = await self.client.get(
                    CONFIGMAPS, name, self.namespace, request_timeout=self._timeout(deadline)
                )
            except NotFound:
                self._versions.pop(shard, None)
                return True
            except ApiUnavailable:
                if not await self._pause(backoff, deadline):
                    return False
                continue
            except ApiError as err:
                raise LedgerError(
                    f"cannot read the ledger configmap {self.namespace}/{name}: {err}"
                ) from None
            self._versions[shard] = str((current.get("metadata") or {}).get("resourceVersion") or "")
            return True


def _entry_json(entry: LedgerEntry) -> str:
    """An entry as a shard holds it: without the fields at their defaults (no error, no task, no
    partitions...), which read back as the same entry. A shard is rewritten whole on each change
    of one of its entries, and both sides parse it: at 10,000 bindings a shard holds ~40 entries,
    and this is a quarter of each write (356 → 264 bytes an entry bound to a claim)."""
    return entry.model_dump_json(exclude_defaults=True)


def shard_of(device: str) -> int:
    """The shard of a device's entry: CRC-32 of its name (stable across processes and releases,
    unlike ``hash()``), modulo :data:`LEDGER_SHARDS`."""
    return zlib.crc32(device.encode()) % LEDGER_SHARDS


@functools.cache
def shard_names(name: str) -> tuple[str, ...]:
    """The ConfigMap names of the shards of the ledger ``name``."""
    return tuple(f"{name}-{shard:0{_SHARD_DIGITS}d}" for shard in range(LEDGER_SHARDS))


class Ledger:
    """The in-memory ledger of this replica, saved through a :class:`LedgerStore`.

    ``max_entries_per_node`` bounds what one node may hold (:meth:`admit`): entries are small
    (names and UIDs are validated at the API), so this bounds each node's share of the ledger."""

    def __init__(
        self, store: LedgerStore, *, max_entries_per_node: int = DEFAULT_MAX_ENTRIES_PER_NODE
    ) -> None:
        self.store = store
        self.max_entries_per_node = max_entries_per_node
        self._entries: dict[str, LedgerEntry] = {}
        self._per_node: Counter[str] = Counter()
        #: node → devices held for the warm pool there, and device → that node (an entry changes
        #: in place before it is put again, so its old holder is looked up here, not on it)
        self._warm: dict[str, set[str]] = {}
        self._warm_node: dict[str, str] = {}
        #: pool → the keys of its shares' entries
        self._shares: dict[str, set[str]] = {}
        self._dirty: set[str] = set()
        self._changes = 0
        self._saved = 0
        self._write_lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None
        #: told the device whose entry was put or removed, or None when the whole ledger was loaded
        self.listeners: list[Callable[[str | None], None]] = []

    async def load(self) -> None:
        self._entries = await self.store.load()
        self._per_node = Counter(entry.node for entry in self._entries.values())
        self._warm, self._warm_node = {}, {}
        self._shares = {}
        for entry in self._entries.values():
            self._index_warm(entry)
            self._index_share(entry)
        self._dirty = set()
        self._changes = self._saved = 0
        for listener in self.listeners:
            listener(None)
        log.info("ledger loaded", ledger=self.store.describe(), entries=len(self._entries))

    def get(self, device: str) -> LedgerEntry | None:
        return self._entries.get(device)

    def entries(self) -> list[LedgerEntry]:
        return list(self._entries.values())

    def entries_of(self, node: str) -> int:
        return self._per_node[node]

    def warm_held_on(self, node: str) -> list[LedgerEntry]:
        """The entries held for the warm pool on ``node`` (warming, warm or cooling)."""
        return [self._entries[d] for d in sorted(self._warm.get(node, ()))]

    def shares_of(self, pool: str) -> list[LedgerEntry]:
        """The entries of memory pool ``pool``'s shares (being made, made, being released)."""
        return [self._entries[k] for k in sorted(self._shares.get(pool, ()))]

    def _index_share(self, entry: LedgerEntry) -> None:
        if entry.share is not None:
            self._shares.setdefault(entry.share.pool, set()).add(entry.device)

    def _unindex_share(self, entry: LedgerEntry | None) -> None:
        if entry is not None and entry.share is not None:
            keys = self._shares.get(entry.share.pool)
            if keys is not None:
                keys.discard(entry.device)
                if not keys:
                    del self._shares[entry.share.pool]

    def count_warm(self) -> int:
        """How many entries are warm (held for the warm pool, bound, no claim), from the index."""
        return sum(
            1 for held in self._warm.values() for d in held if self._entries[d].state is LedgerState.WARM
        )

    def warm_nodes(self) -> list[str]:
        """The nodes with entries held for the warm pool."""
        return sorted(self._warm)

    def _index_warm(self, entry: LedgerEntry) -> None:
        self._unindex_warm(entry.device)
        if entry.warm_held:
            self._warm.setdefault(entry.node, set()).add(entry.device)
            self._warm_node[entry.device] = entry.node

    def _unindex_warm(self, device: str) -> None:
        node = self._warm_node.pop(device, None)
        if node is not None:
            held = self._warm[node]
            held.discard(device)
            if not held:
                del self._warm[node]

    def admit(self, node: str, device: str) -> None:
        """Refuse a new entry for ``node`` once it holds :attr:`max_entries_per_node` (only that
        node is refused; the others keep attaching)."""
        held = self._per_node[node]
        if held >= self.max_entries_per_node:
            raise NodeBindingLimit(
                f"node {node} holds {held} devices (bound or in flight), the most one node may hold "
                f"(--max-bindings-per-node); detach one before attaching {device}",
                device=device,
                node=node,
            )

    def put(self, entry: LedgerEntry) -> None:
        entry.updated_at = datetime.now(UTC)
        self._forget(self._entries.get(entry.device))
        self._entries[entry.device] = entry
        self._per_node[entry.node] += 1
        self._index_warm(entry)
        self._index_share(entry)
        self._changed(entry.device)

    def remove(self, device: str) -> None:
        entry = self._entries.pop(device, None)
        self._unindex_warm(device)
        self._unindex_share(entry)
        if entry is not None:
            self._forget(entry)
            self._changed(device)

    def _forget(self, entry: LedgerEntry | None) -> None:
        if entry is None:
            return
        self._per_node[entry.node] -= 1
        if self._per_node[entry.node] <= 0:
            del self._per_node[entry.node]

    def _changed(self, device: str) -> None:
        self._dirty.add(device)
        self._changes += 1
        for listener in self.listeners:
            listener(device)

    async def commit(self) -> None:
        """Return once every change made so far is durable (one write may cover many callers)."""
        wanted = self._changes
        async with self._write_lock:
            if self._saved >= wanted:
                return
            covered = self._changes
            changed, self._dirty = self._dirty, set()
            try:
                # No copy of the entries: every store encodes what it writes before its first
                # await, so no change can slip in half-way (a later change to an entry in this
                # write would only be saved early; it stays dirty for the next write too).
                await self.store.save(self._entries, changed)
            except BaseException:
                self._dirty |= changed  # the next write carries them
                raise
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
