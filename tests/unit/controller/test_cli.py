"""``fabric-dra controller``: every flag documented, every user error one clear line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fabric_dra.cli import build_parser, main


def controller_help() -> str:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return str(subparsers.choices["controller"].format_help())


def test_help_explains_every_flag() -> None:
    text = controller_help()
    for flag in (
        "--manager-url",
        "--manager-token-file",
        "--manager-ca-file",
        "--manager-insecure",
        "--kubeconfig",
        "--driver-name",
        "--publisher",
        "--leader-elect",
        "--lease-name",
        "--lease-namespace",
        "--identity",
        "--device-taints",
        "--resync-period",
        "--binding-conditions",
        "--bind-timeout",
        "--busy-timeout",
        "--release-grace",
        "--host",
        "--port",
        "--ready-file",
    ):
        assert flag in text, flag


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--manager-url URL, or --manager NAME=URL"),
        (["--manager", "PCIe=http://m"], "--manager PCIe=…: a manager's name must be a DNS label"),
        (["--manager", "pcie=m:8080"], "--manager pcie=m:8080: expected an http:// or https:// URL"),
        (["--manager-url", "http://m", "--manager", "default=http://n"], "'default' is the name of"),
        (["--manager", "a=http://m", "--manager-ca-files", "b=/ca.pem"], "not given with --manager: b"),
        (["--publisher", "p" * 40, "--manager", "m" * 30 + "=http://m"], "must be a label value"),
        (["--manager-url", "fabric-manager:8080"], "expected an http:// or https:// URL"),
        (["--manager-url", "http://m", "--driver-name", "Fabric_DRA"], "--driver-name"),
        (["--manager-url", "http://m", "--manager-token-file", "/nonexistent/token"], "no such file"),
        (["--manager-url", "http://m", "--publisher", "rack 7"], "--publisher"),
        (["--manager-url", "http://m", "--kubeconfig", "/nonexistent/kubeconfig"], "cannot load Kubernetes"),
    ],
)
def test_user_errors_are_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FABRIC_DRA_MANAGER_URL", raising=False)
    assert main(["controller", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fabric-dra: error:") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["controller", "--manager-url", "http://m", "--resync-period", "0"])
    assert exit_info.value.code == 2
    assert "--resync-period: must be greater than 0" in capsys.readouterr().err


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(
            [
                "controller",
                "--manager-url",
                "http://127.0.0.1:9",
                "--kubeconfig",
                str(kubeconfig),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ]
        )
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "cannot listen on 127.0.0.1" in err and len(err.splitlines()) == 1


def test_settings_come_from_the_environment_and_a_file_as_from_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One declaration per setting: a flag wins over its variable, which wins over the file."""
    from dra_driver.controller.cli import _settings

    settings_file = tmp_path / "controller.yaml"
    settings_file.write_text("manager-url: http://from-file:8080\nbusy-timeout: 12\npublisher: rack-7\n")
    monkeypatch.setenv("FABRIC_DRA_BUSY_TIMEOUT", "20")
    monkeypatch.setenv("POD_NAMESPACE", "fabric-dra")
    monkeypatch.delenv("FABRIC_DRA_MANAGER_URL", raising=False)
    argv = ["controller", "--config", str(settings_file), "--publisher", "rack-8"]
    args = build_parser(argv).parse_args(argv)
    settings = _settings(args)
    assert settings.manager_url == "http://from-file:8080"
    assert settings.busy_timeout == 20.0
    assert settings.publisher == "rack-8"
    assert settings.lease_namespace == settings.plugin_namespace == "fabric-dra"


def test_several_managers_from_flags_and_a_file_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--manager NAME=URL`` again and again, or a mapping in the settings file; a CA file of one of
    them relative to the settings file, as every path in it is."""
    from dra_driver.controller.cli import _settings

    settings_file = tmp_path / "controller.yaml"
    settings_file.write_text(
        "manager-url: http://first:8080\nmanager:\n  gpus: https://gpus:8443\n  memory: https://memory:8443\n"
        "manager-ca-files:\n  memory: ca/memory.pem\nmanager-ca-file: /etc/ca.pem\n"
    )
    monkeypatch.delenv("FABRIC_DRA_MANAGER_URL", raising=False)
    argv = ["controller", "--config", str(settings_file)]
    endpoints = _settings(build_parser(argv).parse_args(argv)).endpoints()
    assert [(e.label, e.url, e.ca_file) for e in endpoints] == [
        ("default", "http://first:8080", Path("/etc/ca.pem")),
        ("gpus", "https://gpus:8443", Path("/etc/ca.pem")),
        ("memory", "https://memory:8443", tmp_path / "ca" / "memory.pem"),
    ]
    monkeypatch.chdir(tmp_path)
    argv = [
        "controller",
        "--manager",
        "b=http://b",
        "--manager",
        "a=http://a",
        "--manager-ca-files",
        "a=a.pem",
    ]
    endpoints = _settings(build_parser(argv).parse_args(argv)).endpoints()
    assert [(e.name, e.ca_file) for e in endpoints] == [("b", None), ("a", tmp_path / "a.pem")]


def test_help_names_the_environment_variable_of_each_setting() -> None:
    text = " ".join(controller_help().split())
    assert "env FABRIC_DRA_MANAGER_URL" in text and "env FABRIC_DRA_BIND_TIMEOUT; default 300.0" in text
    assert "env POD_NAMESPACE" in text and "--config FILE" in text
