"""The root of every error plumbing raises on purpose, so a caller can catch the bottom floor's
failures at the level it cares about (as httpx's ``HTTPError`` ⊃ ``RequestError`` ⊃ …)::

    PlumbingError
    ├── CliError            a failure the user can act on, printed as one line (plumbing.cli)
    ├── TokenError          a token file or variable holding no bearer token (plumbing.tokens; a ValueError)
    ├── QuantityError       a string that is no Kubernetes quantity (plumbing.quantity; a ValueError)
    ├── ListenError         an address that cannot be listened on (plumbing.netutil; an OSError)
    ├── RoleStartError      a role's child process that did not come up (plumbing.procs; a RuntimeError)
    ├── TransportError      one HTTP exchange failed below HTTP (plumbing.http1): ``sent``, ``answered``
    └── ApiError            the Kubernetes API server's error Status (plumbing.kube.client), by reason:
        ├── NotFound, Conflict, AlreadyExists, Invalid, Unauthorized, Forbidden, Gone
        └── ApiUnavailable  unreachable, 5xx or 429: worth retrying

Each keeps the builtin base it always had (``ValueError``, ``OSError``, ``RuntimeError``), so code
that catches those still does. Kubernetes Status reasons become these classes in one place,
``plumbing.kube.client._error_for``.
"""

from __future__ import annotations

__all__ = ["PlumbingError"]


class PlumbingError(Exception):
    """Base of every error plumbing raises on purpose."""
