"""Label and field selectors with the syntax and matching rules of ``k8s.io/apimachinery``.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a``
(exists), ``!a`` (does not exist), ``a>1``, ``a<1``, joined by commas (AND).
Field selectors: ``f=v``, ``f==v``, ``f!=v`` joined by commas; ``\\,``, ``\\=`` and ``\\\\``
escape separators inside values. Only fields a resource declares selectable are accepted,
as on a real server ("field label not supported"). :func:`selection` reads both from a request's
query, as the list, watch and deletecollection handlers need them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.status import bad_request
from kube_standin.errors import RequestError

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "SelectorError",
    "parse_field_selector",
    "parse_label_selector",
    "selection",
]


class SelectorError(RequestError, ValueError):
    """A selector that does not parse or names an unsupported field."""


_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _check_label_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if not slash:
        name = key
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise SelectorError(
            f"invalid label key {key!r}: name part must be a qualified name of at most 63 characters"
        )
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise SelectorError(f"invalid label key {key!r}: prefix part must be a DNS subdomain")


def _check_label_value(value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise SelectorError(
            f"invalid label value {value!r}: at most 63 characters, alphanumeric, '-', '_' or '.', "
            "beginning and ending with an alphanumeric character"
        )


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            # apimachinery: a missing label satisfies != and notin.
            return not present or value not in self.values
        if not present:
            return False
        try:
            have = int(str(value))
        except ValueError:
            return False
        bound = int(self.values[0])
        return have > bound if self.op == "gt" else have < bound


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[_Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        have = labels or {}
        return all(req.matches(have) for req in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|>|<|[^\s!=(),<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            if text[pos:].strip():
                raise SelectorError(f"unable to parse selector {text!r} at position {pos}")
            break
        out.append(match.group(1))
        pos = match.end()
    return out


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return LabelSelector(())
    toks = _tokens(text)
    reqs: list[_Requirement] = []
    i = 0

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise SelectorError(f"unable to parse label selector {text!r}: {what}")

    while i < len(toks):
        if toks[i] == "!":
            need(i + 1 < len(toks), "expected a label key after '!'")
            _check_label_key(toks[i + 1])
            reqs.append(_Requirement(toks[i + 1], "!"))
            i += 2
        else:
            key = toks[i]
            need(
                key not in {"=", "==", "!=", "(", ")", ",", ">", "<"}, f"expected a label key, found {key!r}"
            )
            _check_label_key(key)
            i += 1
            if i >= len(toks) or toks[i] == ",":
                reqs.append(_Requirement(key, "exists"))
            elif toks[i] in ("=", "==", "!="):
                op = "!=" if toks[i] == "!=" else "="
                value = ""
                if i + 1 < len(toks) and toks[i + 1] not in {",", "(", ")"}:
                    value = toks[i + 1]
                    i += 1
                _check_label_value(value)
                reqs.append(_Requirement(key, op, (value,)))
                i += 1
            elif toks[i] in (">", "<"):
                op = "gt" if toks[i] == ">" else "lt"
                need(i + 1 < len(toks), f"expected an integer after {toks[i]!r}")
                try:
                    int(toks[i + 1])
                except ValueError as err:
                    raise SelectorError(
                        f"unable to parse label selector {text!r}: {toks[i + 1]!r} is not an integer"
                    ) from err
                reqs.append(_Requirement(key, op, (toks[i + 1],)))
                i += 2
            elif toks[i] in ("in", "notin"):
                op = toks[i]
                i += 1
                need(i < len(toks) and toks[i] == "(", f"expected '(' after {op!r}")
                i += 1
                values: list[str] = []
                while i < len(toks) and toks[i] != ")":
                    if toks[i] == ",":
                        i += 1
                        continue
                    _check_label_value(toks[i])
                    values.append(toks[i])
                    i += 1
                need(i < len(toks), "expected ')'")
                need(bool(values), f"{op!r} needs at least one value")
                reqs.append(_Requirement(key, op, tuple(values)))
                i += 1
            else:
                raise SelectorError(f"unable to parse label selector {text!r}: unexpected {toks[i]!r}")
        if i < len(toks):
            need(toks[i] == ",", f"expected ',' but found {toks[i]!r}")
            i += 1
            need(i < len(toks), "trailing ','")
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class _FieldRequirement:
    field: str
    getter: Callable[[Mapping[str, Any]], Any]
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        have = self.getter(obj)
        if isinstance(have, bool):
            text = "true" if have else "false"
        else:
            text = "" if have is None else str(have)
        return (text != self.value) if self.negate else (text == self.value)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[_FieldRequirement, ...]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(req.matches(obj) for req in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def exact(self, field: str) -> str | None:
        """The value a ``field=value`` term pins, if any (lets the store skip a scan)."""
        for req in self.requirements:
            if req.field == field and not req.negate:
                return req.value
        return None


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current = ""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            current += text[i : i + 2]
            i += 2
            continue
        if char == sep:
            parts.append(current)
            current = ""
        else:
            current += char
        i += 1
    parts.append(current)
    return parts


def _unescape(text: str) -> str:
    out = ""
    i = 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector value {text!r}: bad escape")
            out += text[i + 1]
            i += 2
        else:
            out += text[i]
            i += 1
    return out


def parse_field_selector(
    text: str | None, fields: Mapping[str, Callable[[Mapping[str, Any]], Any]]
) -> FieldSelector:
    if not text or not text.strip():
        return FieldSelector(())
    reqs: list[_FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        if not term.strip():
            continue
        negate = False
        for op in ("!=", "==", "="):
            index = term.find(op)
            # The first unescaped operator splits field from value.
            while index > 0 and term[index - 1] == "\\":
                index = term.find(op, index + 1)
            if index > 0:
                negate = op == "!="
                name, value = term[:index].strip(), term[index + len(op) :]
                break
        else:
            raise SelectorError(f"invalid field selector {term!r}: expected field=value or field!=value")
        getter = fields.get(name)
        if getter is None:
            raise SelectorError(f"field label not supported: {name}")
        reqs.append(_FieldRequirement(name, getter, _unescape(value.strip()), negate))
    return FieldSelector(tuple(reqs))


def selection(query: Mapping[str, str], res: ResourceType) -> Callable[[Mapping[str, Any]], bool]:
    """Which objects of ``res`` a request's ``labelSelector`` and ``fieldSelector`` select (400 for
    a selector that does not parse or names a field the kind cannot be selected by)."""
    try:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"), res.selectable_fields())
    except SelectorError as err:
        raise bad_request(str(err)) from err
    if labels.empty and fields.empty:
        return lambda obj: True

    def match(obj: Mapping[str, Any]) -> bool:
        return labels.matches((obj.get("metadata") or {}).get("labels")) and fields.matches(obj)

    return match
