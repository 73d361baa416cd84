"""Run ``fabric-dra emulator serve`` as a real process in tests (a thin wrapper of
:meth:`fabric_dra_testbed.stack.Stack.emulator`), and talk to it.

    with run_emulator(tmp_path) as emu:
        emu.client().post(f"/redfish/v1/Systems/kind-worker/Actions/ComputerSystem.AddResourceBlock", ...)
        assert emu.bindings()["Bindings"][0]["Host"] == "kind-worker"
        emu.inject({"Kind": "PortDown", "Host": "kind-worker"})

``emu.kill()`` is a ``kill -9``; ``emu.restart()`` starts the emulator again on the same state
directory and port. ``emu.sysfs("kind-worker")`` is that host's ``--sysfs-root``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from fabric_dra_testbed.stack import (
    BLOCKS,
    CONNECTIONS,
    ENDPOINTS,
    ZONES,
    Stack,
    block_action,
    connection_body,
    zone_add,
    zone_remove,
)
from fabric_dra_testbed.stack import Emulator as RunningEmulator

__all__ = [
    "BLOCKS",
    "CONNECTIONS",
    "ENDPOINTS",
    "ZONES",
    "RunningEmulator",
    "block_action",
    "connection_body",
    "run_emulator",
    "with_behaviour",
    "zone_add",
    "zone_remove",
]


@contextlib.contextmanager
def run_emulator(
    tmp_dir: Path,
    *,
    topology: Path | None = None,
    latency: str = "instant",
    extra_args: Sequence[str] = (),
    name: str = "emulator",
) -> Iterator[RunningEmulator]:
    """A running emulator with its own state directory (``tmp_dir/<name>-state``) and log
    (``tmp_dir/<name>.log``); always stopped. ``--insecure-no-auth`` in ``extra_args`` is known to
    the handle (no credentials are sent)."""
    no_auth = "--insecure-no-auth" in extra_args
    args = [a for a in extra_args if a != "--insecure-no-auth"]
    with Stack(tmp_dir, logs_dir=tmp_dir) as stack:
        yield stack.emulator(
            name=name,
            state_dir=tmp_dir / f"{name}-state",
            topology=topology,
            latency=latency,
            auth=not no_auth,
            extra_args=args,
        )


def with_behaviour(path: Path, out: Path, **behaviour: str) -> Path:
    """The topology at ``path`` with ``behaviour`` options (camelCase keys, as in the file) merged
    over its own, written to ``out``; ``out`` is returned."""
    data = yaml.safe_load(path.read_text())
    if behaviour:
        data["behaviour"] = {**data.get("behaviour", {}), **behaviour}
    out.write_text(yaml.safe_dump(data))
    return out


def slow_gpu_profile(directory: Path, seconds: float) -> Path:
    """A latency profile in ``directory`` whose GPU hot-add runs as a Redfish task of ``seconds``,
    its monitor asking to be polled again after 1 s; the profile's path."""
    profile = directory / "slow-gpu.yaml"
    profile.write_text(
        f"name: slow-gpu\ntasks: true\nbind: {{gpu: {{seconds: {seconds}}}}}\nretryAfterSeconds: 1\n"
    )
    return profile
