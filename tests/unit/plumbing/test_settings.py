"""One declaration per setting (:mod:`plumbing.settings`): read from a flag, the environment and a
settings file alike, first found wins in that order, ``--help`` names the variable, and a value
that does not fit is one line naming where it came from."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from plumbing.settings import (
    OptionKind,
    Section,
    Setting,
    SettingsError,
    add_settings_arguments,
    read_settings,
    settings_options,
)


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


# --- sections, lists and KEY=VALUE dicts (the manager's and the emulator's settings) -------------


@dataclass(frozen=True)
class Retry:
    attempts: int = 3
    pause: float = 0.5


class Client(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    timeout: float = Field(default=30.0, gt=0, description="seconds to wait")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith("http"):
            raise ValueError("url must be http(s)")
        return value


class Role(BaseModel):
    model_config = ConfigDict(extra="forbid")

    client: Annotated[
        Client,
        Section({"url": Setting("the service", flag="--client-url"), "timeout": Setting()}, prefix="client"),
    ]
    retry: Annotated[Retry, Section({"attempts": Setting("tries")}, prefix="retry")] = Retry()
    groups: Annotated[list[str], Setting("a group", flag="--group")] = Field(default_factory=lambda: ["ops"])
    styles: Annotated[
        dict[str, Mode], Setting("a style per fabric", flag="--style", metavar="FABRIC=MODE")
    ] = Field(default_factory=dict)
    follow: Annotated[bool, Setting("follow events")] = True
    password: Annotated[SecretStr | None, Setting("the password")] = None


def _role(argv: list[str], env: dict[str, str]) -> Role:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Role, environ=env)
    return read_settings(Role, parser.parse_args(argv))


def test_a_section_lists_its_fields_with_its_prefix_and_one_name_for_flag_variable_and_key() -> None:
    options = {o.path: o for o in settings_options(Role)}
    assert [(o.flag, o.env, o.key) for o in options.values()][:3] == [
        ("--client-url", "FABRIC_DRA_CLIENT_URL", "client-url"),
        ("--client-timeout", "FABRIC_DRA_CLIENT_TIMEOUT", "client-timeout"),
        ("--retry-attempts", "FABRIC_DRA_RETRY_ATTEMPTS", "retry-attempts"),
    ]
    assert options["client", "timeout"].help == "seconds to wait"  # the field's description
    kinds = {o.option: o.kind for o in options.values()}
    assert kinds["--group"] is OptionKind.REPEATED and kinds["--style"] is OptionKind.PAIRS
    assert kinds["--no-follow"] is OptionKind.NEGATED and kinds["--client-url"] is OptionKind.VALUE


def test_sections_lists_and_dicts_from_flag_environment_and_file_with_the_same_precedence(
    tmp_path: Path,
) -> None:
    config = tmp_path / "role.yaml"
    config.write_text(
        "client-url: http://file\nretry-attempts: 5\ngroup: [a, b]\nstyle: {PCIe: fast}\nfollow: false\n"
    )
    from_file = _role(["--config", str(config)], {})
    assert from_file.client == Client(url="http://file") and from_file.retry == Retry(attempts=5)
    assert (from_file.groups, from_file.styles, from_file.follow) == (["a", "b"], {"PCIe": Mode.FAST}, False)
    env = {"FABRIC_DRA_CLIENT_URL": "http://env", "FABRIC_DRA_GROUP": "c, d", "FABRIC_DRA_STYLE": "CXL=safe"}
    from_env = _role(["--config", str(config)], env)
    assert (from_env.client.url, from_env.groups, from_env.styles) == (
        "http://env",
        ["c", "d"],
        {"CXL": Mode.SAFE},
    )
    argv = ["--config", str(config), "--client-url", "http://flag", "--group", "e", "--group", "f"]
    from_flags = _role([*argv, "--style", "X=fast", "--follow"], env)
    assert (from_flags.client.url, from_flags.groups, from_flags.styles) == (
        "http://flag",
        ["e", "f"],
        {"X": "fast"},
    )
    assert from_flags.follow is True and from_flags.retry.attempts == 5
    defaults = _role(["--client-url", "http://x"], {})
    assert (defaults.groups, defaults.styles, defaults.retry, defaults.client.timeout) == (
        ["ops"],
        {},
        Retry(),
        30.0,
    )


def test_the_namespace_holds_every_setting_with_a_default() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Role, environ={})
    args = parser.parse_args([])
    assert (args.client_timeout, args.retry_attempts, args.groups, args.follow) == (30.0, 3, ["ops"], True)
    assert "client_url" not in vars(args)  # required: no default to hold


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--client-url is required (or set FABRIC_DRA_CLIENT_URL): the service"),
        (["--client-url", "ftp://x"], {}, "--client-url 'ftp://x': invalid setting url: url must be http(s)"),
        (
            ["--client-url", "http://x"],
            {"FABRIC_DRA_CLIENT_TIMEOUT": "-1"},
            "--client-timeout (from FABRIC_DRA_CLIENT_TIMEOUT) '-1': Input should be greater than 0",
        ),
        (
            ["--client-url", "http://x", "--style", "PCIe=reckless"],
            {},
            "--style 'PCIe=reckless': expected FABRIC=MODE with MODE one of fast, safe",
        ),
        (
            ["--client-url", "http://x"],
            {"FABRIC_DRA_STYLE": "PCIe"},
            "--style (from FABRIC_DRA_STYLE) 'PCIe': expected FABRIC=MODE with MODE one of fast, safe",
        ),
    ],
)
def test_a_nested_list_or_dict_value_that_does_not_fit_is_one_line_naming_its_source(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        _role(argv, env)
    assert str(raised.value) == message


def test_a_secret_is_never_echoed(tmp_path: Path) -> None:
    config = tmp_path / "role.yaml"
    config.write_text("client-url: http://x\npassword: [hunter2]\n")
    with pytest.raises(SettingsError) as raised:
        _role(["--config", str(config)], {})
    assert "hunter2" not in str(raised.value) and "--password (from" in str(raised.value)


def test_help_says_a_list_is_repeatable_and_shows_its_default() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Role, environ={})
    text = " ".join(parser.format_help().split())
    assert "a group (env FABRIC_DRA_GROUP; default ops; repeatable)" in text
    assert "--style FABRIC=MODE" in text and "--follow, --no-follow" in text
