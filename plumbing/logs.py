"""Structured logging shared by every role: one event per line, ``key=value`` or JSON.

Usage::

    log = get_logger(__name__)
    log.info("attach started", claim=claim_uid, device=device, node=node)

Every role calls :func:`configure` once from its command-line entry point.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal, TextIO

from plumbing.terminal import UNSAFE_CHARACTER_CLASS, UNSAFE_CHARACTERS

__all__ = ["LogFormat", "StructLogger", "configure", "get_logger"]

LogFormat = Literal["logfmt", "json"]
_FIELDS = "fabric_dra_fields"


# Characters a log line must never carry raw, whoever supplied the value (a claim UID, a device
# name, a Redfish message): plumbing.terminal declares them once for the log and the command line.
_UNSAFE_CHAR = UNSAFE_CHARACTERS
_NEEDS_QUOTES = re.compile(f'[ ="{UNSAFE_CHARACTER_CLASS}]')


def _escape_char(match: re.Match[str]) -> str:
    # JSON's escape: \uXXXX, a surrogate pair above the Basic Multilingual Plane.
    code = ord(match.group())
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _escape_controls(text: str) -> str:
    """``text`` with every character of :data:`~plumbing.terminal.UNSAFE_CHARACTERS` written as a
    JSON ``\\uXXXX`` escape."""
    return _UNSAFE_CHAR.sub(_escape_char, text)


def _logfmt_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or _NEEDS_QUOTES.search(text):
        # json.dumps escapes quotes, backslashes and C0 controls; the other unsafe characters after it.
        return _escape_controls(json.dumps(text, ensure_ascii=False))
    return text


class _Formatter(logging.Formatter):
    def __init__(self, fmt: LogFormat) -> None:
        super().__init__()
        self._fmt_kind = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, _FIELDS, None)
        if isinstance(extra, Mapping):
            fields.update(extra)
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info)
        if self._fmt_kind == "json":
            # ensure_ascii escapes every character outside printable ASCII, DEL included.
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


class StructLogger:
    """A thin wrapper over :class:`logging.Logger` that takes fields as keyword arguments."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    @property
    def name(self) -> str:
        return self._logger.name

    def isEnabledFor(self, level: int) -> bool:
        return self._logger.isEnabledFor(level)

    def _log(self, level: int, msg: str, exc_info: bool, fields: dict[str, Any]) -> None:
        logger = self._logger
        if logger.isEnabledFor(level):
            # makeRecord + handle, not log(): log() walks the stack to find the caller's file and
            # line (findCaller), which no line we write shows — a third of a record's cost.
            record = logger.makeRecord(
                logger.name,
                level,
                "",
                0,
                msg,
                (),
                sys.exc_info() if exc_info else None,
                extra={_FIELDS: fields},
            )
            logger.handle(record)

    def debug(self, msg: str, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, **fields: Any) -> None:
        self._log(logging.ERROR, msg, False, fields)

    def exception(self, msg: str, **fields: Any) -> None:
        self._log(logging.ERROR, msg, True, fields)


def get_logger(name: str) -> StructLogger:
    return StructLogger(logging.getLogger(name))


def configure(level: str = "info", fmt: LogFormat = "logfmt", stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr by default) as one structured line."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Access logs of the HTTP servers duplicate our own request events and cost time on hot paths.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
