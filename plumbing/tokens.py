"""Bearer tokens read from files and the environment, checked before they are sent or compared.

A token goes into an ``Authorization: Bearer`` header, whose syntax is RFC 6750 section 2.1's
``b64token``: letters, digits and ``-._~+/``, then any ``=`` padding. A service-account token (a
JWT) and the tokens ``fabric-dra`` documents are of that form. A file that holds anything else is
not a token file — a second line, a binary file, ``/etc/shadow`` given by mistake — and it is
refused in one line that says where and what kind of character is wrong, never what the file holds:
put in a header, its whole content would be echoed by the HTTP library's error
(``Illegal header value b'Bearer tok\\nSECRET'``), and a non-ASCII one would end in a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

from plumbing.errors import PlumbingError

__all__ = ["MAX_TOKEN_BYTES", "TokenError", "bearer_token", "read_token_file"]

#: The most a token file may hold. A bearer token travels in a request head, which every server
#: role takes up to 32 KiB (plumbing.httpserve.ConnectionLimits); a projected service-account
#: token is about 1 KiB. Reading stops here, so ``/dev/zero`` is refused, not read for ever.
MAX_TOKEN_BYTES = 16 * 1024

_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_TOKEN_CHAR = re.compile(r"[A-Za-z0-9\-._~+/=]")


class TokenError(PlumbingError, ValueError):
    """A token file or variable that holds no bearer token; the message never quotes it."""


def bearer_token(text: str, source: str) -> str:
    """``text`` without the white space around it, when that is one RFC 6750 ``b64token``; else
    :class:`TokenError` saying what is wrong with the token from ``source`` (a file, a variable)."""
    token = text.strip()
    if not token:
        raise TokenError(f"{source} is empty: it must hold a bearer token")
    if _B64TOKEN.fullmatch(token):
        return token
    found = next(((i, c) for i, c in enumerate(token) if not _TOKEN_CHAR.fullmatch(c)), None)
    if found is None:  # only '=' out of place: padding is the end of a token
        position, what = token.rstrip("=").index("="), "'=' before the end"
    else:
        position, bad = found
        if bad in "\r\n":
            what = "a line break"
        elif bad.isspace():
            what = "white space"
        elif not bad.isascii():
            what = "a non-ASCII character"
        elif not bad.isprintable():
            what = "a control character"
        else:
            what = "a character a bearer token cannot have"
    raise TokenError(
        f"{source} does not hold one bearer token: {what} at character {position + 1} (a token is one "
        "line of letters, digits and -._~+/ with '=' only at its end, RFC 6750)"
    )


def read_token_file(path: Path) -> str:
    """The bearer token in the file ``path`` (see :func:`bearer_token`); :class:`TokenError` when it
    cannot be read, is larger than :data:`MAX_TOKEN_BYTES` or holds no token."""
    source = f"token file {path}"
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_TOKEN_BYTES + 1)
    except OSError as err:
        raise TokenError(f"cannot read {source}: {err.strerror or type(err).__name__}") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise TokenError(f"{source} is larger than {MAX_TOKEN_BYTES // 1024} KiB: it holds no bearer token")
    # Latin-1 maps every byte to one character, so a non-ASCII byte is found and named by position.
    return bearer_token(raw.decode("latin-1"), source)
