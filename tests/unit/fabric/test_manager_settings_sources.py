"""``fabric-dra manager serve`` reads each setting from its flag, its environment variable and the
settings file alike (plumbing.settings): flag > environment > file > default, for plain values,
a nested section's (``--redfish-timeout``), lists (``--operator-group``) and ``KEY=VALUE`` dicts
(``--fabric-binding``); a bad value is one line naming where it came from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric.commands.cli import _settings
from fabric_dra.cli import build_parser
from manager_api.devices import BindingStyle
from plumbing import procs
from plumbing.cli import CliError

BASE = ["manager", "serve", "--redfish-auth", "none", "--insecure-no-auth", "--state-dir", "."]


def _write(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "manager.yaml"
    config.write_text(text)
    return config


def test_flag_over_environment_over_file_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = _write(
        tmp_path,
        "redfish-url: http://from-file:1\nredfish-timeout: 11\nport: 1111\noperator-group: [file-ops]\n"
        "fabric-binding: {PCIe: zone}\nwarm-size: 3\nnode-map: hosts.yaml\n",
    )
    args = build_parser().parse_args([*BASE, "--config", str(config)])
    from_file = _settings(args)
    assert (from_file.redfish.base_url, from_file.redfish.read_timeout, from_file.port) == (
        "http://from-file:1",
        11.0,
        1111,
    )
    assert from_file.operator_groups == ["file-ops"]
    assert from_file.binding.fabrics == {"PCIe": BindingStyle.ZONE}
    assert from_file.node_map == tmp_path / "hosts.yaml"  # relative to the file
    assert from_file.warm.size == 3 and from_file.lease_duration == 15.0  # the default

    monkeypatch.setenv("FABRIC_DRA_REDFISH_URL", "http://from-env:1")
    monkeypatch.setenv("FABRIC_DRA_PORT", "2222")
    monkeypatch.setenv("FABRIC_DRA_OPERATOR_GROUP", "env-ops,sre")
    monkeypatch.setenv("FABRIC_DRA_FABRIC_BINDING", "CXL=none")
    from_env = _settings(build_parser().parse_args([*BASE, "--config", str(config)]))
    assert (from_env.redfish.base_url, from_env.port, from_env.redfish.read_timeout) == (
        "http://from-env:1",
        2222,
        11.0,
    )
    assert from_env.operator_groups == ["env-ops", "sre"] and from_env.binding.fabrics == {"CXL": "none"}

    flags = ["--port", "3333", "--operator-group", "flag-ops", "--redfish-url", "http://from-flag:1"]
    from_flags = _settings(build_parser().parse_args([*BASE, "--config", str(config), *flags]))
    assert (from_flags.redfish.base_url, from_flags.port, from_flags.operator_groups) == (
        "http://from-flag:1",
        3333,
        ["flag-ops"],
    )


def test_a_bad_value_names_the_file_or_variable_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _write(tmp_path, "redfish-url: http://x:1\nmax-bindings-per-node: 0\n")
    with pytest.raises(
        CliError, match=rf"--max-bindings-per-node \(from {config}\) 0: Input should be greater"
    ):
        _settings(build_parser().parse_args([*BASE, "--config", str(config)]))
    monkeypatch.setenv("FABRIC_DRA_REDFISH_TIMEOUT", "soon")
    with pytest.raises(CliError, match=r"--redfish-timeout \(from FABRIC_DRA_REDFISH_TIMEOUT\) 'soon'"):
        _settings(build_parser().parse_args([*BASE, "--config", str(config)]))
    config.write_text("redfish-url: http://x:1\nredfish-timout: 3\n")
    with pytest.raises(CliError, match="unknown setting 'redfish-timout'"):
        _settings(build_parser().parse_args([*BASE, "--config", str(config)]))


def test_the_real_command_reads_its_settings_file_and_says_so_in_help(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    shown = procs.run(["manager", "serve", "--help"], env=env)
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    assert "--config FILE" in text
    assert "(env FABRIC_DRA_WARM_SIZE; default 1)" in text and "(env POD_NAME)" in text
    config = _write(tmp_path, "redfish-url: http://127.0.0.1:1\nredfish-auth: none\nwarm-mode: lukewarm\n")
    refused = procs.run(
        ["manager", "serve", "--config", str(config)], env={**env, "FABRIC_DRA_WARM_SIZE": "2"}
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"fabric-dra: error: --warm-mode (from {config}) 'lukewarm': Input should be 'off', 'fixed' or 'auto'"
    )
