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
    assert history.holds(100, 101) and not history.holds(99, 101) and not history.holds(100, 102)


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


def test_a_node_is_answered_the_changes_that_concern_it_before_or_after() -> None:
    history = ChangeHistory(100)
    history.record(101, {"gpu0": frozenset({"a"})})  # attached to a
    history.record(102, {"gpu1": frozenset({"b"})})
    history.record(103, {"gpu0": frozenset({"a", "b"})})  # moved from a to b
    history.record(104, {"gpu2": frozenset()})  # a free device's health
    assert history.since(100, 100, "a") == {"gpu0"}
    assert history.since(100, 100, "b") == {"gpu0", "gpu1"}
    assert history.since(100, 101, "a") == {"gpu0"} and history.since(100, 103, "a") == set()
    assert history.since(100, 100, "c") == set() and history.since(100, 100) == {"gpu0", "gpu1", "gpu2"}
    assert history.since(99, 100, "a") is None  # another epoch, filtered or not
    assert history.concerns(100, "a") and history.concerns(101, "a") and not history.concerns(103, "a")
    assert not history.concerns(100, "c")
    history.record(105, frozenset())  # the pools or nodes changed: every reader keeps them
    assert history.concerns(104, "c")
