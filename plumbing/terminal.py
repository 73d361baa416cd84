"""Text that is safe to show: the characters no output may carry raw, whoever supplied the value.

A Redfish service names its devices (``Model``, ``Manufacturer``), a Kubernetes user names the
owners of claims (``ownerReferences``), a client sends request fields: any of them may carry
characters that act on whatever shows them. ESC starts a terminal control sequence (``ESC]0;…BEL``
retitles the window, ``ESC[2J`` clears it), CR and LF forge table rows or log lines, NUL truncates,
and the bidi controls reorder what is shown (U+202E makes ``exe.txt`` read ``txt.exe``).

:data:`UNSAFE_CHARACTERS` is that set, declared once: the structured log (:mod:`plumbing.logs`)
writes each as a JSON ``\\uXXXX`` escape, and every line the command line prints goes through
:func:`visible` (:func:`plumbing.cli.emit`, :func:`plumbing.cli.format_table`), which shows each as
a Python-style escape (``\\x1b``, ``\\r``, ``\\u202e``) — visibly, so an operator sees that a name
holds one, rather than silently dropped.
"""

from __future__ import annotations

import re

__all__ = [
    "UNSAFE_CHARACTERS",
    "UNSAFE_CHARACTER_CLASS",
    "has_unsafe",
    "one_line",
    "visible",
    "visible_lines",
]

#: The inside of a regular-expression character class: every C0 and C1 control character and DEL
#: (Unicode "Cc"), the soft hyphen, the invisible format characters that reorder or hide text —
#: Arabic number signs and letter mark (U+0600..U+0605, U+061C), zero-width characters and the
#: left-to-right / right-to-left marks (U+200B..U+200F), the line and paragraph separators (U+2028,
#: U+2029), the bidi embeddings and overrides (U+202A..U+202E), the word joiner, invisible operators
#: and bidi isolates (U+2060..U+206F), the byte order mark, interlinear annotation and tag characters
#: — and lone surrogates, which undecodable bytes become.
UNSAFE_CHARACTER_CLASS = (
    "\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000e0000-\U000e007f"
)
#: One character of :data:`UNSAFE_CHARACTER_CLASS`.
UNSAFE_CHARACTERS = re.compile(f"[{UNSAFE_CHARACTER_CLASS}]")
#: The same, but for the line feed: what may stay in text that is already lines of our own.
_UNSAFE_BUT_LINE_FEED = re.compile(f"(?!\n)[{UNSAFE_CHARACTER_CLASS}]")

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def has_unsafe(text: str) -> bool:
    """Whether ``text`` holds any character of :data:`UNSAFE_CHARACTERS`."""
    return UNSAFE_CHARACTERS.search(text) is not None


def visible(text: str) -> str:
    """``text`` as one line that shows every unsafe character as an escape: ``\\t``, ``\\n``,
    ``\\r``, ``\\xNN`` up to U+00FF, ``\\uNNNN``, ``\\UNNNNNNNN`` (Python's spelling). Other text,
    backslashes included, is left as it is."""
    return UNSAFE_CHARACTERS.sub(_escape, text)


def visible_lines(text: str) -> str:
    """``text`` (lines of our own, joined by ``\\n``) with every unsafe character but the line feed
    shown as :func:`visible` shows it. The backstop of every printed line: a value that could hold a
    line feed is passed through :func:`visible` where it is put in a line, as a table's cells are."""
    return _UNSAFE_BUT_LINE_FEED.sub(_escape, text)


def one_line(text: str, limit: int) -> str:
    """What a service said, fit for an error message, a log line and a Kubernetes Event: control
    characters (line breaks included) replaced, cut at ``limit`` characters."""
    clean = "".join(c if c.isprintable() else " " for c in text).strip()
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."
