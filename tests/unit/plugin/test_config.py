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
