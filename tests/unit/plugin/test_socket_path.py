"""A socket path that does not fit a unix socket (108 bytes or more) stops the plugin at start with
one line naming the flag to shorten, never with grpc's traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plumbing import procs


def _dir_for(total: int, name: str, base: Path) -> Path:
    """A directory under ``base`` whose ``/<name>`` path is exactly ``total`` bytes."""
    room = total - len(os.fsencode(base)) - len(f"/{name}") - 1
    directory = base / ("d" * room)
    directory.mkdir(parents=True)
    assert len(os.fsencode(directory / name)) == total
    return directory


@pytest.mark.parametrize(
    ("flag", "name", "size"),
    [("--plugin-dir", "dra.sock", 108), ("--registry-dir", "fabric-dra.io-reg.sock", 120)],
)
def test_a_too_long_socket_path_is_one_line_naming_the_flag(
    short_tmp: Path, flag: str, name: str, size: int
) -> None:
    long_dir = _dir_for(size, name, short_tmp)
    other = "--registry-dir" if flag == "--plugin-dir" else "--plugin-dir"
    args = ["--node-name", "n1", "--device-backend", "noop", "--cdi-root", str(short_tmp / "cdi")]
    args += [flag, str(long_dir), other, str(short_tmp / "o")]
    done = procs.run(["plugin", *args])
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "add_port" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        f"fabric-dra: error: socket path {long_dir / name} is {size} bytes, longer than the 107 a "
        f"unix socket allows; pass a shorter {flag}"
    ]


def test_107_bytes_still_fit(short_tmp: Path) -> None:
    from dra_driver.plugin.config import PluginConfig, socket_path_problem

    plugin_dir = _dir_for(107, "dra.sock", short_tmp)
    config = PluginConfig(
        node_name="n1",
        registry_dir=short_tmp / "r",
        plugin_dir=plugin_dir,
        cdi_root=short_tmp / "c",
        sysfs_root=short_tmp / "s",
    )
    assert socket_path_problem(config) is None
