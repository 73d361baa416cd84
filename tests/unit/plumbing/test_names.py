"""plumbing.names against the cases of k8s.io/apimachinery/pkg/util/validation/validation_test.go."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from pydantic import BaseModel, Field, ValidationError

from plumbing.names import (
    C_IDENTIFIER_PATTERN,
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DNS1123_SUBDOMAIN_PATTERN,
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_PATTERN,
    UID_MAX_LENGTH,
    UID_PATTERN,
    is_c_identifier,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
    is_uid,
)

# TestIsDNS1123Label
LABEL_GOOD = [
    "a",
    "ab",
    "abc",
    "a1",
    "a-1",
    "a--1--2--b",
    "0",
    "01",
    "012",
    "1a",
    "1-a",
    "1--a--b--2",
    "a" * 63,
]
LABEL_BAD = [
    *("", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b"),
    *("1_", "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b", "1 ", " 1"),
    *("1 2", "a" * 64),
]
# TestIsDNS1123Subdomain
SUBDOMAIN_GOOD = [
    *("a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2"),
    *("a.a", "ab.a", "abc.a", "a1.a", "a-1.a", "a--1--2--b.a", "a.1", "ab.1", "abc.1", "a1.1", "a-1.1"),
    *("a--1--2--b.1", "0.a", "01.a", "012.a", "1a.a", "1-a.a", "1--a--b--2", "0.1", "01.1", "012.1"),
    *("1a.1", "1-a.1", "1--a--b--2.1", "a.b.c.d.e", "aa.bb.cc.dd.ee", "1.2.3.4.5", "11.22.33.44.55"),
    "a" * 253,
]
SUBDOMAIN_BAD = [
    *("", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b"),
    *("1_", "_1", "1_2", ".", "a.", ".a", "a..b", "1.", ".1", "1..2", " ", "a ", " a", "a b", "1 ", " 1"),
    *("1 2", "A.a", "aB.a", "ab.A", "A1.a", "a1.A", "A.1", "aB.1", "A1.1", "1A.1", "0.A", "01.A", "012.A"),
    *("1A.a", "1a.A", "A.B.C.D.E", "AA.BB.CC.DD.EE", "a.B.c.d.e", "aa.bB.cc.dd.ee", "a@b", "a,b", "a_b"),
    *("a;b", "a:b", "a%b", "a?b", "a$b", "a" * 254),
]
# TestIsQualifiedName
QUALIFIED_GOOD = [
    *("simple", "now-with-dashes", "1-starts-with-num", "1234", "simple/simple", "now-with-dashes/simple"),
    *("now-with-dashes/now-with-dashes", "now.with.dots/simple", "now-with.dashes-and.dots/simple"),
    *(
        "1-num.2-num/3-num",
        "1234/5678",
        "1.2.3.4/5678",
        "Uppercase_Is_OK_123",
        "example.com/Uppercase_Is_OK_123",
    ),
    *("requests.storage-foo", "a" * 63, "a" * 253 + "/" + "b" * 63),
]
QUALIFIED_BAD = [
    *("nospecialchars%^=@", "cantendwithadash-", "-cantstartwithadash-", "only/one/slash", "Example.com/abc"),
    *("example_com/abc", "example.com/", "/simple", "a" * 64, "a" * 254 + "/abc"),
]
# TestIsValidLabelValue
LABEL_VALUE_GOOD = [
    *("simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", "a" * 63, ""),
    *("A", "AB", "AbC", "aBc", "A1", "A-1", "1-A", "Upper_and.dots-9"),
]
LABEL_VALUE_BAD = [
    *("nospecialchars%^=@", "Tama-nui-te-rā.is.Māori.sun", "\\backslashes\\are\\bad", "-starts-with-dash"),
    *("ends-with-dash-", ".starts.with.dot", "ends.with.dot.", "a" * 64),
]
# TestIsCIdentifier
C_IDENTIFIER_GOOD = [
    *("a", "ab", "abc", "a1", "_a", "a_", "a_b", "a_1", "a__1__2__b", "__abc_123", "A", "AB", "AbC", "A1"),
    *("_A", "A_", "A_B", "A_1", "A__1__B", "__123_ABC"),
]
C_IDENTIFIER_BAD = [
    *("", "1", "123", "1a", "-", "a-", "-a", "1-", "-1", "1_", "1_2", ".", "a.", ".a", "a.b", "1.", ".1"),
    *("1.2", " ", "a ", " a", "a b", "1 ", " 1", "1 2", "#a#"),
]
UID_GOOD = ["5b8f0f0a-3c4e-4d5f-9a6b-7c8d9e0f1a2b", "5B8F0F0A-3C4E-4D5F-9A6B-7C8D9E0F1A2B"]
UID_BAD = [
    "",
    "uid-1",
    "5b8f0f0a3c4e4d5f9a6b7c8d9e0f1a2b",
    "5b8f0f0a-3c4e-4d5f-9a6b-7c8d9e0f1a2b0",
    "../../etc",
]

RULES: list[tuple[Callable[[str], bool], list[str], list[str]]] = [
    (is_dns1123_label, LABEL_GOOD, LABEL_BAD),
    (is_dns1123_subdomain, SUBDOMAIN_GOOD, SUBDOMAIN_BAD),
    (is_qualified_name, QUALIFIED_GOOD, QUALIFIED_BAD),
    (is_label_value, LABEL_VALUE_GOOD, LABEL_VALUE_BAD),
    (is_c_identifier, C_IDENTIFIER_GOOD, C_IDENTIFIER_BAD),
    (is_uid, UID_GOOD, UID_BAD),
]


@pytest.mark.parametrize(("rule", "good", "bad"), RULES, ids=lambda v: getattr(v, "__name__", ""))
def test_predicates_follow_kubernetes(rule: Callable[[str], bool], good: list[str], bad: list[str]) -> None:
    assert [v for v in good if not rule(v)] == []
    assert [v for v in bad if rule(v)] == []


class _Named(BaseModel):
    label: str | None = Field(
        default=None, pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH
    )
    subdomain: str | None = Field(
        default=None, pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=DNS1123_SUBDOMAIN_MAX_LENGTH
    )
    label_value: str | None = Field(
        default=None, pattern=LABEL_VALUE_PATTERN, max_length=LABEL_VALUE_MAX_LENGTH
    )
    c_identifier: str | None = Field(default=None, pattern=C_IDENTIFIER_PATTERN)
    uid: str | None = Field(default=None, pattern=UID_PATTERN, max_length=UID_MAX_LENGTH)


def _accepted(field: str, value: str) -> bool:
    try:
        _Named.model_validate({field: value})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    ("field", "rule", "values"),
    [
        ("label", is_dns1123_label, LABEL_GOOD + LABEL_BAD),
        ("subdomain", is_dns1123_subdomain, SUBDOMAIN_GOOD + SUBDOMAIN_BAD),
        ("label_value", is_label_value, LABEL_VALUE_GOOD + LABEL_VALUE_BAD),
        ("c_identifier", is_c_identifier, C_IDENTIFIER_GOOD + C_IDENTIFIER_BAD),
        ("uid", is_uid, UID_GOOD + UID_BAD),
    ],
)
def test_patterns_with_their_max_length_agree_with_the_predicates(
    field: str, rule: Callable[[str], bool], values: list[str]
) -> None:
    """A pydantic field declared with the pattern and the limit accepts exactly what the predicate does."""
    assert {v: _accepted(field, v) for v in values} == {v: rule(v) for v in values}


def test_patterns_are_anchored() -> None:
    for pattern in (DNS1123_LABEL_PATTERN, DNS1123_SUBDOMAIN_PATTERN, LABEL_VALUE_PATTERN, UID_PATTERN):
        assert re.search(pattern, "ok-name and more") is None
