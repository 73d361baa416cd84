"""Kubernetes resource quantities (``k8s.io/apimachinery/pkg/api/resource.Quantity``), exactly.

Device capacity in a ResourceSlice is a quantity (``memory: {value: 80Gi}``); DRA's CEL
environment exposes it as an opaque ``Quantity`` with Kubernetes' quantity library
(``k8s.io/apiserver/pkg/cel/library/quantity.go``). Values are kept as exact fractions so
``quantity("1Gi") == quantity("1024Mi")`` holds, as it does in Kubernetes.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import total_ordering

from dra_driver.errors import InputError
from plumbing import quantity as _plain

__all__ = ["Quantity", "QuantityError", "format_bytes", "format_quantity", "parse_quantity"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_BINARY = _plain.BINARY_SUFFIXES
_DECIMAL = _plain.DECIMAL_EXPONENTS


class QuantityError(InputError):
    """A string that is not a Kubernetes quantity."""


@total_ordering
class Quantity:
    """An exact quantity; ``text`` keeps the spelling it was parsed from for messages."""

    __slots__ = ("text", "value")

    def __init__(self, value: Fraction, text: str | None = None) -> None:
        self.value = value
        self.text = text if text is not None else _format(value)

    def __repr__(self) -> str:
        return f"Quantity({self.text!r})"

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """True when the value is a whole number that fits in an int64 (``Quantity.AsInt64``)."""
        return self.value.denominator == 1 and _INT64_MIN <= self.value.numerator <= _INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError(f"cannot convert value {self.text} to integer")
        return self.value.numerator

    def as_float(self) -> float:
        return float(self.value)

    def canonical(self) -> str:
        """The spelling Kubernetes writes the quantity back in (``Quantity.String()``): the format
        it was written in (binary suffix, exponent or decimal suffix), with the largest exact suffix."""
        if _EXPONENT.search(self.text):
            return _format_exponent(self.value)
        return format_quantity(self.value, binary=bool(_BINARY_SUFFIX.search(self.text)))

    def add(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value + delta)

    def sub(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value - delta)


def parse_quantity(text: str) -> Quantity:
    """Parse a quantity string as ``resource.ParseQuantity`` does.

    Values more precise than 1n are rounded up (away from zero) to the nano scale, as the
    Kubernetes serialisation format specifies.
    """
    try:
        value = _plain.quantity_value(text)
    except _plain.QuantityError as err:
        raise QuantityError(str(err)) from None
    return Quantity(value, text)


_BINARY_SUFFIX = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei)$")
_EXPONENT = re.compile(r"[eE][+-]?\d+$")


def _format_exponent(value: Fraction) -> str:
    """``Quantity.String()`` in the ``DecimalExponent`` format: the mantissa with the largest
    exponent, a multiple of 3, that keeps it whole (``1000e0`` → ``1e3``; ``1`` stays ``1``)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    for exponent in range(18, -10, -3):
        scaled = magnitude / Fraction(10) ** exponent
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{math.ceil(magnitude * 10**9)}e-9"


def format_quantity(value: Fraction | int, *, binary: bool) -> str:
    """``Quantity.String()`` of a value in the ``BinarySI`` (``binary``) or ``DecimalSI`` format.

    BinarySI keeps a binary suffix only for whole values of at least 1024 that one divides exactly
    (``CanonicalizeBytes``); everything else is written with the largest decimal SI suffix whose
    mantissa is whole, from n to E."""
    value = Fraction(value)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if binary and magnitude >= 1024 and magnitude.denominator == 1:
        whole = magnitude.numerator
        for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if whole % factor == 0:
                return f"{sign}{whole // factor}{suffix}"
    for suffix, exponent in sorted(_DECIMAL.items(), key=lambda kv: -kv[1]):
        scaled = magnitude / Fraction(10) ** exponent
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}{suffix}"
    return f"{sign}{math.ceil(magnitude * 10**9)}n"


def format_bytes(count: int) -> str:
    """A byte count with the largest binary suffix that keeps it whole (``80Gi``), else with the
    largest decimal one (``1G``, not ``1000000000``) — the canonical form the API server stores
    (``Quantity.String()``: a plain number is ``DecimalSI``), so published capacities read back
    exactly as written."""
    if count < 0:
        raise ValueError("a byte count cannot be negative")
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if count >= unit and count % unit == 0:
            return f"{count // unit}{suffix}"
    return format_quantity(count, binary=False)


def _format(value: Fraction) -> str:
    """A canonical spelling: binary suffixes for multiples of 1Ki, else decimal SI."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if magnitude.denominator == 1:
        whole = magnitude.numerator
        for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if whole % factor == 0:
                return f"{sign}{whole // factor}{suffix}"
        for suffix, exponent in sorted(_DECIMAL.items(), key=lambda kv: -kv[1]):
            if exponent > 0 and whole % 10**exponent == 0:
                return f"{sign}{whole // 10**exponent}{suffix}"
        return f"{sign}{whole}"
    for suffix, exponent in (("m", -3), ("u", -6), ("n", -9)):
        scaled = magnitude * 10 ** (-exponent)
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}{suffix}"
    return f"{sign}{float(magnitude)}"
