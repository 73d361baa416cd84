"""One stack of real processes per module (tests/integration/reliability/stack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.reliability.stack import Stack, running_stack
from tests.support.plugin import fabric_roles_present

if not fabric_roles_present():  # pragma: no cover - every build has them
    pytest.skip("needs the emulator and fabric manager roles", allow_module_level=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack() as running:
        yield running
