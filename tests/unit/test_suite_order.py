"""The suite's order (tests/conftest.py ``_slow_modules_first``), checked against pytest-xdist's own
work-stealing scheduler: every worker's first share starts with slow modules, the costliest spread
over the workers, each slow module whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler.worksteal import WorkStealingScheduling

from tests.conftest import _slow_modules_first

#: (module, tests, slow seconds or None)
MODULES = [
    *((f"tests/fast_{i}.py", 20, None) for i in range(12)),
    ("tests/qemu.py", 1, 150.0),
    ("tests/crash.py", 38, 52.0),
    *((f"tests/fast_{i}.py", 20, None) for i in range(12, 24)),
    ("tests/bench.py", 1, 90.0),
    ("tests/hostile.py", 9, 95.0),
    ("tests/validator.py", 1, 45.0),
    ("tests/progress.py", 1, 0.0),
    *((f"tests/fast_{i}.py", 20, None) for i in range(24, 30)),
]


@dataclass
class Item:
    path: Path
    nodeid: str
    seconds: float | None

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        if name != "slow" or self.seconds is None:
            return None
        return pytest.mark.slow(seconds=self.seconds).mark


def collected() -> list[Any]:
    return [Item(Path(m), f"{m}::t{i}", s) for m, count, s in MODULES for i in range(count)]


@dataclass
class Config:
    workers: int

    def getvalue(self, name: str) -> Any:
        return {"tx": [f"{self.workers}*popen"]}[name]


@dataclass(eq=False)
class Node:
    """What the scheduler needs of a worker: it is sent the indices of its share."""

    name: str
    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return type("Gateway", (), {"id": self.name})

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices


def first_shares(order: list[Any], workers: int) -> list[list[Any]]:
    scheduler = WorkStealingScheduling(Config(workers))
    nodes = [Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, [item.nodeid for item in order])
    scheduler.schedule()
    return [[order[i] for i in node.sent] for node in nodes]


@pytest.mark.parametrize("workers", [2, 4, 6])
def test_every_first_share_starts_with_slow_modules_the_costliest_apart(workers: int) -> None:
    items = collected()
    _slow_modules_first(items, workers)
    assert sorted(i.nodeid for i in items) == sorted(i.nodeid for i in collected())
    # each slow module whole (its module-scoped stack starts once); the others keep their order,
    # cut at share boundaries as xdist cuts any order
    seen: list[Path] = []
    for item in items:
        if item.seconds is not None and (not seen or seen[-1] != item.path):
            assert item.path not in seen, f"{item.path} split"
            seen.append(item.path)
    assert [i.nodeid for i in items if i.seconds is None] == [
        i.nodeid for i in collected() if i.seconds is None
    ]
    shares = first_shares(items, workers)
    assert sum(map(len, shares)) == len(items)
    slow = sorted((s, m) for m, _, s in MODULES if s is not None)[::-1]
    costliest = [Path(m) for _, m in slow[:workers]]
    heads = [share[0].path for share in shares]
    assert all(share[0].seconds is not None for share in shares), heads
    # the costliest modules, one per worker, each at the head of its share
    assert sorted(map(str, heads)) == sorted(map(str, costliest))
    for share in shares:  # within a share, the slow modules come first, costliest first
        costs = [item.seconds for item in share if item.seconds is not None]
        assert costs == sorted(costs, reverse=True)
        assert [item.seconds is not None for item in share] == sorted(
            (item.seconds is not None for item in share), reverse=True
        )


def test_one_worker_runs_the_slow_modules_first_costliest_first() -> None:
    items = collected()
    _slow_modules_first(items, 1)
    modules = list(dict.fromkeys(item.path for item in items))
    assert [str(m) for m in modules[:6]] == [
        "tests/qemu.py", "tests/hostile.py", "tests/bench.py", "tests/crash.py", "tests/validator.py",
        "tests/progress.py",
    ]  # fmt: skip
    assert [str(m) for m in modules[6:]] == [m for m, _, s in MODULES if s is None]
