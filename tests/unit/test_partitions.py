"""The partition vocabulary (manager_api.partitions): names, counters, consumption, overlap and the
tables that do not fit — derived once for the controller, the manager and the emulator."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pydantic import ValidationError

from manager_api.partitions import (
    BUILTIN_TABLES,
    PartitionDevice,
    PartitionTable,
    conflict,
    counter_set,
    fit_problem,
    overlaps,
    parse_partition,
    partition_device_name,
    partition_devices,
    resolve_table,
    whole_gpu_consumes,
)
from plumbing.names import dns_label, is_dns1123_label

H100 = BUILTIN_TABLES["h100-80gb"]
A100 = BUILTIN_TABLES["a100-40gb"]
GIB = 1 << 30


def _device(table: PartitionTable, name: str, start: int, gpu: str = "gpu0") -> PartitionDevice:
    profile = table.profile(name)
    assert profile is not None
    return PartitionDevice(gpu, table, profile, start)


def _table(**changes: object) -> dict[str, Any]:
    data: dict[str, Any] = H100.model_dump(by_alias=True)
    data.update(changes)
    return data


def test_names_follow_gpu_label_start() -> None:
    names = [d.name for d in partition_devices("gpu0", H100)]
    assert names[:2] == ["gpu0-1g10gb-0", "gpu0-1g10gb-1"]
    assert "gpu0-3g40gb-4" in names and "gpu0-7g80gb-0" in names
    # one device per placement of every profile: 7 + 4 + 3 + 2 + 1 + 1
    assert len(names) == 18 and len(set(names)) == 18
    assert all(is_dns1123_label(n) for n in names)
    assert [p.label for p in A100.profiles] == ["1g5gb", "1g10gb", "2g10gb", "3g20gb", "4g20gb", "7g40gb"]


def test_long_gpu_names_are_cut_to_a_dns_label_as_other_device_names_are() -> None:
    gpu = "a-very-long-fabric-gpu-name-that-already-uses-most-of-a-label-x"
    assert len(gpu) == 63
    devices = partition_devices(gpu, H100)
    names = [d.name for d in devices]
    assert all(len(n) <= 63 and is_dns1123_label(n) for n in names)
    assert len(set(names)) == len(names)  # the hash keeps every placement apart
    for d in devices:
        uncut = f"{gpu}-{d.profile.label}-{d.start}"
        assert d.name == dns_label(uncut, f"{gpu}/{d.profile.name}/{d.start}")
        assert parse_partition(d.name, {gpu: H100, "gpu0": A100}) == d
    # a name that fits is left as it is
    assert partition_device_name("gpu0", H100.profiles[0], 3) == "gpu0-1g10gb-3"


def test_parse_partition_finds_gpu_profile_and_start() -> None:
    gpus = {"gpu0": H100, "gpu0-b": A100, "gpu12": A100}
    found = parse_partition("gpu0-3g40gb-4", gpus)
    assert found is not None
    assert (found.gpu, found.profile.name, found.start) == ("gpu0", "3g.40gb", 4)
    found = parse_partition("gpu0-b-1g5gb-6", gpus)
    assert found is not None and (found.gpu, found.profile.name) == ("gpu0-b", "1g.5gb")
    assert parse_partition("gpu12-1g10gb-2", gpus) == _device(A100, "1g.10gb", 2, "gpu12")
    # not partitions: a whole GPU, another device, a start the profile does not offer, no such GPU
    for name in ("gpu0", "nvme0", "gpu0-3g40gb-2", "gpu0-1g10gb-7", "gpu9-1g10gb-0", "gpu0-1g10gb-01"):
        assert parse_partition(name, gpus) is None, name


def test_counter_set_and_what_the_whole_gpu_and_a_partition_consume() -> None:
    name, counters = counter_set("gpu3", H100)
    assert name == "gpu3"
    assert counters["multiprocessors"] == 132
    assert counters["memory"] == int(79.25 * GIB)
    assert [k for k in counters if k.startswith("memory-slice-")] == [f"memory-slice-{i}" for i in range(8)]
    assert len(counters) <= 32  # a counter set holds at most 32 counters (resource.k8s.io/v1)
    assert whole_gpu_consumes(H100) == counters
    part = _device(H100, "3g.40gb", 4, "gpu3")
    assert part.consumes == {
        "multiprocessors": 60,
        "memory": 40448 << 20,
        "memory-slice-4": 1,
        "memory-slice-5": 1,
        "memory-slice-6": 1,
        "memory-slice-7": 1,
    }
    assert set(part.consumes) <= set(counters)


def test_overlap_by_memory_slice_and_by_counters() -> None:
    assert overlaps(_device(H100, "1g.10gb", 2), _device(H100, "2g.20gb", 2))
    assert overlaps(_device(H100, "3g.40gb", 0), _device(H100, "1g.10gb", 3))
    assert not overlaps(_device(H100, "3g.40gb", 0), _device(H100, "3g.40gb", 4))
    assert not overlaps(_device(H100, "1g.10gb", 0), _device(H100, "1g.10gb", 0, gpu="gpu1"))
    # two placements on disjoint slices whose multiprocessors together exceed the GPU's
    squeezed = PartitionTable.model_validate(
        _table(multiprocessors=100, profiles=[p.model_dump(by_alias=True) for p in H100.profiles[3:5]])
    )
    assert overlaps(_device(squeezed, "3g.40gb", 0), _device(squeezed, "4g.40gb", 0)) is True
    assert overlaps(_device(squeezed, "3g.40gb", 0), _device(squeezed, "3g.40gb", 4)) is True
    why = conflict(_device(squeezed, "3g.40gb", 4), [_device(squeezed, "3g.40gb", 0)])
    assert why == "gpu0: multiprocessors 60 of 100 in use by gpu0-3g40gb-0; gpu0-3g40gb-4 needs 60"
    held = [_device(H100, "1g.10gb", s) for s in (0, 1, 3)]
    assert conflict(_device(H100, "2g.20gb", 2), held) == "gpu0: memory-slice-3 is in use by gpu0-1g10gb-3"
    assert conflict(_device(H100, "1g.10gb", 2), held) is None
    assert conflict(_device(H100, "1g.10gb", 2, gpu="gpu1"), held) is None  # other GPUs do not count


@pytest.mark.parametrize("table", [H100, A100], ids=lambda t: t.name)
def test_every_set_of_disjoint_placements_fits_the_counters(table: PartitionTable) -> None:
    """The built-in tables are consistent: what the memory slices allow, the counters allow too, so
    the slices alone decide (as on the hardware, whose placements these are)."""
    devices = partition_devices(table.name, table)
    checked = 0
    for size in range(1, 8):
        for combo in itertools.combinations(devices, size):
            if any(set(a.slices) & set(b.slices) for a, b in itertools.combinations(combo, 2)):
                continue
            checked += 1
            for counter in ("multiprocessors", "memory"):
                assert sum(d.consumes[counter] for d in combo) <= whole_gpu_consumes(table)[counter]
            assert conflict(combo[-1], combo[:-1]) is None
    assert checked > 100


def test_a_table_that_does_not_fit_is_refused_in_one_line_naming_the_profile() -> None:
    assert fit_problem(H100, 80 * GIB) is None
    assert fit_problem(H100, 40 * GIB) == (
        "table h100-80gb: profile 7g.80gb needs 79.25 GiB of GPU memory; the GPU has 40 GiB"
    )
    assert fit_problem(A100, None, multiprocessors=64) == (
        "table a100-40gb: profile 7g.40gb needs 98 multiprocessors; the GPU has 64"
    )
    bad_cases: dict[str, tuple[dict[str, object], str]] = {
        "placement": (
            {"profiles": [{**H100.profiles[3].model_dump(by_alias=True), "placements": [0, 6]}]},
            "profile 3g.40gb: a placement at 6 takes slices 6..9; the GPU has 0..7",
        ),
        "slices": (
            {"memorySlices": 2, "profiles": [H100.profiles[3].model_dump(by_alias=True)]},
            "profile 3g.40gb takes 4 memory slices; the GPU has 2",
        ),
        "memory": (
            {"memoryBytes": "60GiB"},
            "profile 7g.80gb needs 79.25 GiB of memory; the table has 60 GiB",
        ),
        "twice": (
            {"profiles": [H100.profiles[0].model_dump(by_alias=True)] * 2},
            "profile 1g.10gb is listed twice",
        ),
    }
    for changes, expected in bad_cases.values():
        with pytest.raises(ValidationError) as info:
            PartitionTable.model_validate(_table(**changes))
        errors = info.value.errors()
        assert len(errors) == 1 and expected in errors[0]["msg"], errors
    with pytest.raises(ValidationError, match="placements must be ascending"):
        PartitionTable.model_validate(
            _table(profiles=[{**H100.profiles[0].model_dump(by_alias=True), "placements": [3, 1]}])
        )


def test_tables_read_from_camel_case_json_and_by_built_in_name() -> None:
    again = PartitionTable.model_validate_json(H100.model_dump_json(by_alias=True))
    assert again == H100
    assert set(H100.model_dump(by_alias=True)) == {
        "name",
        "memorySlices",
        "multiprocessors",
        "memoryBytes",
        "profiles",
    }
    inline = PartitionTable.model_validate(
        {
            "name": "tiny",
            "memorySlices": 2,
            "multiprocessors": 10,
            "memoryBytes": "8GiB",
            "profiles": [
                {
                    "name": "1g.4gb",
                    "memorySlices": 1,
                    "multiprocessors": 5,
                    "memoryBytes": "4GiB",
                    "placements": [0, 1],
                }
            ],
        }
    )
    assert inline.profiles[0].label == "1g4gb"
    assert resolve_table("a100-40gb") is A100
    with pytest.raises(
        ValueError, match=r"no built-in partition table 'h200' \(built in: a100-40gb, h100-80gb\)"
    ):
        resolve_table("h200")
