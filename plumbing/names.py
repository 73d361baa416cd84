"""The syntax rules of Kubernetes names, declared once for every role.

Taken from ``k8s.io/apimachinery/pkg/util/validation/validation.go`` (``IsDNS1123Label``,
``IsDNS1123Subdomain``, ``IsQualifiedName``, ``IsValidLabelValue``, ``IsCIdentifier``; the
length limits are its ``DNS1123LabelMaxLength``, ``DNS1123SubdomainMaxLength``,
``qualifiedNameMaxLength`` and ``LabelValueMaxLength``). Each rule comes twice: a predicate for
code, and an anchored pattern string for pydantic/FastAPI ``pattern=``. A pattern cannot carry
the length limit (pydantic's regex engine has no lookahead), so pair it with ``max_length=``
from the ``*_MAX_LENGTH`` constants. Limits of one API group (resource.k8s.io's 63-character
driver names, 32-character attribute names) live with their users, not here.
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "C_IDENTIFIER_PATTERN",
    "DNS1123_LABEL_MAX_LENGTH",
    "DNS1123_LABEL_PATTERN",
    "DNS1123_SUBDOMAIN_MAX_LENGTH",
    "DNS1123_SUBDOMAIN_PATTERN",
    "LABEL_VALUE_MAX_LENGTH",
    "LABEL_VALUE_PATTERN",
    "QUALIFIED_NAME_MAX_LENGTH",
    "QUALIFIED_NAME_PART_PATTERN",
    "UID_MAX_LENGTH",
    "UID_PATTERN",
    "dns_label",
    "is_c_identifier",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_label_value",
    "is_qualified_name",
    "is_qualified_name_part",
    "is_uid",
    "short_hash",
]

# The formats exactly as validation.go spells them (unanchored there; anchored below).
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + r"(\." + _DNS1123_LABEL_FMT + ")*"
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QUALIFIED_NAME_FMT + ")?"
_C_IDENTIFIER_FMT = "[A-Za-z_][A-Za-z0-9_]*"
#: An object's ``metadata.uid``: the API server makes it with ``uuid.NewUUID`` (RFC 4122 text form).
_UID_FMT = "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"

DNS1123_LABEL_MAX_LENGTH = 63
DNS1123_SUBDOMAIN_MAX_LENGTH = 253
QUALIFIED_NAME_MAX_LENGTH = 63
LABEL_VALUE_MAX_LENGTH = 63
UID_MAX_LENGTH = 36

DNS1123_LABEL_PATTERN = f"^{_DNS1123_LABEL_FMT}$"
DNS1123_SUBDOMAIN_PATTERN = f"^{_DNS1123_SUBDOMAIN_FMT}$"
#: The name part of a qualified name (after the optional ``prefix/``); a label value is this or empty.
QUALIFIED_NAME_PART_PATTERN = f"^{_QUALIFIED_NAME_FMT}$"
LABEL_VALUE_PATTERN = f"^{_LABEL_VALUE_FMT}$"
C_IDENTIFIER_PATTERN = f"^{_C_IDENTIFIER_FMT}$"
UID_PATTERN = f"^{_UID_FMT}$"

_DNS1123_LABEL = re.compile(_DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_SUBDOMAIN_FMT)
_QUALIFIED_NAME = re.compile(_QUALIFIED_NAME_FMT)
_LABEL_VALUE = re.compile(_LABEL_VALUE_FMT)
_C_IDENTIFIER = re.compile(_C_IDENTIFIER_FMT)
_UID = re.compile(_UID_FMT)


def is_dns1123_label(value: str) -> bool:
    """RFC 1123 label: at most 63 of ``[a-z0-9-]``, alphanumeric at both ends (``IsDNS1123Label``)."""
    return len(value) <= DNS1123_LABEL_MAX_LENGTH and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """RFC 1123 subdomain: labels joined by dots, at most 253 in all (``IsDNS1123Subdomain``).

    Like Kubernetes, no limit per label: only the whole is bounded.
    """
    return len(value) <= DNS1123_SUBDOMAIN_MAX_LENGTH and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_qualified_name_part(value: str) -> bool:
    """The name of a qualified name: 1 to 63 of ``[A-Za-z0-9-_.]``, alphanumeric at both ends."""
    return len(value) <= QUALIFIED_NAME_MAX_LENGTH and _QUALIFIED_NAME.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """A label key, annotation key or condition type: ``[prefix/]name``, the prefix a DNS-1123
    subdomain (``IsQualifiedName``)."""
    parts = value.split("/")
    if len(parts) == 1:
        return is_qualified_name_part(parts[0])
    if len(parts) != 2:
        return False
    prefix, name = parts
    return bool(prefix) and is_dns1123_subdomain(prefix) and is_qualified_name_part(name)


def is_label_value(value: str) -> bool:
    """Empty, or a qualified-name part (``IsValidLabelValue``)."""
    return len(value) <= LABEL_VALUE_MAX_LENGTH and _LABEL_VALUE.fullmatch(value) is not None


def is_c_identifier(value: str) -> bool:
    """``[A-Za-z_][A-Za-z0-9_]*`` (``IsCIdentifier``; callers add the limit their field has)."""
    return _C_IDENTIFIER.fullmatch(value) is not None


def is_uid(value: str) -> bool:
    """An object UID as the API server makes them: a UUID in its 36-character text form."""
    return len(value) <= UID_MAX_LENGTH and _UID.fullmatch(value) is not None


#: hex digits of the hash that keeps names apart once cut
_HASH_LEN = 8


def short_hash(identity: str) -> str:
    """The first hex digits of ``identity``'s SHA-256: the suffix a cut name carries."""
    return hashlib.sha256(identity.encode()).hexdigest()[:_HASH_LEN]


def dns_label(text: str, identity: str | None = None) -> str:
    """``text`` as a DNS label (lowercased, every run of other characters one ``-``); when longer
    than 63 characters, cut and suffixed with a short hash of ``identity`` (or ``text``), so two
    names that differ only past the cut stay apart. The one rule every derived name follows
    (device names, partition names)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower())
    label = re.sub(r"-{2,}", "-", label).strip("-")
    if not label:
        return f"device-{short_hash(identity or text)}"
    if len(label) > DNS1123_LABEL_MAX_LENGTH:
        label = (
            label[: DNS1123_LABEL_MAX_LENGTH - _HASH_LEN - 1].rstrip("-") + "-" + short_hash(identity or text)
        )
    return label
