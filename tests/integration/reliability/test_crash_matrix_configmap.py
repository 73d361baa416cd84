"""The manager's crash points again, with its ledger in ConfigMap shards on the API test server
(which enforces the real size limits) instead of a file: an intent written to its shard before
every Redfish action must give what the file's fsync gives — after SIGKILL at any point and a
restart, the claim is prepared once, released completely, and the device never bound twice.

The scenario and its checks are :mod:`tests.integration.reliability.test_crash_matrix`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.integration.reliability.stack import Stack, running_stack
from tests.integration.reliability.test_crash_matrix import CASES, Case, _scenario

pytestmark = [pytest.mark.slow(seconds=57), pytest.mark.timeout(120)]

MANAGER_CASES = [case for case in CASES if case.role == "manager"]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # The last --ledger wins: the stack's own flags name the file ledger first.
    with running_stack(manager_args=["--ledger", "configmap"]) as running:
        yield running


@pytest.fixture(scope="module")
def running(stack: Stack) -> Stack:
    stack.plugin.start()
    stack.controller.start()
    return stack


@pytest.mark.parametrize("case", MANAGER_CASES, ids=str)
def test_crash_point_with_the_configmap_ledger(running: Stack, case: Case) -> None:
    asyncio.run(_scenario(running, case))
    log = (running.root / "manager.log").read_text()
    assert 'ledger="configmaps reliability/fabric-dra-manager-ledger-000..255"' in log
