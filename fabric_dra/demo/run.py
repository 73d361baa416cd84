"""``fabric-dra demo``: start the stack, run the article's scenario (plain, then with binding
conditions), print what each step observed, stop everything, exit 0 only if every step held."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fabric_dra.demo.scenario import DemoFailure, Scenario, Step, load_manifest
from fabric_dra.stack import DemoStack, StackOptions
from plumbing.logs import configure
from plumbing.procs import RoleStartError

__all__ = ["DemoOptions", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    deploy_dir: Path
    workdir: Path | None = None
    keep_workdir: bool = False
    latency: str = "instant"
    manifest: str = "v1"
    binding_conditions: bool = True
    step_timeout: float = 40.0


class _Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.start = time.monotonic()

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def progress(self, text: str) -> None:
        self.line(f"  [{time.monotonic() - self.start:5.1f}s] {text}")

    def step(self, number: int, step: Step) -> None:
        mark = "ok" if step.ok else "FAILED"
        self.line(f"\nStep {number}/4  {step.title}")
        for item in step.observed:
            self.line(f"    {item}")
        self.line(f"  -> {mark}")


def _manifest_path(options: DemoOptions) -> tuple[Path, str]:
    kind_dir = options.deploy_dir / "kind"
    if options.manifest == "v1":
        return kind_dir / "agent-infrastructure.yaml", "agent-infrastructure.yaml"
    if options.manifest == "v1beta1":
        return kind_dir / "agent-infrastructure.v1beta1.yaml", "agent-infrastructure.v1beta1.yaml"
    path = Path(options.manifest)
    return path, path.name


async def _run_pass(
    scenario: Scenario, printer: _Printer, manifest: list[dict[str, Any]], manifest_name: str, *, bc: bool
) -> bool:
    devices = await scenario.wait_pool_published(binding_conditions=bc)
    await scenario.wait_plugins_registered()
    printer.progress(f"pool published: {devices} devices in ResourceSlices; every node's plugin registered")
    steps: list[Step] = []
    number = 0
    try:
        number = 1
        steps.append(await scenario.step_deploy(manifest, manifest_name))
        printer.step(1, steps[-1])
        number = 2
        step, claim = await scenario.step_claim()
        printer.step(2, step)
        number = 3
        step, device, node = await scenario.step_attach(claim)
        printer.step(3, step)
        number = 4
        printer.step(4, await scenario.step_detach(claim, device, node))
    except DemoFailure as failure:
        printer.line(f"\nStep {number}/4  FAILED: {failure}")
        return False
    return True


async def _run(options: DemoOptions, workdir: Path, printer: _Printer) -> bool:
    manifest_path, manifest_name = _manifest_path(options)
    manifest = load_manifest(manifest_path)
    classes = load_manifest(options.deploy_dir / "base" / "deviceclasses.yaml")
    stack = DemoStack(StackOptions(workdir=workdir, latency=options.latency), progress=printer.progress)
    scenario: Scenario | None = None
    try:
        printer.line("Starting the stack (real processes on real sockets):")
        hosts = stack.start_fabric()
        stack.start_apiserver(hosts)
        stack.register_nodes()
        stack.start_manager()
        stack.start_controller(binding_conditions=False)
        stack.start_plugins()
        scenario = Scenario(stack, printer.line, step_timeout=options.step_timeout)
        await scenario.start_cluster(classes)
        printer.progress(
            "stand-in control plane: scheduler, claim and deployment controllers, one kubelet per node"
        )

        printer.line("\n== Pass 1: the article's scenario (prepare attaches the device)")
        ok = await _run_pass(scenario, printer, manifest, manifest_name, bc=False)
        if ok and options.binding_conditions:
            printer.line("\n== Pass 2: the same with binding conditions (attached before the pod is bound)")
            stack.start_controller(binding_conditions=True)
            ok = await _run_pass(scenario, printer, manifest, manifest_name, bc=True)
        return ok
    except (DemoFailure, RoleStartError) as err:
        printer.line(f"\nFAILED: {err}")
        return False
    finally:
        if scenario is not None:
            await scenario.aclose()
        stack.stop()


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    printer = _Printer(out)
    for needed in (options.deploy_dir / "kind", options.deploy_dir / "base" / "deviceclasses.yaml"):
        if not needed.exists():
            printer.line(
                f"fabric-dra demo: {needed} not found; run from a source checkout or pass --deploy-dir"
            )
            return 2
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fabric-dra-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # The processes log to their own files; this process's own components log to demo.log.
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    log_stream = open(workdir / "logs" / "demo.log", "a")  # noqa: SIM115 - closed below
    # Run in-process (the tests do), the caller's logging comes back once the file is closed.
    root_logger = logging.getLogger()
    saved_handlers, saved_level = root_logger.handlers[:], root_logger.level
    configure(level="info", stream=log_stream)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    printer.line(
        "fabric-dra demo: the composable-DRA article's attach -> verify -> detach scenario, on one machine"
    )
    printer.line(f"  work directory and logs: {workdir}")
    try:
        ok = asyncio.run(_run(options, workdir, printer))
    finally:
        root_logger.handlers[:] = saved_handlers
        root_logger.setLevel(saved_level)
        log_stream.close()
    elapsed = time.monotonic() - printer.start
    if ok:
        printer.line(f"\nAll steps verified in {elapsed:.1f}s; every process stopped.")
        if options.workdir is None and not options.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0
    printer.line(f"\nThe demo failed after {elapsed:.1f}s; every process stopped. Logs: {workdir / 'logs'}")
    return 1
