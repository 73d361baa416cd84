"""GPU partitions (MIG-style): the profile table a partitionable GPU model declares, and the one
derivation of every name and counter the layers agree on.

A :class:`PartitionTable` says how a GPU splits: its ``memory_slices`` (the placement grid), its
``multiprocessors`` and ``memory_bytes``, and per :class:`PartitionProfile` the slices it takes,
its share of the counters and where it may start (``placements``). Everything else is derived
here, once, for the controller (which publishes), the manager (which binds) and the emulator
(which shows the table):

* :func:`counter_set` — the GPU's shared counters: ``multiprocessors``, ``memory`` (bytes) and
  ``memory-slice-<i>`` = 1 per slice; the set is named after the GPU's device name. The whole GPU
  consumes all of it (:func:`whole_gpu_consumes`).
* :func:`partition_devices` — one :class:`PartitionDevice` per profile placement, named
  ``<gpu>-<label>-<start>`` (``gpu0-1g10gb-3``), consuming its memory slices and its share.
* :func:`parse_partition` — a partition device name back to its GPU, profile and start.
* :func:`overlaps` and :func:`conflict` — whether placements of one GPU can be held together.
* :func:`fit_problem` — why a table does not fit a GPU's memory (or multiprocessors), in one line
  naming the profile; a table whose own profiles do not fit it is refused by its validation.

The naming follows NVIDIA's DRA driver (``gpu-<minor>-mig-<profile>-<gi>-<start>``, profile
without dots) and its counter set (``memory-slice-<i>`` counters encode the placement, so
overlapping placements conflict through them), adapted to fabric device names.

The two built-in tables (:data:`BUILTIN_TABLES`) are **illustrative**: the profile names, slice
counts, placements and shares of NVIDIA's MIG user guide for an H100 80GB and an A100 40GB
(``nvidia-smi mig -lgip`` / ``-lgipp``); the exact memory of a profile varies with the driver.
Partitioning a real GPU is the operator's decision, so a table applies to a model only where a
fabric or an operator's catalog says so.

>>> table = BUILTIN_TABLES["h100-80gb"]
>>> [d.name for d in partition_devices("gpu0", table)][:3]
['gpu0-1g10gb-0', 'gpu0-1g10gb-1', 'gpu0-1g10gb-2']
>>> parse_partition("gpu0-3g40gb-4", {"gpu0": table}).profile.name
'3g.40gb'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ByteSize, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from plumbing.names import DNS1123_LABEL_MAX_LENGTH, DNS1123_LABEL_PATTERN, dns_label, is_dns1123_label

__all__ = [
    "BUILTIN_TABLES",
    "COUNTER_MEMORY",
    "COUNTER_MULTIPROCESSORS",
    "PartitionDevice",
    "PartitionProfile",
    "PartitionTable",
    "PartitionTableRef",
    "conflict",
    "counter_set",
    "fit_problem",
    "memory_slice_counter",
    "overlaps",
    "parse_partition",
    "partition_device_name",
    "partition_devices",
    "resolve_table",
    "size_text",
    "whole_gpu_consumes",
]

COUNTER_MULTIPROCESSORS = "multiprocessors"
COUNTER_MEMORY = "memory"

#: at most this many memory slices: a counter set holds at most 32 counters
#: (k8s.io/api/resource/v1 ResourceSliceMaxCountersPerCounterSet), two of them are not slices
MAX_MEMORY_SLICES = 30

_HASH_LEN = 8
#: the end of a name cut to fit a DNS label: a dash and the hash
_CUT = re.compile(rf"-[0-9a-f]{{{_HASH_LEN}}}$")
_MIB = 1 << 20


def memory_slice_counter(index: int) -> str:
    """The counter of memory slice ``index``: ``memory-slice-3``."""
    return f"memory-slice-{index}"


def _label_of(name: str) -> str:
    """``1g.10gb`` → ``1g10gb`` (NVIDIA's DRA driver drops the dots too); ``+`` becomes ``-``."""
    return re.sub(r"-{2,}", "-", name.lower().replace(".", "").replace("+", "-")).strip("-")


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class PartitionProfile(_Model):
    """One way to carve a partition out of the GPU (a MIG GPU-instance profile)."""

    name: str = Field(
        min_length=1,
        max_length=32,
        pattern=r"^[0-9a-z][0-9a-z.+]*$",
        description="the profile's name (1g.10gb)",
    )
    label: str = Field(
        default="",
        max_length=32,
        description="the name as a DNS label (1g10gb), part of every partition device name; "
        "default: the name without dots",
    )
    memory_slices: int = Field(ge=1, le=MAX_MEMORY_SLICES, description="slices one placement takes")
    multiprocessors: int = Field(ge=1, description="streaming multiprocessors of one partition")
    memory_bytes: ByteSize = Field(gt=0, description="GPU memory of one partition, in bytes")
    placements: list[int] = Field(min_length=1, description="valid start slices, ascending")

    @model_validator(mode="after")
    def _derived(self) -> PartitionProfile:
        if not self.label:
            object.__setattr__(self, "label", _label_of(self.name))
        if not is_dns1123_label(self.label):
            raise ValueError(f"profile {self.name}: label {self.label!r} is not a DNS label")
        if sorted(set(self.placements)) != self.placements:
            raise ValueError(f"profile {self.name}: placements must be ascending, without repeats")
        return self


class PartitionTable(_Model):
    """How one GPU model splits into partitions; refused with one line naming the profile at fault."""

    name: str = Field(
        pattern=DNS1123_LABEL_PATTERN,
        max_length=DNS1123_LABEL_MAX_LENGTH,
        description="the table's name (h100-80gb)",
    )
    memory_slices: int = Field(ge=1, le=MAX_MEMORY_SLICES, description="memory slices: the placement grid")
    multiprocessors: int = Field(ge=1, description="streaming multiprocessors the partitions share")
    memory_bytes: ByteSize = Field(gt=0, description="GPU memory the partitions share, in bytes")
    profiles: list[PartitionProfile] = Field(min_length=1, description="the ways to carve a partition")

    @model_validator(mode="after")
    def _profiles_fit(self) -> PartitionTable:
        names: set[str] = set()
        labels: set[str] = set()
        for p in self.profiles:
            if p.name in names:
                raise ValueError(f"profile {p.name} is listed twice")
            if p.label in labels:
                raise ValueError(f"profile {p.name}: label {p.label} is used by another profile")
            names.add(p.name)
            labels.add(p.label)
            if p.memory_slices > self.memory_slices:
                raise ValueError(
                    f"profile {p.name} takes {p.memory_slices} memory slices; "
                    f"the GPU has {self.memory_slices}"
                )
            beyond = [s for s in p.placements if s < 0 or s + p.memory_slices > self.memory_slices]
            if beyond:
                last = beyond[0] + p.memory_slices - 1
                takes = f"slice {last}" if last == beyond[0] else f"slices {beyond[0]}..{last}"
                raise ValueError(
                    f"profile {p.name}: a placement at {beyond[0]} takes {takes}; "
                    f"the GPU has 0..{self.memory_slices - 1}"
                )
            if p.multiprocessors > self.multiprocessors:
                raise ValueError(
                    f"profile {p.name} needs {p.multiprocessors} multiprocessors; "
                    f"the table has {self.multiprocessors}"
                )
            if p.memory_bytes > self.memory_bytes:
                raise ValueError(
                    f"profile {p.name} needs {size_text(p.memory_bytes)} of memory; "
                    f"the table has {size_text(self.memory_bytes)}"
                )
        return self

    def profile(self, name: str) -> PartitionProfile | None:
        """The profile called ``name`` (``1g.10gb``), or None."""
        return next((p for p in self.profiles if p.name == name), None)


def size_text(n: int) -> str:
    """Bytes as a person reads them: ``79.25 GiB``, ``9984 MiB``."""
    if n % _MIB == 0 and n < (1 << 30):
        return f"{n // _MIB} MiB"
    return f"{n / (1 << 30):.2f}".rstrip("0").rstrip(".") + " GiB"


def fit_problem(
    table: PartitionTable, memory_bytes: int | None, multiprocessors: int | None = None
) -> str | None:
    """Why ``table`` does not fit a GPU with ``memory_bytes`` of memory (and ``multiprocessors``,
    when known), in one line naming the profile; None when it fits (or nothing is known)."""
    if memory_bytes is not None:
        largest = max(table.profiles, key=lambda p: p.memory_bytes)
        if largest.memory_bytes > memory_bytes:
            return (
                f"table {table.name}: profile {largest.name} needs {size_text(largest.memory_bytes)} of GPU "
                f"memory; the GPU has {size_text(memory_bytes)}"
            )
        if table.memory_bytes > memory_bytes:
            return (
                f"table {table.name} counts {size_text(table.memory_bytes)} of GPU memory; "
                f"the GPU has {size_text(memory_bytes)}"
            )
    if multiprocessors is not None:
        largest = max(table.profiles, key=lambda p: p.multiprocessors)
        if largest.multiprocessors > multiprocessors:
            return (
                f"table {table.name}: profile {largest.name} needs {largest.multiprocessors} "
                f"multiprocessors; the GPU has {multiprocessors}"
            )
        if table.multiprocessors > multiprocessors:
            return (
                f"table {table.name} counts {table.multiprocessors} multiprocessors; "
                f"the GPU has {multiprocessors}"
            )
    return None


# --- counters and devices ----------------------------------------------------------------------


def whole_gpu_consumes(table: PartitionTable) -> dict[str, int]:
    """Every counter of the GPU's set at its full value: what the whole-GPU device consumes."""
    counters = {COUNTER_MULTIPROCESSORS: table.multiprocessors, COUNTER_MEMORY: int(table.memory_bytes)}
    counters.update({memory_slice_counter(i): 1 for i in range(table.memory_slices)})
    return counters


def counter_set(gpu: str, table: PartitionTable) -> tuple[str, dict[str, int]]:
    """The shared counter set of GPU device ``gpu``: its name (the device name, unique in the pool
    and a DNS label) and the counters with their values."""
    return gpu, whole_gpu_consumes(table)


def partition_device_name(gpu: str, profile: PartitionProfile, start: int) -> str:
    """``<gpu>-<label>-<start>`` (``gpu0-1g10gb-3``), cut and hashed to a DNS label when too long."""
    return dns_label(f"{gpu}-{profile.label}-{start}", f"{gpu}/{profile.name}/{start}")


@dataclass(frozen=True)
class PartitionDevice:
    """One placement of one profile on one GPU: a device of its own in the ResourceSlice."""

    gpu: str
    table: PartitionTable = field(repr=False)
    profile: PartitionProfile = field(repr=False)
    start: int
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", partition_device_name(self.gpu, self.profile, self.start))

    @property
    def slices(self) -> range:
        """The memory slices it occupies."""
        return range(self.start, self.start + self.profile.memory_slices)

    @property
    def gpu_share(self) -> float:
        """Its share of the GPU, by memory slices (a 1g.10gb of an 8-slice H100: 1/8; the full 7g.80gb:
        1): what the accounting counts its seconds at. Memory, not compute: slices are what a
        placement takes from every other partition of the GPU, and a full layout's slices sum to 1
        (the compute of a full layout does not: seven 1g take 7 of 8 slices but 7 of 7 compute)."""
        return self.profile.memory_slices / self.table.memory_slices

    @property
    def consumes(self) -> dict[str, int]:
        """What it takes from its GPU's counter set (the ``consumesCounters`` of its device)."""
        counters = {
            COUNTER_MULTIPROCESSORS: self.profile.multiprocessors,
            COUNTER_MEMORY: int(self.profile.memory_bytes),
        }
        counters.update({memory_slice_counter(i): 1 for i in self.slices})
        return counters


def partition_devices(gpu: str, table: PartitionTable) -> list[PartitionDevice]:
    """Every placement of every profile of ``table`` on GPU device ``gpu``, in table order."""
    return [PartitionDevice(gpu, table, p, start) for p in table.profiles for start in p.placements]


def parse_partition(name: str, gpus: Mapping[str, PartitionTable]) -> PartitionDevice | None:
    """The partition device called ``name`` among GPUs ``gpus`` (device name → table), or None
    when ``name`` is no partition of them (a whole GPU, another device, a start the profile does
    not offer). Its ``gpu``, ``profile`` and ``start`` say which."""
    match = re.fullmatch(r"(?P<rest>.+)-(?P<start>0|[1-9][0-9]*)", name)
    if match is not None:
        rest, start = match["rest"], int(match["start"])
        # Fast path: an uncut name starts with its GPU's; the label never holds the GPU name's end.
        for gpu, table in gpus.items():
            if not rest.startswith(gpu + "-"):
                continue
            profile = next((p for p in table.profiles if p.label == rest[len(gpu) + 1 :]), None)
            if profile is not None and start in profile.placements:
                return PartitionDevice(gpu, table, profile, start)
    if _CUT.search(name):
        # A cut name: only a GPU whose partition names get cut can have made it.
        for gpu, table in gpus.items():
            # <gpu>-<label>-<start>: the start has at most two digits (MAX_MEMORY_SLICES)
            if len(gpu) + max(len(p.label) for p in table.profiles) + 4 <= DNS1123_LABEL_MAX_LENGTH:
                continue
            found = next((d for d in partition_devices(gpu, table) if d.name == name), None)
            if found is not None:
                return found
    return None


def overlaps(a: PartitionDevice, b: PartitionDevice) -> bool:
    """Whether placements ``a`` and ``b`` cannot be held at once: the same GPU, and a memory slice
    in common or more of a counter together than the GPU has."""
    return a.gpu == b.gpu and _clash(a, [b]) is not None


def conflict(candidate: PartitionDevice, held: Iterable[PartitionDevice]) -> str | None:
    """Why ``candidate`` cannot be added to the placements ``held`` on its GPU (others are
    ignored), in one line naming what is in the way; None when it fits."""
    return _clash(candidate, [h for h in held if h.gpu == candidate.gpu])


def _clash(candidate: PartitionDevice, held: list[PartitionDevice]) -> str | None:
    for other in held:
        common = sorted(set(candidate.slices) & set(other.slices))
        if common:
            return f"{candidate.gpu}: {memory_slice_counter(common[0])} is in use by {other.name}"
    limits = whole_gpu_consumes(candidate.table)
    for counter in (COUNTER_MULTIPROCESSORS, COUNTER_MEMORY):
        used = sum(h.consumes[counter] for h in held)
        if used + candidate.consumes[counter] > limits[counter]:
            return (
                f"{candidate.gpu}: {counter} {used} of {limits[counter]} in use by "
                f"{', '.join(h.name for h in held)}; {candidate.name} needs {candidate.consumes[counter]}"
            )
    return None


# --- the built-in tables -----------------------------------------------------------------------


def _mib(n: int) -> ByteSize:
    return ByteSize(n * _MIB)


def _profile(name: str, slices: int, sms: int, mib: int, placements: Iterable[int]) -> PartitionProfile:
    return PartitionProfile(
        name=name,
        memory_slices=slices,
        multiprocessors=sms,
        memory_bytes=_mib(mib),
        placements=list(placements),
    )


#: Illustrative tables after NVIDIA's MIG user guide (see the module docstring). The ``+me``
#: profiles (one slice with the media engines) are left out: they take what ``1g.*`` takes from
#: the counters, so they would double the devices without a way for a claim to tell them apart.
BUILTIN_TABLES: Mapping[str, PartitionTable] = {
    t.name: t
    for t in (
        PartitionTable(
            name="h100-80gb",
            memory_slices=8,
            multiprocessors=132,
            memory_bytes=_mib(81152),  # 79.25 GiB: the 7g.80gb instance's memory
            profiles=[
                _profile("1g.10gb", 1, 16, 9984, range(7)),
                _profile("1g.20gb", 2, 26, 20096, (0, 2, 4, 6)),
                _profile("2g.20gb", 2, 32, 20096, (0, 2, 4)),
                _profile("3g.40gb", 4, 60, 40448, (0, 4)),
                _profile("4g.40gb", 4, 64, 40448, (0,)),
                _profile("7g.80gb", 8, 132, 81152, (0,)),
            ],
        ),
        PartitionTable(
            name="a100-40gb",
            memory_slices=8,
            multiprocessors=98,
            memory_bytes=_mib(40448),  # 39.5 GiB: the 7g.40gb instance's memory
            profiles=[
                _profile("1g.5gb", 1, 14, 4864, range(7)),
                _profile("1g.10gb", 2, 14, 9984, (0, 2, 4, 6)),
                _profile("2g.10gb", 2, 28, 9984, (0, 2, 4)),
                _profile("3g.20gb", 4, 42, 20096, (0, 4)),
                _profile("4g.20gb", 4, 56, 20096, (0,)),
                _profile("7g.40gb", 8, 98, 40448, (0,)),
            ],
        ),
    )
}


def resolve_table(value: object) -> object:
    """A built-in table's name → that table; anything else is left to :class:`PartitionTable`'s
    validation. Raises ValueError naming the built-in tables for an unknown name."""
    if isinstance(value, str):
        table = BUILTIN_TABLES.get(value)
        if table is None:
            known = ", ".join(sorted(BUILTIN_TABLES))
            raise ValueError(f"no built-in partition table {value!r} (built in: {known}); or give the table")
        return table
    return value


#: a table as a topology or an operator's catalog gives it: a built-in table's name, or the table
PartitionTableRef = Annotated[PartitionTable, BeforeValidator(resolve_table)]
