"""One stack of real processes per module (tests/integration/reliability/stack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.reliability.stack import Stack, running_stack


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack() as running:
        yield running
