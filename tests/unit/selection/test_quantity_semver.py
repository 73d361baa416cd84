from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from dra_driver.selection.quantity import QuantityError, parse_quantity
from dra_driver.selection.semver import SemverError, parse_semver


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("1024Mi", 2**30),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("2k", 2000),
        ("-3M", -3_000_000),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("0.1n", Fraction(1, 10**9)),  # rounded up to the nano scale
    ],
)
def test_parse_quantity_values(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text).value == value


@pytest.mark.parametrize("text", ["", "Gi", "1GB", "1 Gi", "1.2.3", "--1", "1i"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_quantity_equality_is_by_value_and_integer_checks_int64() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1073741824")
    assert parse_quantity("1Gi").compare(parse_quantity("1G")) == 1
    assert parse_quantity("9223372036854775807").is_integer()
    assert not parse_quantity("9223372036854775808").is_integer()
    assert not parse_quantity("1.5").is_integer()
    assert parse_quantity("1Gi").add(parse_quantity("1Gi")).text == "2Gi"


def test_semver_precedence_follows_semver_2() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
    ]
    versions = [parse_semver(v) for v in ordered]
    assert all(a < b for a, b in itertools.pairwise(versions))
    assert parse_semver("1.2.3+build.5") == parse_semver("1.2.3")


def test_semver_strict_and_normalized() -> None:
    with pytest.raises(SemverError):
        parse_semver("v1.2.3")
    with pytest.raises(SemverError):
        parse_semver("01.2.3")
    assert parse_semver("v1.2", normalize=True) == parse_semver("1.2.0")
    assert str(parse_semver("01.02.3-rc.1", normalize=True)) == "1.2.3-rc.1"
