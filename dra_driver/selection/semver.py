"""Semantic versions as DRA's CEL environment sees them (``version`` attributes, ``semver()``).

Parsing is strict SemVer 2.0.0 like ``github.com/blang/semver/v4``'s ``Parse``, which
Kubernetes uses for ``VersionValue`` attributes and for the CEL semver library
(``k8s.io/apiserver/pkg/cel/library/semverlib.go``); ``normalize`` accepts the loose forms
that library's ``semver(s, true)`` accepts ("v1.2", "01.2.3").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from dra_driver.errors import InputError

__all__ = ["Semver", "SemverError", "parse_semver"]

_IDENT = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"^(?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?P<patch>0|[1-9]\d*)"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?(?:\+(?P<build>{_IDENT}(?:\.{_IDENT})*))?$"
)


class SemverError(InputError):
    pass


@total_ordering
@dataclass(frozen=True, eq=False)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def _key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def compare(self, other: Semver) -> int:
        """SemVer 2.0.0 precedence (section 11): build metadata is ignored."""
        if self._key() != other._key():
            return -1 if self._key() < other._key() else 1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for mine, theirs in zip(self.pre, other.pre, strict=False):
            if mine == theirs:
                continue
            mine_num, theirs_num = mine.isdigit(), theirs.isdigit()
            if mine_num and theirs_num:
                return -1 if int(mine) < int(theirs) else 1
            if mine_num != theirs_num:
                return -1 if mine_num else 1
            return -1 if mine < theirs else 1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __lt__(self, other: Semver) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self._key(), self.pre))


def parse_semver(text: str, normalize: bool = False) -> Semver:
    if not isinstance(text, str):
        raise SemverError(f"version must be a string, not {type(text).__name__}")
    if normalize:
        text = _normalize(text)
    match = _SEMVER.match(text)
    if match is None:
        raise SemverError(f"{text!r} is not a semantic version (expected MAJOR.MINOR.PATCH)")
    pre = tuple(match["pre"].split(".")) if match["pre"] else ()
    for ident in pre:
        if ident.isdigit() and len(ident) > 1 and ident.startswith("0"):
            raise SemverError(f"{text!r}: numeric pre-release identifier {ident!r} has a leading zero")
    build = tuple(match["build"].split(".")) if match["build"] else ()
    return Semver(int(match["major"]), int(match["minor"]), int(match["patch"]), pre, build)


def _normalize(text: str) -> str:
    text = text.removeprefix("v")
    core, sep, rest = text, "", ""
    for marker in ("-", "+"):
        index = text.find(marker)
        if index != -1 and (not sep or index < len(core)):
            core, sep, rest = text[:index], marker, text[index + 1 :]
    parts = core.split(".")
    if len(parts) > 3 or not all(p.isdigit() for p in parts):
        return text  # let strict parsing report it
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + (sep + rest if sep else "")
