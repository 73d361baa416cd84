"""Device-seconds: what each device spent bound to a claim, warm, attaching, detaching, or bound
outside fabric-dra — by namespace, model and the claim's owning workload — kept in a durable record
beside the ledger so that restarts and leader changes lose nothing (docs/manager.md, "Accounting").

* **Counting.** The leader's :class:`UsageMeter` adds, at every :meth:`UsageMeter.tick` (every
  :data:`TICK_SECONDS`, and before every scrape, write and ``GET /api/v1/usage``), the time since
  the previous tick to each ledger entry's key (namespace, model, workload, state) and to each
  device the fabric binds outside fabric-dra (state ``outside``); and at every change of an entry
  (put or removed), the time since it was last counted to the key it had, so a state's seconds end
  when the state does, not at the next tick. An entry the meter has not seen before counts from
  its ledger ``updated_at`` when that is later, so a new attach is not charged for the time before
  it existed. Seconds are split at hour boundaries into hourly buckets
  (:func:`split_hours`). The entries are counted in groups, by key and by when they were last
  counted: every entry counted up to the last tick is in one group of its key, so a tick costs
  the distinct keys and the entries changed since the previous tick, not the ledger (a scrape of
  a manager holding 10,000 bindings walked all of them: docs/performance.md, "Fleet scale").
* **Attribution.** A claim's namespace and workload come from the claim itself, as the manager's
  informer of ResourceClaims sees it: the workload is the claim's controller ``ownerReference``
  (``Kind/name``; for a claim made from a pod's ``resourceClaimTemplate``, the Pod), else
  ``ResourceClaim/<name>``. Following the chain further (Pod → ReplicaSet → Deployment) would need
  ``get`` on pods and replicasets in every namespace, which the manager does not have. Remembered
  per claim UID, so a claim deleted before its device is detached keeps its attribution — and with
  it the claim's values of the attribution label keys (:mod:`fabric.bindings.attribution`), kept in
  the key so that reports by label read the same after a restart.
* **Durable.** :meth:`UsageMeter.flush` (every :data:`FLUSH_SECONDS`, on losing leadership, at
  shutdown) writes the buckets and the lifetime totals with ``countedUntil``, the time up to which
  everything is counted, through a :class:`UsageStore` of the ledger's kind (a file beside
  ``ledger.json``, or one ConfigMap replaced with its ``resourceVersion``). A new leader, or a
  restarted manager, loads the record and counts from ``countedUntil``: the time the manager was
  down is charged to what the durable ledger says each device was doing.
* **Bounded.** Hourly buckets older than :data:`RETENTION` are dropped; a ConfigMap holds its
  record gzipped (``binaryData``), and when even that would pass 1 MiB the oldest buckets go first.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fabric.bindings.attribution import UNLABELLED, Attribution, claim_labels, label_values
from fabric.bindings.warm_policy import model_of
from fabric.state.claims import ClaimView
from fabric.state.configmap_doc import ConfigMapDocument
from fabric.state.inventory import DeviceFacts, Inventory
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState
from manager_api import models as api
from manager_api.errors import FabricError, FabricUnavailable
from manager_api.partitions import parse_partition
from plumbing.fsutil import atomic_write
from plumbing.kube.client import AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.dra import ResourceClaim
from plumbing.logs import get_logger

__all__ = [
    "BUCKET",
    "FLUSH_SECONDS",
    "MEMORY_GIB",
    "PARTITION",
    "RETENTION",
    "TICK_SECONDS",
    "ConfigMapUsageStore",
    "FileUsageStore",
    "UsageBook",
    "UsageError",
    "UsageKey",
    "UsageMeter",
    "UsageRecord",
    "UsageStore",
    "split_hours",
    "usage_record_name",
    "workload_of",
]

log = get_logger(__name__)

#: the width of a bucket: a report starts at the hour its ``since`` falls in
BUCKET = timedelta(hours=1)
#: how long a bucket is kept: 7 days of 24 = 168 buckets
RETENTION = timedelta(days=7)
#: how often the leader integrates the ledger between scrapes
TICK_SECONDS = 5.0
#: how often the record is written: what a kill -9 can lose, at most, of a device whose ledger entry
#: changed or went in that time (docs/manager.md, "Accounting")
FLUSH_SECONDS = 30.0
#: the ConfigMap's key of the gzipped record (``binaryData``: the API server counts its decoded size)
_DATA_KEY = "usage.json.gz"
#: stay under a ConfigMap's 1 MiB of data (the server's limit is 1,048,576 decoded bytes)
_DATA_LIMIT = 1000 * 1024

OUTSIDE = "outside"
#: two measures kept as states of their own in the same buckets (a record without them reads as 0):
#: a GPU partition's seconds at its share of the GPU, and a memory share's GiB-seconds
PARTITION = api.USAGE_PARTITION
MEMORY_GIB = api.USAGE_MEMORY_GIB


class UsageKey(NamedTuple):
    namespace: str
    model: str
    #: ``Kind/name`` of the claim's owner; "" when no claim holds the device
    workload: str
    state: str
    #: the claim's values of the attribution label keys, canonical JSON; "" for none
    #: (:func:`fabric.bindings.attribution.claim_labels`)
    labels: str = ""


#: what one ledger entry's seconds count to: (key, weight) pairs
_Keys = tuple[tuple[UsageKey, float], ...]


#: the group "since" of every entry counted up to the last tick (:class:`UsageMeter`)
_COUNTED = datetime.min.replace(tzinfo=UTC)


@dataclass(slots=True)
class _Opened:
    """A ledger entry as the meter counts it: the keys its seconds go to, since when it is not
    counted (once a tick has passed since ``tick``, the meter's last tick) and the claims it holds
    (whose owners are kept while it does)."""

    keys: _Keys
    since: datetime
    tick: int
    holders: tuple[str, ...]


#: what keys were made without: a claim's owner (True, its UID) or a device's model (False, its name)
_Missing = tuple[tuple[bool, str], ...]


class UsageError(FabricUnavailable):
    """The usage record could not be read or written."""


def usage_record_name(ledger_name: str) -> str:
    """The ConfigMap of the usage record of the ledger ``ledger_name`` (RBAC names it)."""
    return f"{ledger_name}-usage"


def hour_of(moment: datetime) -> datetime:
    """The start of the bucket ``moment`` falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def split_hours(start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """``[start, end)`` as (bucket start, seconds in that bucket), in order; empty when ``end`` is
    not after ``start``. The seconds add up to ``end - start`` exactly (no bucket is rounded)."""
    parts: list[tuple[datetime, float]] = []
    cursor = start
    while cursor < end:
        bucket = hour_of(cursor)
        stop = min(end, bucket + BUCKET)
        parts.append((bucket, (stop - cursor).total_seconds()))
        cursor = stop
    return parts


def workload_of(claim: ResourceClaim) -> str:
    """``Kind/name`` of the claim's controller owner (the first owner when none is the controller);
    ``ResourceClaim/<name>`` for a claim nothing owns."""
    owners = claim.metadata.owner_references
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if owner and owner.get("kind") and owner.get("name"):
        return f"{owner['kind']}/{owner['name']}"
    return f"ResourceClaim/{claim.metadata.name}"


class UsageRecord(BaseModel):
    """The durable record: what :class:`UsageBook` keeps, in compact rows."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: Literal["FabricDraUsage"] = "FabricDraUsage"
    version: Literal[1] = 1
    counted_until: datetime | None = Field(default=None, alias="countedUntil")
    #: (namespace, model, state, seconds) since the record began: the Prometheus counter
    totals: list[tuple[str, str, str, float]] = Field(default_factory=list)
    #: every (namespace, model, workload, state[, labels]) the buckets name, once: a bucket's row names
    #: its key by index, so a week of buckets repeats numbers, not names (no labels: four, as before)
    keys: list[tuple[str, str, str, str] | tuple[str, str, str, str, str]] = Field(default_factory=list)
    #: (labels, model, state, seconds) since the record began, for the labelled keys: the
    #: attribution counter (absent in a record written before attribution: empty)
    label_totals: list[tuple[str, str, str, float]] = Field(default_factory=list, alias="labelTotals")
    #: bucket start (RFC 3339) → (index in ``keys``, seconds)
    buckets: dict[str, list[tuple[int, float]]] = Field(default_factory=dict)


@dataclass
class UsageBook:
    """Device-seconds in hourly buckets, plus lifetime totals by (namespace, model, state)."""

    hours: dict[datetime, dict[UsageKey, float]] = field(default_factory=dict)
    totals: dict[tuple[str, str, str], float] = field(default_factory=dict)
    counted_until: datetime | None = None
    #: lifetime seconds by (labels, model, state) of the keys that carry labels
    label_totals: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def add(self, key: UsageKey, start: datetime, end: datetime, weight: float = 1.0) -> None:
        """``[start, end)`` to ``key``, each second counted ``weight`` times (a partition's share of
        its GPU, a share's GiB)."""
        for bucket, whole in split_hours(start, end):
            seconds = whole * weight
            row = self.hours.setdefault(bucket, {})
            row[key] = row.get(key, 0.0) + seconds
            total = (key.namespace, key.model, key.state)
            self.totals[total] = self.totals.get(total, 0.0) + seconds
            if key.labels:
                labelled = (key.labels, key.model, key.state)
                self.label_totals[labelled] = self.label_totals.get(labelled, 0.0) + seconds

    def merged(self, other: UsageBook) -> UsageBook:
        """This book plus ``other``'s seconds; ``counted_until`` the later of the two."""
        result = UsageBook(
            {hour: dict(rows) for hour, rows in self.hours.items()},
            dict(self.totals),
            self.counted_until,
            dict(self.label_totals),
        )
        for hour, rows in other.hours.items():
            into = result.hours.setdefault(hour, {})
            for key, seconds in rows.items():
                into[key] = into.get(key, 0.0) + seconds
        for total, seconds in other.totals.items():
            result.totals[total] = result.totals.get(total, 0.0) + seconds
        for labelled, seconds in other.label_totals.items():
            result.label_totals[labelled] = result.label_totals.get(labelled, 0.0) + seconds
        if other.counted_until is not None and (
            result.counted_until is None or other.counted_until > result.counted_until
        ):
            result.counted_until = other.counted_until
        return result

    def prune(self, now: datetime) -> None:
        """Drop the buckets that ended more than :data:`RETENTION` ago (the totals stay)."""
        oldest = hour_of(now) - RETENTION
        for hour in [h for h in self.hours if h < oldest]:
            del self.hours[hour]

    def drop_oldest(self) -> datetime | None:
        """Drop the oldest bucket (to fit a store's size limit); its start, or None when empty."""
        if not self.hours:
            return None
        oldest = min(self.hours)
        del self.hours[oldest]
        return oldest

    def groups(
        self, since: datetime, by: api.UsageGrouping, label: str = "", attribution: Attribution | None = None
    ) -> list[api.UsageGroup]:
        """Seconds from the bucket ``since`` falls in onwards, grouped ``by`` (``label``'s values, each
        beyond the top N summed as ``other``), by state (and the partition-seconds and GiB-seconds)."""
        start = hour_of(since)
        found: dict[str, dict[str, float]] = {}
        for hour, rows in self.hours.items():
            if hour < start:
                continue
            for key, seconds in rows.items():
                states = found.setdefault(_group_name(key, by, label), {})
                states[key.state] = states.get(key.state, 0.0) + seconds
        if by is api.UsageGrouping.LABEL:
            found = _capped(found, label, attribution or Attribution())
        return [
            api.UsageGroup(
                name=name,
                total=round(sum(s for state, s in states.items() if state in api.USAGE_STATES), 3),
                partition_seconds=round(states.get(PARTITION, 0.0), 3),
                memory_gib_seconds=round(states.get(MEMORY_GIB, 0.0), 3),
                **_rounded(states),
            )
            for name, states in sorted(found.items())
        ]

    def to_record(self) -> UsageRecord:
        keys = sorted({key for rows in self.hours.values() for key in rows})
        index = {key: i for i, key in enumerate(keys)}
        return UsageRecord(
            counted_until=self.counted_until,
            totals=[(*total, round(s, 3)) for total, s in sorted(self.totals.items())],
            label_totals=[(*total, round(s, 3)) for total, s in sorted(self.label_totals.items())],
            keys=[tuple(key) if key.labels else tuple(key[:4]) for key in keys],
            buckets={
                hour.isoformat(): sorted((index[key], round(s, 3)) for key, s in rows.items())
                for hour, rows in sorted(self.hours.items())
            },
        )

    @classmethod
    def from_record(cls, record: UsageRecord) -> UsageBook:
        """The book of ``record``; ValueError when a row names no key."""
        keys = [UsageKey(*key) for key in record.keys]
        hours: dict[datetime, dict[UsageKey, float]] = {}
        for hour, rows in record.buckets.items():
            found = hours.setdefault(hour_of(datetime.fromisoformat(hour)), {})
            for i, seconds in rows:
                if not 0 <= i < len(keys):
                    raise ValueError(f"bucket {hour} names key {i} of {len(keys)}")
                found[keys[i]] = found.get(keys[i], 0.0) + seconds
        totals = {(ns, model, state): seconds for ns, model, state, seconds in record.totals}
        labelled = {(labels, model, state): seconds for labels, model, state, seconds in record.label_totals}
        return cls(hours, totals, record.counted_until, labelled)


def _group_name(key: UsageKey, by: api.UsageGrouping, label: str = "") -> str:
    if by is api.UsageGrouping.MODEL:
        return key.model
    if by is api.UsageGrouping.LABEL:
        return label_values(key.labels).get(label, UNLABELLED)
    if by is api.UsageGrouping.WORKLOAD:
        return f"{key.namespace}/{key.workload}" if key.workload else ""
    return key.namespace


def _capped(
    found: dict[str, dict[str, float]], label: str, attribution: Attribution
) -> dict[str, dict[str, float]]:
    """``found`` (value → state → seconds) with the values beyond the top N by device-seconds summed
    under ``other``."""
    device = {v: sum(s for st, s in states.items() if st in api.USAGE_STATES) for v, states in found.items()}
    named = attribution.cap(label, device)
    result: dict[str, dict[str, float]] = {}
    for value, states in found.items():
        into = result.setdefault(named[value], {})
        for state, seconds in states.items():
            into[state] = into.get(state, 0.0) + seconds
    return result


def _rounded(states: dict[str, float]) -> dict[str, float]:
    return {state: round(seconds, 3) for state, seconds in states.items() if state in api.USAGE_STATES}


# -- stores ------------------------------------------------------------------------------------------


class UsageStore(ABC):
    @abstractmethod
    async def load(self) -> UsageBook: ...

    @abstractmethod
    async def save(self, book: UsageBook) -> None:
        """Write ``book``; raise :class:`Conflict` (or :class:`NotFound`, :class:`AlreadyExists`)
        when the record changed since it was read: another replica wrote it."""

    @abstractmethod
    def describe(self) -> str: ...


def _fitting(book: UsageBook, encode: Callable[[UsageBook], bytes], limit: int | None) -> bytes:
    """``book`` encoded, its oldest buckets dropped until it fits ``limit`` (logged)."""
    payload = encode(book)
    dropped: list[datetime] = []
    while limit is not None and len(payload) > limit:
        oldest = book.drop_oldest()
        if oldest is None:
            raise UsageError(f"the usage record's totals alone take {len(payload)} bytes, beyond {limit}")
        dropped.append(oldest)
        payload = encode(book)
    if dropped:
        log.warning(
            "usage record at its size limit: oldest hours dropped",
            dropped=len(dropped),
            now_from=min(book.hours).isoformat() if book.hours else "-",
        )
    return payload


def _json(book: UsageBook) -> bytes:
    return book.to_record().model_dump_json(by_alias=True).encode()


class FileUsageStore(UsageStore):
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "usage.json"

    def describe(self) -> str:
        return str(self.path)

    async def load(self) -> UsageBook:
        def read() -> UsageBook:
            if not self.path.exists():
                return UsageBook()
            return UsageBook.from_record(UsageRecord.model_validate_json(self.path.read_bytes()))

        try:
            return await asyncio.to_thread(read)
        except (OSError, ValidationError, ValueError) as err:
            raise UsageError(f"cannot read the usage record {self.path}: {_first_line(err)}") from None

    async def save(self, book: UsageBook) -> None:
        payload = _fitting(book, _json, None).decode()
        try:
            await asyncio.to_thread(atomic_write, self.path, payload, mode=0o600)
        except OSError as err:
            raise UsageError(f"cannot write the usage record {self.path}: {err}") from None


class ConfigMapUsageStore(UsageStore):
    """One ConfigMap, replaced with its ``resourceVersion``: a deposed leader's write fails
    (:class:`Conflict`) instead of overwriting the new leader's."""

    def __init__(self, client: KubeClient, *, name: str, namespace: str) -> None:
        self.document = ConfigMapDocument(client, name=name, namespace=namespace)

    def describe(self) -> str:
        return self.document.describe()

    async def load(self) -> UsageBook:
        try:
            obj = await self.document.read()
        except ApiError as err:
            raise UsageError(f"cannot read the usage record {self.describe()}: {err}") from None
        raw = ((obj or {}).get("binaryData") or {}).get(_DATA_KEY)
        if not raw:
            return UsageBook()
        try:
            record = UsageRecord.model_validate_json(gzip.decompress(base64.b64decode(raw)))
        except (OSError, ValidationError, ValueError) as err:
            raise UsageError(f"the usage record {self.describe()} is corrupt: {_first_line(err)}") from None
        return UsageBook.from_record(record)

    async def save(self, book: UsageBook) -> None:
        payload = _fitting(book, lambda b: gzip.compress(_json(b), mtime=0), _DATA_LIMIT)
        try:
            await self.document.write({"binaryData": {_DATA_KEY: base64.b64encode(payload).decode()}})
        except (Conflict, AlreadyExists, NotFound):
            raise  # (ApiErrors too) the record changed since it was read: the meter decides
        except ApiError as err:
            raise UsageError(f"cannot write the usage record {self.describe()}: {err}") from None


# -- the meter ---------------------------------------------------------------------------------------


class EntryKeys:
    """What a ledger entry's seconds count to (:class:`UsageKey` and weight pairs), from the models
    the inventory knows and the owners the claims informer saw, each owner remembered per claim
    UID (kept after the claim is gone, while an entry holds it: :class:`UsageMeter` forgets it)."""

    def __init__(self, inventory: Inventory, claims: ClaimView | None, attribution: Attribution) -> None:
        self.inventory = inventory
        self.claims = claims
        self.attribution = attribution
        #: claim UID → (namespace, workload, labels)
        self.owners: dict[str, tuple[str, str, str]] = {}
        #: what the keys being made lack (:meth:`keyed`)
        self._missing: list[tuple[bool, str]] = []

    def keyed(self, entry: LedgerEntry) -> tuple[_Keys, _Missing]:
        """:meth:`key_list` of ``entry``, and what they were made without (empty: they are final):
        an owner the claims informer has not seen yet, or a model, may show up later."""
        self._missing = []
        keys = self.key_list(entry)
        return keys, tuple(self._missing)

    def known_now(self, missing: _Missing) -> bool:
        """Whether any of what keys were made without is known now (two lookups at most each)."""
        for claim, name in missing:
            if claim:
                if name in self.owners or (self.claims is not None and self.claims.get(name) is not None):
                    return True
            elif self.inventory.device(name) is not None:
                return True
        return False

    def key_list(self, entry: LedgerEntry) -> _Keys:
        """What ``entry``'s seconds count to, and how many times: its device's seconds by state (a
        GPU serving partitions, like a warm device, has no one claim: no namespace); while bound,
        each partition holder's seconds at its share of the GPU (:data:`PARTITION`), and a memory
        share's GiB-seconds (:data:`MEMORY_GIB`; a share is no device: no device-seconds)."""
        bound = entry.state is LedgerState.BOUND
        if entry.share is not None:
            pool = self.inventory.device(entry.share.pool)
            model = model_of(pool) if pool else self._unknown(entry.share.pool)
            if not bound:
                return ()
            namespace, workload, labels = self._owner(entry.claim_uid, entry.namespace)
            return ((UsageKey(namespace, model, workload, MEMORY_GIB, labels), entry.share.chunk_mib / 1024),)
        record = self.inventory.device(entry.device)
        model = model_of(record) if record else self._unknown(entry.device)
        if entry.warm_held or entry.partition_held:
            keys: _Keys = ((UsageKey("", model, "", str(entry.state)), 1.0),)
            table = record.attributes.partition_table if record is not None else None
            if not bound or table is None:
                return keys
            for hold in entry.partitions:
                partition = parse_partition(hold.partition, {entry.device: table})
                if partition is not None:
                    namespace, workload, labels = self._owner(hold.claim_uid, entry.namespace)
                    keys += ((UsageKey(namespace, model, workload, PARTITION, labels), partition.gpu_share),)
            return keys
        namespace, workload, labels = self._owner(entry.claim_uid, entry.namespace)
        return ((UsageKey(namespace, model, workload, str(entry.state), labels), 1.0),)

    def _owner(self, claim_uid: str, fallback_namespace: str | None) -> tuple[str, str, str]:
        """(namespace, workload, attribution labels) of a claim, remembered per UID. Not known from a
        claim (no API access, or a claim gone before a restart): the namespace the plugin sent with the
        attach, as the entry keeps it (for a GPU's partitions: the first holder's), no workload and no
        labels."""
        owner = self.owners.get(claim_uid)
        if owner is None and self.claims is not None:
            claim = self.claims.get(claim_uid)
            if claim is not None:
                owner = self.owners[claim_uid] = (
                    claim.metadata.namespace or "",
                    workload_of(claim),
                    claim_labels(claim, self.attribution.keys),
                )
            else:
                self._missing.append((True, claim_uid))
        return owner or (fallback_namespace or "", "", "")

    def _unknown(self, device: str) -> str:
        self._missing.append((False, device))
        return "unknown"


class UsageMeter:
    """The leader's accounting: integrates the ledger (and the fabric's foreign bindings) into a
    :class:`UsageBook` and keeps it durable through a :class:`UsageStore`."""

    def __init__(
        self,
        ledger: Ledger,
        inventory: Inventory,
        store: UsageStore,
        *,
        claims: ClaimView | None = None,
        orphans_in_grace: Callable[[], int] | None = None,
        attribution: Attribution | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.ledger = ledger
        self.inventory = inventory
        self.store = store
        self.claims = claims
        #: the label keys seconds are attributed to, their bound, the price list
        self.attribution = attribution or Attribution()
        #: bindings the orphan reconciler judges unexplained and has not detached yet
        self.orphans_in_grace = orphans_in_grace
        self.clock = clock
        #: the durable record as last loaded or written
        self._book = UsageBook()
        #: counted since, not written yet
        self._pending = UsageBook()
        #: counted up to here; None while not counting (a follower, or before the record is loaded)
        self._last: datetime | None = None
        #: when this replica began counting: foreign bindings are counted from here on only
        self._resumed_at: datetime | None = None
        #: device → the keys its entry had when last counted and since when it is not counted yet:
        #: a change closes the interval at the moment it happens (:meth:`_ledger_changed`)
        self._open: dict[str, _Opened] = {}
        #: (keys, since) → how many open entries count to ``keys`` from ``since``; ``since`` is
        #: :data:`_COUNTED` for all counted up to the last tick, so that a tick adds one interval
        #: per group, not one per entry
        self._groups: Counter[tuple[_Keys, datetime]] = Counter()
        #: ticks so far: an entry opened before the last one is counted up to it
        self._ticks = 0
        #: claim UID → open entries holding it; UIDs no entry holds any more, forgotten at the tick
        self._holders: Counter[str] = Counter()
        self._released: set[str] = set()
        #: devices whose keys are not final, with what was not known when they were made (a claim
        #: the informer had not seen, a device not in the inventory): looked up again at each tick
        self._unsettled: dict[str, _Missing] = {}
        #: the next tick walks the whole ledger: after a load or a resume, or entries changed while
        #: the meter could not count them (the models or owners not known yet)
        self._walk = True
        #: device → its entry as loaded and since when it is not counted, until the first tick
        #: after a resume that knows the models and owners (:meth:`resume`)
        self._unopened: dict[str, tuple[LedgerEntry, datetime]] = {}
        #: what an entry's seconds count to; its owners are kept after their claims are gone
        self.keys = EntryKeys(inventory, claims, self.attribution)
        self._write_lock = asyncio.Lock()
        self._resume_lock = asyncio.Lock()
        ledger.listeners.append(self._ledger_changed)

    @property
    def counting(self) -> bool:
        return self._last is not None

    async def resume(self) -> None:
        """Load the record and count on from its ``countedUntil`` (now, for a first start)."""
        book = await self.store.load()
        now = self.clock()
        self._book, self._pending = book, UsageBook()
        self._last = book.counted_until if book.counted_until is not None else now
        self._resumed_at = now
        self._reset_open()
        self._unopened = {}
        last = self._last
        if self._ready():
            for entry in self.ledger.entries():
                self._open_entry(entry, max(last, entry.updated_at))
            self._walk = False
        else:
            # Their keys need the models and owners, not known yet: kept as the ledger has them
            # now, so a change before the first tick that can count (a detach in the seconds
            # after a restart) still charges the time down to what each entry was.
            self._unopened = {
                e.device: (e.model_copy(deep=True), max(last, e.updated_at)) for e in self.ledger.entries()
            }
        log.info(
            "usage record loaded",
            record=self.store.describe(),
            counted_until=book.counted_until.isoformat() if book.counted_until else "-",
            hours=len(book.hours),
        )

    async def try_resume(self) -> bool:
        """:meth:`resume`, logging (not raising) a record that cannot be read: nothing is counted
        until it can be, so nothing is written over it."""
        async with self._resume_lock:  # the leadership change and the loop may both try
            if self.counting:
                return True
            try:
                await self.resume()
            except FabricError as err:
                log.error("cannot load the usage record; accounting waits for it", error=err.message)
                return False
            return True

    async def pause(self) -> None:
        """Count up to now and write it, then count nothing until :meth:`resume`."""
        if self._last is None:
            return
        self.tick()
        with contextlib.suppress(FabricError):
            await self.flush()
        self._last = None

    def _keys(self, entry: LedgerEntry) -> _Keys:
        return self.keys.keyed(entry)[0]

    @property
    def _owners(self) -> dict[str, tuple[str, str, str]]:
        return self.keys.owners

    def _add(self, keys: _Keys, start: datetime, end: datetime) -> None:
        for key, weight in keys:
            self._pending.add(key, start, end, weight)

    def _ready(self) -> bool:
        """Counting, with the models (the inventory) and the owners (the claims) known."""
        if self._last is None or not self.inventory.loaded.is_set():
            return False
        return self.claims is None or self.claims.synced.is_set()

    # -- the open entries, in groups ---------------------------------------------------------------

    def _group(self, opened: _Opened) -> tuple[_Keys, datetime]:
        """The group ``opened`` counts in: its own ``since`` until a tick has counted it."""
        return opened.keys, opened.since if opened.tick == self._ticks else _COUNTED

    def _start(self, opened: _Opened) -> datetime:
        """From when ``opened`` is not counted yet (the meter counts from ``_last``; before it
        does, from its own ``since``)."""
        last = self._last
        if last is None:
            return opened.since
        return max(opened.since, last) if opened.tick == self._ticks else last

    def _reset_open(self) -> None:
        self._open, self._groups, self._holders, self._unsettled = {}, Counter(), Counter(), {}

    def _open_entry(self, entry: LedgerEntry, since: datetime) -> None:
        keys, missing = self.keys.keyed(entry)
        holders = (entry.claim_uid, *(h.claim_uid for h in entry.partitions))
        opened = self._open[entry.device] = _Opened(keys, since, self._ticks, holders)
        self._groups[self._group(opened)] += 1
        self._holders.update(holders)
        if missing:
            self._unsettled[entry.device] = missing

    def _ungroup(self, opened: _Opened) -> None:
        group = self._group(opened)
        self._groups[group] -= 1
        if self._groups[group] <= 0:
            del self._groups[group]

    def _close(self, device: str, until: datetime) -> _Opened | None:
        """Take ``device``'s entry out of the open ones, its time up to ``until`` counted."""
        opened = self._open.pop(device, None)
        if opened is None:
            return None
        self._ungroup(opened)
        for uid in opened.holders:
            self._holders[uid] -= 1
            if self._holders[uid] <= 0:
                del self._holders[uid]
                self._released.add(uid)
        self._unsettled.pop(device, None)
        if self._last is not None:
            self._add(opened.keys, self._start(opened), until)
        return opened

    def _walk_ledger(self) -> None:
        """Every entry of the ledger opened again, each from when it was last counted (or, first
        seen, from its ``updated_at``), with its keys as they are now."""
        kept = {device: self._start(opened) for device, opened in self._open.items()}
        self._released.update(self.keys.owners)  # those no entry holds after the walk are forgotten
        self._reset_open()
        for entry in self.ledger.entries():
            self._open_entry(entry, kept.get(entry.device, entry.updated_at))
        self._walk = False

    def _resettle(self) -> None:
        """The keys of the entries whose owner or model was not known, made again where any of it
        is known now (a claim gone for good is one lookup a tick, not its keys made again)."""
        for device, missing in list(self._unsettled.items()):
            if not self.keys.known_now(missing):
                continue
            opened, entry = self._open.get(device), self.ledger.get(device)
            if opened is None or entry is None:
                del self._unsettled[device]
                continue
            keys, still = self.keys.keyed(entry)
            if keys != opened.keys:
                self._ungroup(opened)
                opened.keys = keys
                self._groups[self._group(opened)] += 1
            if still:
                self._unsettled[device] = still
            else:
                del self._unsettled[device]

    def _ledger_changed(self, device: str | None) -> None:
        """A ledger entry was put or removed: the time since it was last counted goes to the key it
        had, and its new key counts from now. Counting only at ticks gave a whole tick's seconds to
        the state an entry had at the tick — a warm refill's hot-add counted as warm, a warm device
        taken by a claim uncounted since the last tick (docs/performance.md, "Warm devices")."""
        if device is None:  # the whole ledger loaded: every entry counts from its own change
            self._reset_open()
            self._unopened = {}
            self._walk = True
            return
        last = self._last
        if last is None or not self._ready():
            self._walk = True  # the next tick that can count finds it
            return
        now = self.clock()
        opened = self._close(device, now)
        loaded = self._unopened.pop(device, None)
        if opened is None and loaded is not None:
            self._add(self._keys(loaded[0]), max(loaded[1], last), now)
            self._released.update((loaded[0].claim_uid, *(h.claim_uid for h in loaded[0].partitions)))
        entry = self.ledger.get(device)
        if entry is not None:
            self._open_entry(entry, now)

    def tick(self) -> None:
        """Count the time since the previous tick. Nothing while not counting, and nothing (the time
        carried to the next tick) while the inventory is not read or the claims not listed yet, as
        the models and the owners are not known. An entry counts from when it was last counted
        (a tick or its last change, :meth:`_ledger_changed`), or — first seen — from its
        ``updated_at`` when that is later than the previous tick. An entry whose owner was not
        known is looked up again (owners may be known better now)."""
        last = self._last
        if last is None or not self._ready():
            return
        now = self.clock()
        if now <= last:
            return
        if self._walk:
            self._walk_ledger()
        else:
            self._resettle()
        for (keys, since), count in self._groups.items():
            start = last if since is _COUNTED else max(last, since)
            for key, weight in keys:
                self._pending.add(key, start, now, weight * count)
        self._unopened = {}  # every entry counted (and opened) from the same start
        foreign_from = max(last, self._resumed_at or last)
        for device in self._outside():
            record = self.inventory.device(device.name)
            model = model_of(record) if record else device.model or str(device.type)
            self._pending.add(UsageKey("", model, "", OUTSIDE), foreign_from, now)
        self._pending.counted_until = self._last = now
        # everything open is counted up to now: one group per key
        self._ticks += 1
        merged: Counter[tuple[_Keys, datetime]] = Counter()
        for (keys, _since), count in self._groups.items():
            merged[(keys, _COUNTED)] += count
        self._groups = merged
        # Forget owners of claims no entry holds any more.
        for uid in self._released:
            if uid not in self._holders:
                self.keys.owners.pop(uid, None)
        self._released = set()

    async def flush(self) -> None:
        """Make what was counted durable.

        A write refused because the record changed means another replica wrote it as leader, and
        counted the same devices over the same time: this replica's unwritten seconds are dropped
        rather than added twice (a leader change racing a flush loses at most one flush interval,
        and never counts a second twice)."""
        # Seconds a change counted since the last tick are in the book: count everything up to now,
        # so that countedUntil covers them and a restart from it counts none twice.
        self.tick()
        async with self._write_lock:
            pending = self._pending
            if pending.counted_until is None:
                return
            self._pending = UsageBook()
            merged = self._book.merged(pending)
            merged.prune(self.clock())
            try:
                await self.store.save(merged)
            except (Conflict, AlreadyExists, NotFound):
                log.warning(
                    "usage record written by another replica; reloading it", record=self.store.describe()
                )
                self._book = await self.store.load()
                if self._last is not None and self._book.counted_until is not None:
                    self._last = max(self._last, self._book.counted_until)
                return
            except BaseException:
                self._pending = pending.merged(self._pending)  # the next write carries them
                raise
            self._book = merged

    def totals(self) -> dict[tuple[str, str, str], float]:
        """Lifetime seconds by (namespace, model, state), counted so far (written or not)."""
        return self._book.merged(self._pending).totals if self.counting else {}

    def book(self) -> UsageBook:
        """Everything counted up to now, written or not."""
        self.tick()
        return self._book.merged(self._pending)

    def label_totals(self) -> dict[tuple[str, str, str], float]:
        """Lifetime seconds by (labels, model, state) of the labelled keys, counted so far."""
        return self._book.merged(self._pending).label_totals if self.counting else {}

    def report(self, since: datetime, by: api.UsageGrouping, label: str = "") -> api.UsageReport:
        book = self.book()
        return api.UsageReport(
            since=hour_of(since),
            until=book.counted_until or self.clock(),
            by=by,
            label=label or None,
            bucket_seconds=int(BUCKET.total_seconds()),
            oldest=min(book.hours) if book.hours else None,
            groups=book.groups(since, by, label, self.attribution),
        )

    def _outside(self) -> list[DeviceFacts]:
        """Devices the fabric binds that no ledger entry explains. The ledger decides, not the
        snapshot's ``managed``: a snapshot rendered before a new leader loaded its ledger still
        shows that leader's bindings as foreign, and they would count twice."""
        return [
            d
            for d in self.inventory.facts()
            if not d.managed and d.state is api.BindingState.BOUND and self.ledger.get(d.name) is None
        ]

    def stranded(self) -> dict[str, int]:
        """Devices bound to a node with no claim using them, by why."""
        warm = self.ledger.count_warm()
        outside = sum(1 for d in self._outside() if d.node)
        orphans = self.orphans_in_grace() if self.orphans_in_grace is not None else 0
        return {"warm": warm, "orphan-grace": orphans, "outside": outside}

    async def run(self, is_leader: Callable[[], bool]) -> None:
        """Tick every :data:`TICK_SECONDS`, write every :data:`FLUSH_SECONDS`, while leading."""
        since_flush = 0.0
        while True:
            await asyncio.sleep(TICK_SECONDS)
            if not is_leader():
                continue
            if not self.counting and not await self.try_resume():
                continue
            self.tick()
            since_flush += TICK_SECONDS
            if since_flush >= FLUSH_SECONDS:
                since_flush = 0.0
                try:
                    await self.flush()
                except FabricError as err:
                    log.warning("cannot write the usage record; the next write carries it", error=str(err))


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
