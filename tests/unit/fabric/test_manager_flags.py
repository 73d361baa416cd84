"""``fabric-dra manager serve``'s options are derived from the settings model: each is declared once,
as a field, and a command line becomes exactly the settings it says."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fabric.commands.cli import _settings
from fabric.driver.settings import OperationSettings
from fabric.redfish.client import RedfishSettings
from fabric.service.config import FlagKind, ManagerSettings, manager_flags
from fabric_dra.cli import build_parser
from manager_api.devices import BindingStyle
from plumbing.cli import CliError

BASE = ["manager", "serve", "--redfish-url", "http://127.0.0.1:1", "--redfish-auth", "none"]


def _parse(*args: str) -> argparse.Namespace:
    return build_parser().parse_args([*BASE, "--insecure-no-auth", "--state-dir", ".", *args])


def test_every_flag_is_a_field_and_no_field_is_forgotten() -> None:
    flags = manager_flags()
    options = [f.option for f in flags]
    assert len(options) == len(set(options))
    top = {f.path[0] for f in flags}
    # Not flags: set from the environment (in_cluster) or other flags (credentials file → username).
    assert set(ManagerSettings.model_fields) - top == {"in_cluster"}
    assert {f.option for f in flags if f.kind is FlagKind.NEGATED} == {"--no-events"}


def test_nothing_given_is_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("POD_NAME", raising=False)
    settings = _settings(_parse())
    expected = ManagerSettings(
        redfish=RedfishSettings(base_url="http://127.0.0.1:1", auth="none"),
        insecure_no_auth=True,
        state_dir=Path.cwd(),  # "--state-dir ." as every path option: absolute (fabric_dra.cli)
    )
    assert settings == expected
    assert settings.operator_groups == ["fabric-dra:operators"]


def test_a_command_line_becomes_the_settings_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "manager-0")
    settings = _settings(
        _parse(
            *("--redfish-timeout", "7", "--redfish-concurrency", "3", "--binding-style", "composition"),
            *("--fabric-binding", "CXL=none", "--fabric-binding", "PCIe=zone", "--no-events"),
            *("--task-timeout", "9", "--operator-group", "ops", "--operator-group", "sre", "--port", "0"),
        )
    )
    assert (settings.redfish.read_timeout, settings.redfish.max_workers) == (7.0, 3)
    assert settings.binding.default is BindingStyle.COMPOSITION
    assert settings.binding.fabrics == {"CXL": "none", "PCIe": BindingStyle.ZONE}
    assert settings.events is False and settings.port == 0
    assert settings.binder == OperationSettings(task_timeout=9.0)
    assert settings.operator_groups == ["ops", "sre"]
    assert settings.identity == "manager-0"


def test_bad_values_are_refused_with_the_flag_or_field_named() -> None:
    with pytest.raises(CliError, match="--fabric-binding 'PCIe=teleport': expected FABRIC=STYLE"):
        _settings(_parse("--fabric-binding", "PCIe=teleport"))
    with pytest.raises(CliError, match="invalid setting base_url"):
        _settings(
            build_parser().parse_args(
                ["manager", "serve", "--redfish-url", "ftp://x", "--redfish-auth", "none"]
            )
        )
    with pytest.raises(SystemExit):
        _parse("--binding-style", "none")  # only a single fabric can be left alone
