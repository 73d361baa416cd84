"""How hard the hostile-input tests try.

CI runs each with a small example count so the whole of tests/fuzz stays within about a minute on
two cores. ``FABRIC_DRA_FUZZ=long`` multiplies every count (by 20, or ``FABRIC_DRA_FUZZ_FACTOR``)
for a local soak::

    FABRIC_DRA_FUZZ=long python -m pytest tests/fuzz -q

Settings are applied per test (never a global Hypothesis profile, which would change every other
property test in the suite). No example database is written: a failure prints the reproducing
example (and ``@reproduce_failure`` blob) instead.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["LONG", "examples", "fuzz_settings"]

LONG = os.environ.get("FABRIC_DRA_FUZZ", "").lower() == "long"
FACTOR = int(os.environ.get("FABRIC_DRA_FUZZ_FACTOR", "20")) if LONG else 1


def examples(ci: int) -> int:
    """The example count for a test that runs ``ci`` examples in CI."""
    return ci * FACTOR


def fuzz_settings(ci: int) -> settings:
    return settings(
        max_examples=examples(ci),
        deadline=None,  # real processes and sockets: timing varies with the machine's load
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
