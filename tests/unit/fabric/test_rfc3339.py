"""``GET /api/v1/usage?since=``: an RFC 3339 date-time with its zone, nothing else (a bare number
was read as seconds since 1970 before)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from manager_api.models import parse_rfc3339


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T00:00:00Z", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01t00:00:00z", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-02T02:52:52.877464+00:00", datetime(2026, 12, 2, 2, 52, 52, 877464, tzinfo=UTC)),
        ("2026-12-01T01:00:00+01:00", datetime(2026, 12, 1, 1, tzinfo=timezone(timedelta(hours=1)))),
        # a leap second is the second before it; nanoseconds keep their microseconds
        ("2016-12-31T23:59:60.123456789Z", datetime(2016, 12, 31, 23, 59, 59, 123456, tzinfo=UTC)),
    ],
)
def test_rfc3339_times_are_read(text: str, expected: datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "0.5",
        "1764547200",
        "2026-12-01T00:00:00",  # no zone
        "2026-12-01",
        "2026-12-01T00:00+00:00",  # no seconds
        "2026-13-01T00:00:00Z",
        "2024-02-30T00:00:00Z",
        "0000-01-01T00:00:00Z",
        " 2026-12-01T00:00:00Z",
        "2026-12-01T00:00:00Z\n",
        "\uff12\uff10\uff12\uff16-12-01T00:00:00Z",  # fullwidth digits
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    assert parse_rfc3339(text) is None
