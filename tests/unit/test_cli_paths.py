"""Every path argument of every ``fabric-dra`` command is made absolute when parsed: a relative
``--plugin-dir`` once became the unix socket address ``unix://rel/dra.sock``, whose ``rel`` gRPC
reads as a host name."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from fabric_dra.cli import build_parser
from plumbing.settings import path_pair


def _path_options(
    parser: argparse.ArgumentParser, words: list[str]
) -> list[tuple[list[str], str, argparse.ArgumentParser, argparse.Action]]:
    """(subcommand words, option, its parser, its action) of every option of ``type=Path``."""
    populate = getattr(parser, "_populate", None)
    if populate is not None:  # ``manager serve`` adds its options when first used
        populate()
    found: list[tuple[list[str], str, argparse.ArgumentParser, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _path_options(sub, [*words, name])
        elif action.type is Path and action.option_strings:
            found.append((words, action.option_strings[-1], parser, action))
    return found


OPTIONS = _path_options(build_parser([]), [])


def test_the_commands_that_take_paths_are_all_seen() -> None:
    seen = {(" ".join(words), option) for words, option, _, _ in OPTIONS}
    for expected in [
        ("plugin", "--plugin-dir"),
        ("plugin", "--registry-dir"),
        ("plugin", "--cdi-root"),
        ("emulator serve", "--state-dir"),
        ("manager serve", "--state-dir"),
        ("status", "--token-file"),
        ("status", "--ca-file"),
        ("explain", "--classes"),
        ("explain", "--slices"),
        ("controller", "--manager-token-file"),
        ("controller", "--manager-ca-file"),
        ("manager serve", "--redfish-ca-file"),
        ("demo", "--workdir"),
    ]:
        assert expected in seen, sorted(seen)


def _all_options(parser: argparse.ArgumentParser, words: list[str]) -> list[tuple[str, argparse.Action]]:
    populate = getattr(parser, "_populate", None)
    if populate is not None:
        populate()
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _all_options(sub, [*words, name])
        elif action.option_strings:
            found.append((" ".join(words), action))
    return found


#: options that name files but stay as given: kubeconfig follows kubectl (also a ``:``-separated
#: list through $KUBECONFIG, resolved by the Kubernetes client's own rules)
AS_GIVEN = {"--kubeconfig"}


def test_every_option_that_names_a_file_or_directory_is_a_path() -> None:
    """An option named ``--…-file``/``--…-dir``/``--…-root`` or shown as FILE/DIR/PATH is
    ``type=Path``, so the rule above reaches it; a new flag that forgets it fails here."""
    strays = []
    for words, action in _all_options(build_parser([]), []):
        option = action.option_strings[-1]
        looks_like_path = option.endswith(("-file", "-dir", "-root", "-files")) or action.metavar in (
            "FILE",
            "DIR",
            "PATH",
        )
        # a dict of paths (NAME=FILE, repeatable) has each path made absolute by plumbing.settings.path_pair
        if looks_like_path and option not in AS_GIVEN and action.type not in (Path, path_pair):
            strays.append(f"{words} {option}")
    assert not strays, strays


@pytest.mark.parametrize(
    ("parser", "action"),
    [(p, a) for _, _, p, a in OPTIONS],
    ids=[f"{' '.join(w)} {o}" for w, o, _, _ in OPTIONS],
)
def test_a_relative_path_option_is_parsed_absolute(
    parser: argparse.ArgumentParser, action: argparse.Action, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the command's parser makes of ``OPTION rel/x`` (its required options aside)."""
    monkeypatch.chdir(tmp_path)
    value = parser._get_values(action, ["rel/x"])
    assert value == tmp_path / "rel" / "x"


def test_a_relative_plugin_dir_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["plugin", "--plugin-dir", "rel/plug", "--registry-dir", "reg", "--node-name", "n1"]
    args = build_parser(argv).parse_args(argv)
    assert (args.plugin_dir, args.registry_dir) == (tmp_path / "rel" / "plug", tmp_path / "reg")


def test_a_path_from_the_environment_is_absolute_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLUGIN_DIR", "plugins")
    args = build_parser(["plugin"]).parse_args(["plugin"])
    assert args.plugin_dir == tmp_path / "plugins"


def test_home_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["plugin", "--plugin-dir", "~/plug"]
    args = build_parser(argv).parse_args(argv)
    assert args.plugin_dir == Path(os.path.expanduser("~")) / "plug"


def test_a_dict_of_paths_has_each_path_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert path_pair("memory=ca/memory.pem") == f"memory={tmp_path / 'ca' / 'memory.pem'}"
    assert path_pair("memory=/etc/ca.pem") == "memory=/etc/ca.pem"
    assert path_pair("no-value") == "no-value"  # left for the pair's own one-line error
