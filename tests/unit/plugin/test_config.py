from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dra_driver.plugin.config import HostMode, add_arguments, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_follow_the_kubelet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.delenv("POD_UID", raising=False)
    cfg = config_from_args(parse("--manager-url", "https://manager:8443"))
    assert cfg.node_name == "node-a"
    assert cfg.registration_socket == Path("/var/lib/kubelet/plugins_registry/fabric-dra.io-reg.sock")
    assert cfg.dra_socket == Path("/var/lib/kubelet/plugins/fabric-dra.io/dra.sock")
    assert cfg.cdi_root == Path("/var/run/cdi")
    assert cfg.host_mode is HostMode.REAL  # --sysfs-root /sys


def test_pod_uid_gives_per_pod_socket_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.setenv("POD_UID", "7d1c0d35-7f6a-4bd4-9e55-2f0c3b7a1e42")
    cfg = config_from_args(parse("--manager-url", "http://m", "--sysfs-root", str(tmp_path)))
    assert cfg.registration_socket.name == "fabric-dra.io-7d1c0d35-7f6a-4bd4-9e55-2f0c3b7a1e42-reg.sock"
    assert cfg.dra_socket.name == "dra-7d1c0d35-7f6a-4bd4-9e55-2f0c3b7a1e42.sock"
    assert cfg.host_mode is HostMode.EMULATED


def test_missing_node_name_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(ValueError, match="NODE_NAME"):
        config_from_args(parse("--manager-url", "http://m"))


def test_fabric_backend_needs_a_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRIC_DRA_MANAGER_URL", raising=False)
    with pytest.raises(ValueError, match="--manager-url"):
        config_from_args(parse("--node-name", "n"))
    assert config_from_args(parse("--node-name", "n", "--device-backend", "noop")).manager_url is None


def test_driver_name_must_be_a_dns_subdomain() -> None:
    with pytest.raises(ValueError, match="DNS subdomain"):
        config_from_args(parse("--node-name", "n", "--device-backend", "noop", "--driver-name", "Fabric_DRA"))


def test_every_variable_carries_the_projects_prefix_but_the_downward_apis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "NODE_NAME",
        "POD_UID",
        "DRIVER_NAME",
        "PLUGIN_DIR",
        "SYSFS_ROOT",
        "HOST_MODE",
        "KUBECONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NODE_NAME", "node-b")
    monkeypatch.setenv("POD_UID", "7d1c0d35-7f6a-4bd4-9e55-2f0c3b7a1e42")
    monkeypatch.setenv("FABRIC_DRA_PLUGIN_DIR", "/run/plug")
    monkeypatch.setenv("FABRIC_DRA_SYSFS_ROOT", "/srv/hosts/h1/sys")
    monkeypatch.setenv("FABRIC_DRA_DEVICE_BACKEND", "noop")
    monkeypatch.setenv("FABRIC_DRA_VISIBLE_TIMEOUT", "9")
    cfg = config_from_args(parse())
    assert (cfg.node_name, cfg.pod_uid) == ("node-b", "7d1c0d35-7f6a-4bd4-9e55-2f0c3b7a1e42")
    assert cfg.plugin_dir == Path("/run/plug") and cfg.host_mode is HostMode.EMULATED
    assert cfg.visible_timeout == 9.0


def test_the_unprefixed_names_of_earlier_releases_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-b")
    monkeypatch.setenv("DEVICE_BACKEND", "noop")
    monkeypatch.setenv("CDI_ROOT", "/run/cdi")
    monkeypatch.delenv("FABRIC_DRA_CDI_ROOT", raising=False)
    cfg = config_from_args(parse())
    assert cfg.cdi_root == Path("/run/cdi") and cfg.manager_url is None


def test_the_flags_are_those_of_earlier_releases() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    earlier = {
        "--node-name", "--pod-uid", "--driver-name", "--registry-dir", "--plugin-dir", "--cdi-root",
        "--sysfs-root", "--host-mode", "--device-backend", "--pci-rescan", "--no-pci-rescan",
        "--host-removal", "--no-host-removal", "--visible-timeout", "--manager-url",
        "--manager-token-file", "--manager-ca-file", "--attach-retry-seconds", "--report-seconds",
        "--kubeconfig", "--ready-file", "--deadline-margin", "--registration-timeout", "--metrics-port",
        "--metrics-host",
    }  # fmt: skip
    assert flags == earlier | {
        "--config", "--memory-mode", "--cdi-hook-path", "--claim-status", "--no-claim-status",
        "--link-hold-seconds", "--link-recover-seconds", "--link-correctable-per-minute",
        "--manager", "--manager-token-files", "--manager-ca-files",
    }  # fmt: skip
