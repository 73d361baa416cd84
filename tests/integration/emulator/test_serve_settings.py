"""``fabric-dra emulator serve`` reads each setting from its flag, its environment variable
(``FABRIC_DRA_EMULATOR_<FLAG>``) and the settings file alike: flag > environment > file > default."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from emulator.settings import ENV_PREFIX, EmulatorSettings
from fabric_dra.cli import build_parser
from plumbing import procs
from plumbing.settings import SettingsError, read_settings


def _settings(argv: list[str]) -> EmulatorSettings:
    words = ["emulator", "serve", *argv]
    return read_settings(EmulatorSettings, build_parser(words).parse_args(words), env_prefix=ENV_PREFIX)


def test_flag_over_environment_over_file_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "emulator.yaml"
    config.write_text("state-dir: state\nport: 1111\nlatency: realistic\nusername: file-user\n")
    from_file = _settings(["--config", str(config)])
    assert (from_file.state_dir, from_file.port, from_file.latency) == (tmp_path / "state", 1111, "realistic")
    assert from_file.host == "127.0.0.1" and from_file.insecure_no_auth is False  # defaults
    monkeypatch.setenv("FABRIC_DRA_EMULATOR_PORT", "2222")
    monkeypatch.setenv("FABRIC_DRA_EMULATOR_INSECURE_NO_AUTH", "true")
    monkeypatch.setenv("FABRIC_DRA_PORT", "3")  # the manager's: not the emulator's
    from_env = _settings(["--config", str(config)])
    assert (from_env.port, from_env.insecure_no_auth, from_env.username) == (2222, True, "file-user")
    from_flags = _settings(["--config", str(config), "--port", "3333", "--no-insecure-no-auth"])
    assert (from_flags.port, from_flags.insecure_no_auth, from_flags.latency) == (3333, False, "realistic")


def test_a_bad_value_is_one_line_naming_its_source_and_never_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "emulator.yaml"
    config.write_text("state-dir: state\npassword: [hunter2]\n")
    with pytest.raises(SettingsError, match=rf"^--password \(from {config}\) '\*+': ") as raised:
        _settings(["--config", str(config)])
    assert "hunter2" not in str(raised.value)
    monkeypatch.setenv("FABRIC_DRA_EMULATOR_PORT", "99999")
    with pytest.raises(
        SettingsError, match=r"^--port \(from FABRIC_DRA_EMULATOR_PORT\) '99999': Input should be less"
    ):
        _settings(["--state-dir", str(tmp_path)])
    with pytest.raises(
        SettingsError, match=r"^--state-dir is required \(or set FABRIC_DRA_EMULATOR_STATE_DIR\)"
    ):
        _settings([])


def test_the_real_command_serves_from_a_settings_file_and_the_environment(tmp_path: Path) -> None:
    """The file names the state directory and ready file (relative to the file) and a port the
    variable overrides; a flag picks the latency."""
    config = tmp_path / "conf" / "emulator.yaml"
    config.parent.mkdir()
    config.write_text("state-dir: state\nready-file: url\ninsecure-no-auth: true\nport: 1\nlatency: bogus\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_EMULATOR_")}
    env["FABRIC_DRA_EMULATOR_PORT"] = "0"
    ready = config.parent / "url"
    emulator = procs.RoleProcess(
        ["emulator", "serve", "--config", str(config), "--latency", "instant"],
        ready_file=ready,
        log_file=tmp_path / "emulator.log",
        env=env,
    )
    with emulator:
        assert (config.parent / "state").is_dir()
        assert not emulator.address.endswith(":1")  # the variable's port 0, not the file's 1
        assert httpx.get(f"{emulator.address}/redfish/v1/Systems", timeout=10).status_code == 200
    shown = procs.run(["emulator", "serve", "--help"], env=env)
    assert "(env FABRIC_DRA_EMULATOR_STATE_DIR)" in " ".join(shown.stdout.split())
    refused = procs.run(["emulator", "serve", "--config", str(config)], env=env)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert (
        refused.stderr.strip() == "fabric-dra: error: latency profile 'bogus'" or "'bogus'" in refused.stderr
    )
