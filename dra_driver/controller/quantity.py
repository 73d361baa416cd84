"""Kubernetes resource quantities (``k8s.io/apimachinery/pkg/api/resource``), as far as capacities need.

The API server re-serialises every quantity in its canonical form ("85899345920" is stored
as "80Gi", "1000000000" as "1G"), so stored and desired capacities are compared by value,
never as strings.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["format_bytes", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$"
)


def parse_quantity(text: str | int) -> Fraction:
    """The exact value of a quantity string such as ``80Gi``, ``1.5G``, ``100m`` or ``12e3``."""
    if isinstance(text, int):
        return Fraction(text)
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    value = Fraction(match["number"])
    if match["exp"] is not None:
        value *= Fraction(10) ** int(match["exp"])
    else:
        suffix = match["suffix"] or ""
        value *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    return -value if match["sign"] == "-" else value


def format_bytes(count: int) -> str:
    """A byte count with the largest binary suffix that keeps it whole (``80Gi``), else plain."""
    if count < 0:
        raise ValueError("a byte count cannot be negative")
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if count >= unit and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)
