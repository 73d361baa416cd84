"""The string formats of a custom resource's schema that change what a value *is*: ``duration``
and ``date-time``. Both are checked on write (an invalid one is a ``FieldValueTypeInvalid``), and
CEL rules see them as ``google.protobuf.Duration`` / ``Timestamp`` values
(``k8s.io/apiserver/pkg/cel/common/schemas.go``: a string of format duration is a CEL duration).

``duration`` is ``k8s.io/kube-openapi/pkg/validation/strfmt/duration.go`` ``ParseDuration``: Go's
``time.ParseDuration`` first (``1h30m``, ``1.5h``, ``300ms``), else any sequence of
``<integer><unit>`` where the unit is one of ns/us/ms/s/m/h/d/w or their long names
(``7d``, ``2 weeks``). A Go duration is an int64 of nanoseconds; a longer one is refused.
"""

from __future__ import annotations

import re
from datetime import datetime
from fractions import Fraction

__all__ = ["parse_date_time", "parse_duration_nanos"]

_INT64_MAX = 2**63 - 1
_NANOS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "μs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
# time.ParseDuration: [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+, or "0"
_GO_PART = re.compile(r"(\d*(?:\.\d*)?)([^\d.]+)")
# strfmt: the long names, in the order strfmt tries them (the last of each may be a prefix).
_STRFMT_UNITS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("ns", "nanoseconds"), 1),
    (("us", "microseconds"), 10**3),
    (("ms", "milliseconds"), 10**6),
    (("s", "seconds"), 10**9),
    (("m", "minutes"), 60 * 10**9),
    (("h", "hours"), 3600 * 10**9),
    (("d", "days"), 24 * 3600 * 10**9),
    (("w", "weeks"), 7 * 24 * 3600 * 10**9),
)
_STRFMT_PART = re.compile(r"((\d+)\s*([A-Za-zµ]+))")


def _go_duration(text: str) -> int | None:
    """``time.ParseDuration``, in nanoseconds (None: not a Go duration)."""
    body = text
    sign = 1
    if body[:1] in ("-", "+"):
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return 0
    if not body:
        return None
    total = Fraction(0)
    position = 0
    while position < len(body):
        match = _GO_PART.match(body, position)
        if match is None or match.group(1) in ("", ".") or match.group(2) not in _NANOS:
            return None
        total += Fraction(match.group(1)) * _NANOS[match.group(2)]
        position = match.end()
    nanos = int(total)
    return None if nanos > _INT64_MAX else sign * nanos


def parse_duration_nanos(text: str) -> int | None:
    """strfmt's ``ParseDuration`` in nanoseconds; None when ``text`` is no duration."""
    go = _go_duration(text)
    if go is not None:
        return go
    total = 0
    found = False
    for _, number, unit_text in _STRFMT_PART.findall(text):
        unit = unit_text.strip().lower()
        for variants, nanos in _STRFMT_UNITS:
            last = len(variants) - 1
            for index, variant in enumerate(variants):
                if (index == last and unit.startswith(variant)) or variant == unit:
                    found = True
                    total += int(number) * nanos
    if not found or total > _INT64_MAX:
        return None
    return total


_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def parse_date_time(text: str) -> datetime | None:
    """An RFC 3339 date-time (strfmt ``IsDateTime``); None when ``text`` is not one."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    normalised = text.replace("t", "T").replace("z", "Z").replace(" ", "T")
    if match.group(7):
        # Python keeps microseconds: drop the digits past the sixth.
        fraction = match.group(7)
        normalised = normalised.replace(fraction, fraction[:7].ljust(7, "0"), 1)
    try:
        return datetime.fromisoformat(normalised.replace("Z", "+00:00"))
    except ValueError:
        return None
