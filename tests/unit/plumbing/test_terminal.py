"""One rendering path for everything the command line prints (issue 33, class fix): every control,
bidi and invisible character is shown as an escape — never written raw, never dropped — in tables,
lines, YAML and JSON, and no command prints any other way."""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import pytest
import yaml

from plumbing.cli import dump_document, emit, format_table
from plumbing.terminal import UNSAFE_CHARACTERS, has_unsafe, visible, visible_lines

REPO = Path(__file__).resolve().parents[3]

#: what the issue names: C0 and C1 controls, DEL, the line and paragraph separators, the bidi
#: embeddings, overrides and isolates, the directional marks and the Arabic letter mark
NAMED = [
    *(chr(c) for c in range(0x20)),
    "\x7f",
    *(chr(c) for c in range(0x80, 0xA0)),
    "\u2028",
    "\u2029",
    *(chr(c) for c in range(0x202A, 0x202F)),
    *(chr(c) for c in range(0x2066, 0x206A)),
    "\u200e",
    "\u200f",
    "\u061c",
]
HOSTILE = "H100\x1b]0;owned\x07\x1b[2J\r\nFORGED  row\u202eexe.txt\u2066\x9b31m\U000e0041"


@pytest.mark.parametrize("char", NAMED, ids=[f"U+{ord(c):04X}" for c in NAMED])
def test_each_unsafe_character_is_shown_as_an_escape(char: str) -> None:
    shown = visible(f"a{char}b")
    assert not has_unsafe(shown), repr(shown)
    assert shown.startswith("a\\") and shown.endswith("b") and len(shown) > 3, repr(shown)
    # Python's own spelling: the escape reads back as the character.
    assert shown[1:-1].encode().decode("unicode_escape") == char


def test_plain_text_is_left_alone() -> None:
    for text in ("NVIDIA H100 PCIe", "née", "日本語", "a\\x1b (a backslash, not an escape)", ""):
        assert visible(text) == text
    assert visible("\t\n\r") == "\\t\\n\\r"


def test_lines_keep_their_line_feeds_and_nothing_else() -> None:
    assert visible_lines("one\x1b[2J\ntwo\r\u202e") == "one\\x1b[2J\ntwo\\r\\u202e"


def test_a_table_cell_stays_on_its_row() -> None:
    table = format_table(["MODEL", "FREE"], [[HOSTILE, "3"], ["L40S", "1"]])
    lines = table.splitlines()
    assert len(lines) == 3, table
    assert not has_unsafe(table.replace("\n", "")), table
    assert lines[1].startswith("H100\\x1b]0;owned\\x07\\x1b[2J\\r\\nFORGED  row\\u202eexe.txt")
    # Columns are aligned on what is shown.
    assert lines[1].index(" 3") == lines[2].index(" 1") == lines[0].index(" FREE")


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_documents_show_no_unsafe_character_and_read_back_the_same(fmt: str) -> None:
    document = {"model": HOSTILE, "plain": "née", HOSTILE: [1, "\u2028", {"k": "\x85"}]}
    text = dump_document(document, fmt)
    assert not has_unsafe(text.replace("\n", "")), text
    assert (yaml.safe_load(text) if fmt == "yaml" else json.loads(text)) == document
    if fmt == "yaml":
        assert "plain: née" in text  # what needs no escape is written as it is


def test_emit_is_the_backstop() -> None:
    out = io.StringIO()
    emit(f"title\n{HOSTILE}", file=out)
    text = out.getvalue()
    assert text.endswith("\n") and not has_unsafe(text.replace("\n", ""))
    assert text.startswith("title\nH100\\x1b]0;owned\\x07")


# -- every command prints through plumbing.cli ----------------------------------------------------

#: the packages whose commands print what came from a Redfish service or the cluster
PRINTING = ("fabric", "dra_driver", "fabric_dra", "emulator", "plumbing", "manager_api")
#: the one place that prints, and a QEMU guest's agent that writes to the guest's console
ALLOWED = {"plumbing/cli.py", "emulator/qemu/agent.py"}


def _raw_writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: print()")
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in ("write", "writelines")
            and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name)
            and func.value.value.id == "sys"
            and func.value.attr in ("stdout", "stderr")
        ):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: sys.{func.value.attr}.{func.attr}()")
    return found


def test_commands_print_only_through_emit() -> None:
    found = [
        write
        for package in PRINTING
        for path in sorted((REPO / package).rglob("*.py"))
        if str(path.relative_to(REPO)) not in ALLOWED and "/proto/" not in str(path)
        for write in _raw_writes(path)
    ]
    assert found == [], "print through plumbing.cli.emit:\n" + "\n".join(found)


def test_the_log_and_the_terminal_share_one_set() -> None:
    from plumbing import logs

    assert logs._UNSAFE_CHAR is UNSAFE_CHARACTERS
