"""One grammar for the ``fabric-dra`` command line: global options before or after the subcommand,
usage errors exit 2 with the subcommand's usage."""

from __future__ import annotations

import pytest

from fabric_dra.cli import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "debug", "--log-format", "json", "status"],
        ["status", "--log-level", "debug", "--log-format", "json"],
        ["emulator", "topology", "show", "x.yaml", "--log-level", "debug", "--log-format", "json"],
    ],
)
def test_global_options_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser(argv).parse_args(argv)
    assert (args.log_level, args.log_format) == ("debug", "json")


def test_defaults_stay_when_not_given() -> None:
    args = build_parser(["status"]).parse_args(["status"])
    assert (args.log_level, args.log_format) == ("info", "logfmt")


def test_a_usage_error_exits_2_with_the_subcommand_s_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--output", "pie"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fabric-dra status")
    assert "invalid choice: 'pie'" in err
