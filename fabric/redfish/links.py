"""The one rule for URIs a Redfish service hands back: they name this service, or they are refused.

A service's answers carry URIs the client then requests: ``@odata.id``, ``Members@odata.nextLink``,
``Location``, ``TaskMonitor``, ``Links.*``, the ``OriginOfCondition`` of events. Appending such a
value to the base URL is a trap: ``@127.0.0.1:9/x`` after ``http://bmc:443`` reads as user
``bmc:443`` at host ``127.0.0.1:9``, and the request — with the password of a login or the session
token — goes there. :func:`resolve` instead resolves the value as a URI reference against the
service root (RFC 3986 §5.2) and refuses the result unless it has the scheme, host and port of the
configured service; :class:`ForeignLink` names the link, so the operation fails saying why.
:meth:`fabric.redfish.transport.Transport.send` resolves every URI it puts on the wire, so no
request can escape; callers that know which link they follow resolve it first to name it.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urljoin, urlsplit

from manager_api.errors import FabricUnavailable

__all__ = ["ForeignLink", "resolve", "same_service"]

SERVICE_ROOT = "/redfish/v1/"
_MAX_URI = 8192
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ForeignLink(FabricUnavailable):
    """The service handed back a URI that names another origin (or none that can be read)."""


def _origin(scheme: str, host: str | None, port: int | None) -> tuple[str, str, int | None]:
    return scheme.lower(), (host or "").lower(), port if port is not None else _DEFAULT_PORTS.get(scheme)


@lru_cache(maxsize=8)
def _root(base_url: str) -> tuple[str, tuple[str, str, int | None]]:
    parts = urlsplit(base_url)
    return base_url.rstrip("/") + SERVICE_ROOT, _origin(parts.scheme, parts.hostname, parts.port)


def resolve(base_url: str, reference: str, *, link: str = "URI") -> str:
    """``reference`` resolved against the service root of ``base_url``, as the path (and query) to
    request there. Raises :class:`ForeignLink` naming ``link`` when it resolves to another scheme,
    host or port, or is no URI reference at all (control characters, spaces, a bad port)."""
    root, origin = _root(base_url)
    shown = repr(reference[:200])
    # isprintable() is False for every whitespace character but the space itself
    if not reference or len(reference) > _MAX_URI or not reference.isprintable() or " " in reference:
        raise ForeignLink(f"the Redfish service's {link} {shown} is no URI reference; not followed")
    if reference.startswith("/") and not reference.startswith("//"):
        # An absolute-path reference keeps the root's scheme and authority (RFC 3986 §5.2.2):
        # the common case, and the cheap one.
        return reference
    try:
        parts = urlsplit(urljoin(root, reference))
        target = _origin(parts.scheme, parts.hostname, parts.port)
    except ValueError:  # a port that is no number
        raise ForeignLink(f"the Redfish service's {link} {shown} is no URI reference; not followed") from None
    if target != origin or parts.username is not None or parts.password is not None:
        where = f"{parts.scheme}://{parts.netloc}"
        raise ForeignLink(
            f"the Redfish service's {link} {shown} resolves to {where}, another origin than the "
            f"configured service ({base_url}); refused: credentials and session tokens go to the "
            "configured service only"
        )
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def same_service(base_url: str, reference: object, *, link: str = "URI") -> str | None:
    """:func:`resolve` for a value that may be missing or no string: None instead of a path."""
    if not isinstance(reference, str) or not reference:
        return None
    return resolve(base_url, reference, link=link)
