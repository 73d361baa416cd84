"""The value of a Kubernetes resource quantity (``k8s.io/apimachinery/pkg/api/resource``), exactly.

One parser for every role: the scheduler's CEL environment and the plugin read device capacities
with it (:mod:`dra_driver.selection.quantity` wraps it in its ``Quantity``), the manager reads a
DeviceBudget's memory limits with it. Values are exact fractions, so ``1Gi == 1024Mi`` holds as it
does in Kubernetes.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from plumbing.errors import PlumbingError

__all__ = ["BINARY_SUFFIXES", "DECIMAL_EXPONENTS", "QuantityError", "quantity_value"]

BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

# <signedNumber><suffix>, suffix one of binarySI, decimalSI, or e/E<signedNumber>
# (resource/quantity.go, "The serialization format is").
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?\d+)|(?P<decimal>[numkMGTPE]?))$"
)


class QuantityError(PlumbingError, ValueError):
    """A string that is not a Kubernetes quantity."""


def quantity_value(text: str) -> Fraction:
    """The exact value of a quantity string, as ``resource.ParseQuantity`` reads it.

    Values more precise than 1n are rounded up (away from zero) to the nano scale, as the
    Kubernetes serialisation format specifies."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, not {type(text).__name__}")
    match = _QUANTITY.match(text.strip())
    if match is None or text != text.strip():
        raise QuantityError(f"{text!r} is not a quantity (expected e.g. 80Gi, 500m, 1e3)")
    number = Fraction(match["number"] if not match["number"].endswith(".") else match["number"][:-1])
    if match["binary"]:
        value = number * BINARY_SUFFIXES[match["binary"]]
    elif match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > 1000:
            raise QuantityError(f"{text!r}: exponent out of range")
        value = number * Fraction(10) ** exponent
    else:
        value = number * Fraction(10) ** DECIMAL_EXPONENTS[match["decimal"] or ""]
    nanos = value * 10**9
    if nanos.denominator != 1:
        value = Fraction(math.ceil(nanos), 10**9)
    return -value if match["sign"] == "-" else value
