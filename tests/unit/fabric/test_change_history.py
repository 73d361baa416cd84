"""The bounded history behind the change feed: what it answers, and when it says it cannot."""

from __future__ import annotations

from fabric.state.changes import ChangeHistory


def test_changes_since_a_version_merge_every_later_version() -> None:
    history = ChangeHistory(100)
    history.record(101, frozenset({"a"}))
    history.record(102, frozenset({"b", "c"}))
    history.record(103, frozenset())  # the pools or nodes changed, no device
    assert history.since(100, 100) == {"a", "b", "c"}
    assert history.since(100, 101) == {"b", "c"}
    assert history.since(100, 103) == set()


def test_a_cursor_of_another_epoch_or_out_of_range_cannot_be_answered() -> None:
    history = ChangeHistory(100)
    history.record(101, frozenset({"a"}))
    assert history.since(99, 101) is None  # another incarnation, though the number is in range
    assert history.since(100, 99) is None  # before the history began
    assert history.since(100, 102) is None  # a version this history never reached


def test_the_history_keeps_at_most_its_versions_and_its_device_changes() -> None:
    by_versions = ChangeHistory(0, max_versions=2)
    for version in range(1, 6):
        by_versions.record(version, frozenset({f"d{version}"}))
    assert len(by_versions) == 2 and by_versions.oldest == 3
    assert by_versions.since(0, 2) is None
    assert by_versions.since(0, 3) == {"d4", "d5"}

    by_devices = ChangeHistory(0, max_devices=3)
    by_devices.record(1, frozenset({"a", "b"}))
    by_devices.record(2, frozenset({"c", "d"}))  # 4 names: the first version goes
    assert by_devices.since(0, 0) is None and by_devices.since(0, 1) == {"c", "d"}
    by_devices.record(3, frozenset({f"x{i}" for i in range(10)}))  # alone past the bound
    assert len(by_devices) == 0 and by_devices.since(0, 2) is None and by_devices.since(0, 3) == set()
