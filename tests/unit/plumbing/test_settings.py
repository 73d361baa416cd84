"""One declaration per setting (:mod:`plumbing.settings`): read from a flag, the environment and a
settings file alike, first found wins in that order, ``--help`` names the variable, and a value
that does not fit is one line naming where it came from."""

from __future__ import annotations

import argparse
import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field

from plumbing.settings import Setting, SettingsError, add_settings_arguments, read_settings


class Mode(StrEnum):
    FAST = "fast"
    SAFE = "safe"


class Example(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node_name: Annotated[str, Setting("the node", env="NODE_NAME")] = Field(min_length=1)
    timeout: Annotated[float, Setting("seconds to wait", "timing")] = Field(default=30.0, gt=0)
    mode: Annotated[Mode, Setting("how", old_env=("MODE",))] = Mode.SAFE
    state_dir: Annotated[Path | None, Setting("where state goes")] = None
    rescan: Annotated[bool, Setting("rescan the bus")] = False


def _read(argv: list[str], env: dict[str, str]) -> Example:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Example, environ=env)
    return read_settings(Example, parser.parse_args(argv))


def test_a_flag_wins_over_the_environment_which_wins_over_the_file_which_wins_over_the_default(
    tmp_path: Path,
) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("node-name: from-file\ntimeout: 5\nmode: fast\nrescan: true\n")
    file_only = _read(["--config", str(config)], {})
    assert (file_only.node_name, file_only.timeout, file_only.mode, file_only.rescan) == (
        "from-file",
        5.0,
        Mode.FAST,
        True,
    )
    env = {"NODE_NAME": "from-env", "FABRIC_DRA_TIMEOUT": "7"}
    with_env = _read(["--config", str(config)], env)
    assert (with_env.node_name, with_env.timeout, with_env.mode) == ("from-env", 7.0, Mode.FAST)
    with_flags = _read(["--config", str(config), "--node-name", "from-flag", "--no-rescan"], env)
    assert (with_flags.node_name, with_flags.timeout, with_flags.rescan) == ("from-flag", 7.0, False)
    defaults = _read(["--node-name", "n"], {})
    assert (defaults.timeout, defaults.mode, defaults.state_dir, defaults.rescan) == (
        30.0,
        Mode.SAFE,
        None,
        False,
    )
    assert _read(["--node-name", "n"], {"FABRIC_DRA_RESCAN": "true"}).rescan is True


def test_help_names_each_variable_and_default() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Example, environ={})
    text = " ".join(parser.format_help().split())
    assert "the node (env NODE_NAME)" in text
    assert "seconds to wait (env FABRIC_DRA_TIMEOUT; default 30.0)" in text
    assert "rescan the bus (env FABRIC_DRA_RESCAN; default off)" in text
    assert "{fast,safe}" in text and "--config FILE" in text


def test_an_old_variable_name_is_still_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert _read(["--node-name", "n"], {"MODE": "fast"}).mode is Mode.FAST
    assert any("deprecated" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        new = _read(["--node-name", "n"], {"MODE": "fast", "FABRIC_DRA_MODE": "safe"})
    assert new.mode is Mode.SAFE and not caplog.records  # the new name wins, and says nothing


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--node-name is required (or set NODE_NAME): the node"),
        (
            ["--node-name", "n"],
            {"FABRIC_DRA_TIMEOUT": "0"},
            "--timeout (from FABRIC_DRA_TIMEOUT) '0': Input should be greater than 0",
        ),
        (
            ["--node-name", "n", "--timeout", "soon"],
            {},
            "--timeout 'soon': Input should be a valid number, unable to parse string as a number",
        ),
    ],
)
def test_a_value_that_does_not_fit_is_one_line_naming_its_source(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        _read(argv, env)
    assert str(raised.value) == message


def test_a_file_value_names_the_file_and_its_paths_are_relative_to_it(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "settings.yaml"
    config.parent.mkdir()
    config.write_text("node-name: n\nstate-dir: state\n")
    assert _read(["--config", str(config)], {}).state_dir == tmp_path / "conf" / "state"
    config.write_text("node-name: n\ntimeout: -1\n")
    with pytest.raises(
        SettingsError, match=rf"--timeout \(from {config}\) -1: Input should be greater than 0"
    ):
        _read(["--config", str(config)], {})
    config.write_text("node-name: n\ntimeuot: 1\n")
    with pytest.raises(SettingsError, match="unknown setting 'timeuot'"):
        _read(["--config", str(config)], {})
    config.write_text("- a list\n")
    with pytest.raises(SettingsError, match="must be a mapping"):
        _read(["--config", str(config)], {})
    with pytest.raises(SettingsError, match="cannot read settings file"):
        _read(["--config", str(tmp_path / "missing.yaml")], {})


def test_a_choice_from_the_environment_is_checked_as_a_flags_is() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_settings_arguments(parser, Example, environ={"FABRIC_DRA_MODE": "reckless"})
    with pytest.raises(SettingsError, match="--mode \\(from FABRIC_DRA_MODE\\) 'reckless'"):
        read_settings(Example, parser.parse_args(["--node-name", "n"]))
