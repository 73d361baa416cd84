"""logfmt and JSON log lines carry no raw control character, whatever a value holds (issue 14,
item 11): CR/LF would forge log lines, ESC drives the terminal, NUL truncates, bidi overrides hide
text."""

from __future__ import annotations

import io
import json
import logging

import pytest

from plumbing.logs import LogFormat, configure, get_logger

CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
INVISIBLE = ["\u2028", "\u2029", "\u202e", "\u2066", "\u200b", "\ufeff", "\U000e0041", "\ud800"]


def _line(fmt: LogFormat, **fields: object) -> str:
    out = io.StringIO()
    configure("info", fmt, stream=out)
    try:
        get_logger("test").info("event", **fields)
    finally:
        logging.getLogger().handlers.clear()
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_every_control_character_is_escaped(fmt: LogFormat) -> None:
    for char in [*CONTROLS, *INVISIBLE]:
        line = _line(fmt, claim=f"a{char}b", msg_is="x")
        assert line.endswith("\n"), repr(line)
        assert char not in line[:-1], f"{char!r} written raw: {line!r}"


def test_logfmt_escapes_as_json_and_leaves_plain_values_alone() -> None:
    line = _line("logfmt", claim="c1\r\nlevel=error\x1b[2J\u202e", device="gpu0", name="née")
    assert 'claim="c1\\r\\nlevel=error\\u001b[2J\\u202e"' in line
    assert json.loads(line.split("claim=", 1)[1].split(" device=")[0]) == "c1\r\nlevel=error\x1b[2J\u202e"
    assert " device=gpu0 " in line and "name=née" in line
