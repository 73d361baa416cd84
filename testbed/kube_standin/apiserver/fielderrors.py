"""Field errors as the real API server words them (``k8s.io/apimachinery/pkg/util/validation/field``),
and the name rules every kind shares (``k8s.io/apimachinery/pkg/util/validation``).

A cause's message is ``<type>: <value>: <detail>`` as ``field.Error.ErrorBody`` writes it: the bad
value of a string quoted, of a number or boolean bare, of a ``fmt.Stringer`` (a device ID, a
quantity) in its string form without quotes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kube_standin.apiserver.status import Cause

__all__ = [
    "C_IDENTIFIER_MSG",
    "DNS1123_LABEL",
    "DNS1123_SUBDOMAIN",
    "LABEL_MSG",
    "POOL_NAME_MAX_LENGTH",
    "SUBDOMAIN_MSG",
    "FieldErrors",
    "dns_label",
    "dns_subdomain",
    "driver_name",
    "pool_name",
    "qualified_key",
]

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# validation.IsDNS1123Label / IsDNS1123Subdomain: RegexError(msg, fmt, examples...)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', "
    "followed by a string of alphanumeric characters or '_'"
)
# k8s.io/api/resource/v1/types.go
POOL_NAME_MAX_LENGTH = 253


class FieldErrors:
    """An ``ErrorList`` being built: one :class:`Cause` per error."""

    def __init__(self) -> None:
        self.causes: list[Cause] = []

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {detail}"))

    def invalid_shown(self, path: str, shown: str, detail: str) -> None:
        """``field.Invalid`` of a ``fmt.Stringer`` value (a quantity, a device ID): unquoted."""
        self.causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {shown}: {detail}"))

    def required(self, path: str, detail: str = "") -> None:
        self.causes.append(
            Cause(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))
        )

    def too_many(self, path: str, have: int, limit: int) -> None:
        self.causes.append(
            Cause(path, "FieldValueTooMany", f"Too many: {have}: must have at most {limit} items")
        )

    def too_long(self, path: str, limit: int) -> None:
        self.causes.append(Cause(path, "FieldValueTooLong", f"Too long: may not be more than {limit} bytes"))

    def duplicate(self, path: str, value: Any) -> None:
        self.causes.append(Cause(path, "FieldValueDuplicate", f"Duplicate value: {json.dumps(value)}"))

    def duplicate_shown(self, path: str, shown: str) -> None:
        """``field.Duplicate`` of a ``fmt.Stringer`` value: unquoted."""
        self.causes.append(Cause(path, "FieldValueDuplicate", f"Duplicate value: {shown}"))

    def forbidden(self, path: str, detail: str) -> None:
        self.causes.append(Cause(path, "FieldValueForbidden", f"Forbidden: {detail}"))

    def not_supported(self, path: str, value: Any, allowed: list[str]) -> None:
        options = ", ".join(json.dumps(a) for a in allowed)
        self.causes.append(
            Cause(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {json.dumps(value)}: supported values: {options}",
            )
        )


def dns_label(errs: FieldErrors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif len(value) > 63:
        errs.invalid(path, value, "must be no more than 63 characters")
    elif not DNS1123_LABEL.fullmatch(value):
        errs.invalid(path, value, LABEL_MSG)


def dns_subdomain(errs: FieldErrors, path: str, value: Any, max_len: int = 253) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif len(value) > max_len:
        errs.invalid(path, value, f"must be no more than {max_len} characters")
    elif not DNS1123_SUBDOMAIN.fullmatch(value):
        errs.invalid(path, value, SUBDOMAIN_MSG)


def qualified_key(errs: FieldErrors, path: str, key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if not slash:
        name = key
    if not name or len(name) > 63 or not QUALIFIED_NAME.fullmatch(name):
        errs.invalid(
            path,
            key,
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character (at most 63 characters)",
        )
    if slash:
        if not prefix:
            errs.invalid(path, key, "prefix part must be non-empty")
        else:
            dns_subdomain(errs, path, prefix)


def driver_name(errs: FieldErrors, path: str, value: Any) -> None:
    """A DRA driver name follows CSI driver name rules: a DNS subdomain of at most 63 characters."""
    if not isinstance(value, str) or not value:
        errs.required(path)
        return
    if len(value) > 63:
        errs.invalid(path, value, "must be no more than 63 characters")
    if not DNS1123_SUBDOMAIN.fullmatch(value.lower()):
        errs.invalid(path, value, SUBDOMAIN_MSG)


def pool_name(errs: FieldErrors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
        return
    if len(value) > POOL_NAME_MAX_LENGTH:
        errs.too_long(path, POOL_NAME_MAX_LENGTH)
    for part in value.split("/"):
        if not DNS1123_SUBDOMAIN.fullmatch(part):
            errs.invalid(path, value, SUBDOMAIN_MSG + " (in each '/'-separated part)")
            break
