"""``fabric-dra demo``: start the stack, run the article's scenario (plain, then with binding
conditions), print what each step observed, stop everything, exit 0 only if every step held."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from fabric_dra_testbed.demo.scenario import DemoFailure, Scenario, Step, load_manifest
from fabric_dra_testbed.demo.sharing import PARTITIONS_ONLY_WITH_BINDING_CONDITIONS, SharingSteps
from fabric_dra_testbed.stack import DemoStack, Role, StackOptions
from plumbing.cli import emit
from plumbing.logs import configure
from plumbing.procs import RoleStartError

__all__ = ["DemoOptions", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    #: a checkout's deploy/ directory; None: the manifests installed with the package
    deploy_dir: Path | None = None
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
        emit(text, file=self.out)

    def progress(self, text: str) -> None:
        self.line(f"  [{time.monotonic() - self.start:5.1f}s] {text}")

    def step(self, number: int, total: int, step: Step, seconds: float) -> None:
        mark = "ok" if step.ok else "FAILED"
        self.line(f"\nStep {number}/{total}  {step.title}")
        for item in step.observed:
            self.line(f"    {item}")
        self.line(f"  -> {mark} in {seconds:.1f}s")


#: The DeviceClasses, the article's manifests and the sharing ones as deploy/ holds them, shipped
#: with the package (fabric_dra/demo/manifests links to deploy/: one copy in the repository, files
#: in a wheel).
_PACKAGED = {
    "classes": "deviceclasses.yaml",
    "v1": "agent-infrastructure.yaml",
    "v1beta1": "agent-infrastructure.v1beta1.yaml",
    "partitions": "gpu-partitions.yaml",
    "memory": "cxl-memory.yaml",
}
_IN_DEPLOY_DIR = {
    "classes": "base/deviceclasses.yaml",
    "v1": "kind/agent-infrastructure.yaml",
    "v1beta1": "kind/agent-infrastructure.v1beta1.yaml",
    "partitions": "kind/gpu-partitions.yaml",
    "memory": "kind/cxl-memory.yaml",
}
#: the manifests of the sharing steps, applied after the article's in each pass
_SHARING = ("partitions", "memory")


def packaged_manifests() -> Path:
    """The directory of the manifests installed with fabric-dra."""
    return Path(str(resources.files("fabric_dra_testbed.demo").joinpath("manifests")))


def _manifest_file(options: DemoOptions, which: str) -> Path:
    if options.deploy_dir is not None:
        return options.deploy_dir / _IN_DEPLOY_DIR[which]
    return packaged_manifests() / _PACKAGED[which]


def _manifest_path(options: DemoOptions) -> tuple[Path, str]:
    if options.manifest in ("v1", "v1beta1"):
        path = _manifest_file(options, options.manifest)
        return path, _PACKAGED[options.manifest]
    path = Path(options.manifest).expanduser().absolute()
    return path, path.name


@dataclass(frozen=True)
class _Manifests:
    """What a pass applies: the article's manifest, then the sharing ones (name, objects each)."""

    article: tuple[str, list[dict[str, Any]]]
    partitions: tuple[str, list[dict[str, Any]]]
    memory: tuple[str, list[dict[str, Any]]]


class _Pass:
    """One pass's steps, numbered and timed as they are printed."""

    def __init__(self, printer: _Printer, total: int) -> None:
        self.printer = printer
        self.total = total
        self.number = 0
        self.started = time.monotonic()

    def took(self) -> float:
        """Seconds since the step began; the next step begins now."""
        now = time.monotonic()
        seconds, self.started = now - self.started, now
        return seconds

    def begin(self) -> None:
        self.number += 1

    def done(self, step: Step) -> None:
        self.printer.step(self.number, self.total, step, self.took())

    def failed(self, failure: DemoFailure) -> None:
        self.printer.line(f"\nStep {self.number}/{self.total}  FAILED: {failure} (after {self.took():.1f}s)")


async def _run_pass(scenario: Scenario, printer: _Printer, manifests: _Manifests, *, bc: bool) -> bool:
    devices = await scenario.wait_pool_published(binding_conditions=bc)
    await scenario.wait_plugins_registered()
    printer.progress(f"pool published: {devices} devices in ResourceSlices; every node's plugin registered")
    sharing = SharingSteps(scenario)
    steps = _Pass(printer, 8 if bc else 6)
    manifest, manifest_name = manifests.article[1], manifests.article[0]
    try:
        steps.begin()
        steps.done(await scenario.step_deploy(manifest, manifest_name))
        steps.begin()
        step, claim = await scenario.step_claim()
        steps.done(step)
        steps.begin()
        step, device, node = await scenario.step_attach(claim)
        steps.done(step)
        steps.begin()
        steps.done(await scenario.step_detach(claim, device, node))
        if bc:
            steps.begin()
            step, held = await sharing.step_partitions(manifests.partitions[1], manifests.partitions[0])
            steps.done(step)
            steps.begin()
            steps.done(await sharing.step_partitions_end(held))
        else:
            printer.line(f"\n  {PARTITIONS_ONLY_WITH_BINDING_CONDITIONS}")
        steps.begin()
        step, held = await sharing.step_memory(manifests.memory[1], manifests.memory[0])
        steps.done(step)
        steps.begin()
        steps.done(await sharing.step_memory_end(held))
    except DemoFailure as failure:
        steps.failed(failure)
        return False
    return True


#: how often the demo checks that every process it started still runs
_WATCH_SECONDS = 0.2


def last_error(role: Role) -> str:
    """The last line of ``role``'s log that reports an error (else its last line), for one line."""
    lines = [line.strip() for line in role.tail(200).splitlines() if line.strip()]
    for line in reversed(lines):
        if "level=error" in line or "Error" in line or "error:" in line:
            return line
    return lines[-1] if lines else "(its log is empty)"


async def watch_processes(processes: Callable[[], Mapping[str, Role]]) -> str:
    """Return, as soon as one of ``processes`` has exited, a line naming it and its last error."""
    while True:
        for name, role in processes().items():
            proc = role.proc
            if proc is not None and proc.poll() is not None:
                return f"{name} exited with status {proc.returncode}; its last error: {last_error(role)}"
        await asyncio.sleep(_WATCH_SECONDS)


async def _while_running(
    processes: Callable[[], Mapping[str, Role]], work: Coroutine[Any, Any, bool], printer: _Printer
) -> bool:
    """``work``'s result, or False at once (``work`` cancelled) when a process of the stack exits:
    a step would otherwise wait out its timeout for a system that can no longer answer."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(watch_processes(processes))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        printer.line(f"\nFAILED: {watcher.result()}")
        return False
    finally:
        for pending in (task, watcher):
            pending.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)


async def _run(options: DemoOptions, workdir: Path, printer: _Printer) -> bool:
    manifest_path, manifest_name = _manifest_path(options)
    manifests = _Manifests(
        (manifest_name, load_manifest(manifest_path)),
        *((_PACKAGED[m], load_manifest(_manifest_file(options, m))) for m in _SHARING),
    )
    classes = load_manifest(_manifest_file(options, "classes"))
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

        printer.line(
            "\n== Pass 1: the article's scenario, then CXL memory from a pool (prepare attaches the devices)"
        )

        def processes() -> Mapping[str, Role]:  # read at each check: a restart replaces a process
            return stack.processes

        ok = await _while_running(processes, _run_pass(scenario, printer, manifests, bc=False), printer)
        if ok and options.binding_conditions:
            printer.line(
                "\n== Pass 2: the same with binding conditions (attached before the pod is bound), "
                "and one GPU shared by two pods through partitions"
            )
            stack.start_controller(binding_conditions=True)
            ok = await _while_running(processes, _run_pass(scenario, printer, manifests, bc=True), printer)
        return ok
    except (DemoFailure, RoleStartError) as err:
        printer.line(f"\nFAILED: {err}")
        return False
    finally:
        if scenario is not None:
            await scenario.aclose()
        stack.stop()


def _missing(options: DemoOptions) -> str | None:
    """What the demo needs and does not have, in one line."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        # the stand-in API server validates every object against the official schemas it ships
        return "the demo needs kubernetes-validate: pip install 'fabric-dra[testbed]'"
    needed = [_manifest_file(options, which) for which in ("classes", *_SHARING)]
    if options.manifest in ("v1", "v1beta1"):
        needed.append(_manifest_file(options, options.manifest))
    for path in needed:
        if not path.is_file():
            if options.deploy_dir is not None:
                return f"{path} not found; run from a source checkout or pass --deploy-dir"
            return f"{path} not found: this installation of fabric-dra lacks its manifests; reinstall it"
    return None


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    printer = _Printer(out)
    missing = _missing(options)
    if missing is not None:
        printer.line(f"fabric-dra demo: {missing}")
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
        "fabric-dra demo: the composable-DRA article's attach -> verify -> detach scenario, then devices "
        "shared (a GPU's partitions, CXL memory by the GiB), on one machine"
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
