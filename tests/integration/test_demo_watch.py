"""The demo notices at once when one of its processes exits, and says which, with that process's
last error, instead of letting a step wait out its timeout (``fabric_dra_testbed.demo.run``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fabric_dra_testbed.demo.run import watch_processes
from fabric_dra_testbed.stack import Stack


def test_an_exited_process_is_named_with_its_last_error(tmp_path: Path) -> None:
    with Stack(tmp_path) as stack:
        emulator = stack.emulator(auth=False)
        role = emulator.role
        roles = {"emulator": role}

        async def scenario() -> tuple[str, float]:
            watching = asyncio.ensure_future(watch_processes(lambda: roles))
            await asyncio.sleep(0.5)
            assert not watching.done(), "a running process is no news"
            with role.log_file.open("a") as log:  # what the process last said, as its log has it
                log.write('ts=x level=error logger=emulator msg="the fabric caught fire"\n')
            role.kill()
            killed = time.monotonic()
            line = await asyncio.wait_for(watching, 10)
            return line, time.monotonic() - killed

        line, seconds = asyncio.run(scenario())
    assert line.startswith("emulator exited with status -9; its last error: "), line
    assert "the fabric caught fire" in line
    assert seconds < 2, f"noticed after {seconds:.1f}s"
