"""Shared pytest configuration: markers for what this machine may lack, and common paths."""

from __future__ import annotations

import atexit
import compileall
import contextlib
import os
import shutil
import ssl
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import httpx._transports.default as httpx_transports
import pytest

from fabric_dra_testbed.stack import ROLE_MODULES, default_trust
from plumbing.forkserver import ForkServer
from plumbing.procs import use_fork_server
from tests.support.hangs import tasks_written_before_timeout

REPO_ROOT = Path(__file__).resolve().parent.parent


def _share_default_trust() -> None:
    """Every httpx client the tests open with the default ``verify=True`` gets one shared context
    (:func:`fabric_dra_testbed.stack.default_trust`, the same certifi bundle) instead of building its own.
    Building it costs ~50 ms of CPU, and a module-level ``httpx.get`` is a new client: the tests'
    polls (``wait_until(lambda: httpx.get(...))`` every 30 ms, the reliability stack's binding
    monitor every 50 ms) spent most of a core on it. Only this process's clients, only the
    default case (the CA file or directory that ``SSL_CERT_FILE``/``SSL_CERT_DIR`` name included,
    as httpx reads them): an explicit context, ``verify=False`` or a client certificate still go
    through httpx unchanged. The role processes are not touched."""
    build = getattr(httpx_transports, "create_ssl_context", None)
    if build is None:  # another httpx: its clients build their own, as before
        return

    def create_ssl_context(
        verify: ssl.SSLContext | str | bool = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is True and cert is None:
            return default_trust(trust_env)
        context: ssl.SSLContext = build(verify=verify, cert=cert, trust_env=trust_env)
        return context

    setattr(httpx_transports, "create_ssl_context", create_ssl_context)  # noqa: B010 - private name


_share_default_trust()


def _start_roles_by_fork() -> None:
    """The roles this process starts are forks of one server that imported them once
    (:mod:`plumbing.forkserver`): a role's start is mostly its imports, and the suite starts ~500.
    ``FABRIC_DRA_FORK_SERVER=0`` starts each as a new interpreter instead. The server starts with
    the first role and stops when this process exits."""
    if os.environ.get("FABRIC_DRA_FORK_SERVER", "1") == "0":
        return
    server = ForkServer(ROLE_MODULES)
    use_fork_server(server)
    atexit.register(server.close)


_start_roles_by_fork()


def _cache_kubernetes_schemas() -> None:
    """``kubernetes_validate.validate`` reads and parses its JSON schemas on every call: the
    object's kind and the version's 1.5 MB ``_definitions.json`` (~25 ms of CPU per object). The
    deploy and controller tests validate hundreds of objects against four versions; keep each
    parsed file for the session instead. The schemas are only read (jsonschema and referencing
    do not modify them); a missing file still raises as before (exceptions are not cached)."""
    try:
        import kubernetes_validate.utils as utils
    except ImportError:  # not installed: the tests that need it fail on their own import
        return
    read = getattr(utils, "schema_contents", None)
    if read is None or hasattr(read, "cache_info"):  # another kubernetes_validate, or done
        return
    setattr(utils, "schema_contents", cache(read))  # noqa: B010 - the library's own module


_cache_kubernetes_schemas()


def redfish_reference_dir() -> Path:
    """DMTF's CSDL schemas, registries and mockups; never copied into this repository."""
    return Path(os.environ.get("FABRIC_DRA_REDFISH_DIR", REPO_ROOT.parent / "shared" / "redfish"))


@cache
def docker_engine_reason() -> str | None:
    """Why kind cannot run here, or None when it can."""
    if shutil.which("kind") is None:
        return "the kind binary is not installed"
    return docker_reason()


@cache
def docker_reason() -> str | None:
    """Why no container image can be built or run here, or None when it can."""
    if shutil.which("docker") is None:
        return "the docker client is not installed"
    try:
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"docker info failed: {err}"
    if probe.returncode != 0:
        return "no Docker engine is reachable (docker info failed)"
    return None


def _slow_modules_first(items: list[pytest.Item], workers: int = 1) -> None:
    """Reorder ``items`` in place so that the modules holding a test marked ``slow`` start first
    (``slow(seconds=N)``, N its rough cost in a ``-n auto`` run), each module kept whole (its
    module-scoped stack starts once per worker), the order otherwise kept.

    Why: ``--dist worksteal`` hands the workers contiguous shares of this order, the first
    ``len // workers`` items to one, and so on (xdist ``WorkStealingScheduling.check_schedule``),
    and lets an idle worker take the tail of another's queue. A long test left near the end runs
    alone while the other workers wait. With every slow module at the front of the one order they
    all landed in the first worker's share and ran one after another (a 4-worker run: the cores
    busy until 300 s, then a 70 s tail of three long waits). So with ``workers`` > 1 the slow
    modules are dealt to the shares, costliest first, each to the share with the least slow cost so
    far, and each share starts with its slow modules. Every worker collects the same order, as
    xdist requires."""
    cost: dict[Path, float] = {}
    for item in items:
        if (marker := item.get_closest_marker("slow")) is not None:
            cost[item.path] = max(cost.get(item.path, 0.0), float(marker.kwargs.get("seconds", 0.0)))
    if workers <= 1 or not cost:
        items.sort(key=lambda item: (item.path not in cost, -cost.get(item.path, 0.0)))
        return
    by_module: dict[Path, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.path, []).append(item)
    rest = [item for item in items if item.path not in cost]
    # the share sizes xdist sends first: each idle worker len(pending) // workers_remaining
    sizes, left = [], len(items)
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for path in sorted(cost, key=lambda p: (-cost[p], str(p))):
        least = min(range(workers), key=lambda i: (loads[i], i))
        loads[least] += max(cost[path], 1.0)
        shares[least] += by_module[path]
    ordered: list[pytest.Item] = []
    boundary = 0
    for share, size in zip(shares, sizes, strict=True):
        boundary += size
        ordered += share
        fill = max(0, boundary - len(ordered))  # a share past its size pushes the next one back
        ordered += rest[:fill]
        del rest[:fill]
    items[:] = ordered + rest


def _compile_checkout() -> None:
    """Byte-compile the product's packages once, before the workers start. With
    ``PYTHONDONTWRITEBYTECODE`` set (as some shells do) an editable checkout keeps no byte-code of
    its own, so every interpreter compiled the product modules it imports again: each pytest
    process, each fork server, each command started as a new interpreter (0.05 s of CPU for a
    plugin's modules, 0.11 s for a manager's). The virtualenv's packages were compiled by pip.
    Up-to-date files are only stat'ed; a read-only checkout stays as it is."""
    if not sys.dont_write_bytecode:
        return  # each import writes what it compiled
    from tests.support.deploy import PACKAGE_DIRS

    for directory in PACKAGE_DIRS.values():
        with contextlib.suppress(OSError):
            compileall.compile_dir(str(directory), quiet=2)


def _rewrite_test_modules_once(config: pytest.Config) -> None:
    """Write pytest's assertion-rewritten byte-code of the test modules (and of the plugins the
    controller rewrote) once, before the workers start. With ``PYTHONDONTWRITEBYTECODE`` set
    pytest caches none of it, so every worker rewrote all ~200 test modules as it collected them:
    ~4.5 s of each worker's ~8.5 s collection. The workers read these files (pytest checks every
    cached file against its source's hash, so a stale one is rewritten as before). Two processes
    share the work. Uses pytest's own rewriting functions, which are not public: with a pytest
    that has none of them, or ``--assert=plain``, the workers rewrite as they always did."""
    if not sys.dont_write_bytecode:
        return  # each worker's imports write what they rewrote
    try:
        from _pytest.assertion import rewrite

        hook = config.stash[rewrite.assertstate_key].hook
        tail, read_pyc, rewrite_test, write_pyc = (
            rewrite.PYC_TAIL,
            rewrite._read_pyc,
            rewrite._rewrite_test,
            rewrite._write_pyc_fp,
        )
    except (ImportError, AttributeError, KeyError):
        return
    if hook is None:
        return

    def cached(source: Path) -> Path:
        return rewrite.get_cache_dir(source) / (source.name[:-3] + tail)

    tests = REPO_ROOT / "tests"
    sources = [*tests.rglob("test_*.py"), *tests.rglob("conftest.py")]
    sources += [Path(path) for path in getattr(hook, "_rewritten_names", {}).values()]
    todo = sorted({s for s in sources if read_pyc(s, cached(s)) is None})

    def write(part: list[Path]) -> None:
        for source in part:
            pyc = cached(source)
            try:
                source_hash, code = rewrite_test(source, config)
                pyc.parent.mkdir(exist_ok=True)
                partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
                with open(partial, "wb") as out:
                    write_pyc(out, source_hash, code)
                os.replace(partial, pyc)
            except (OSError, SyntaxError):
                continue  # a read-only tree or a broken module: the worker says what it finds

    if len(todo) < 8:
        write(todo)
        return
    child = os.fork()  # before any worker or thread exists
    if child == 0:
        try:
            write(todo[1::2])
        finally:
            os._exit(0)
    write(todo[::2])
    os.waitpid(child, 0)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per CPU this process may use. The tests mostly wait — on sockets,
    on timers they set on purpose, on roles doing their work — and since the roles start as forks
    (``_start_roles_by_fork``) a start no longer keeps a core busy for a second: with one worker
    per CPU the two cores of the CI machine were busy 59 % of the run. Whole suite, 2 CPUs, load
    ~2: 2 workers 518 s wall / 612 CPU-s, 4 workers 391 s / 658 CPU-s, 6 workers 386 s / 706
    CPU-s (each worker collects the suite: ~9 s of CPU)."""
    return 2 * len(os.sched_getaffinity(0))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, before it starts any worker
        _compile_checkout()
        if getattr(config.option, "numprocesses", None):
            _rewrite_test_modules_once(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller, for each worker: tell it how the controller distributes the
    tests (a worker's own ``dist`` option reads "no", xdist remote.py), for ``_slow_modules_first``."""
    node.workerinput["dist"] = node.config.getoption("dist")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    worker = getattr(config, "workerinput", {})
    _slow_modules_first(items, worker.get("workercount", 1) if worker.get("dist") == "worksteal" else 1)
    kind_reason = None
    for item in items:
        # Markers, not keywords: a parameter id that happens to read "kind" must not skip a test.
        if item.get_closest_marker("kind") is not None:
            kind_reason = kind_reason or docker_engine_reason()
            if kind_reason:
                item.add_marker(pytest.mark.skip(reason=f"needs Docker + kind: {kind_reason}"))
        if item.get_closest_marker("docker") is not None and (docker := docker_reason()):
            item.add_marker(pytest.mark.skip(reason=f"needs a Docker engine: {docker}"))
        if item.get_closest_marker("hardware") is not None and not os.environ.get("FABRIC_DRA_REDFISH_URL"):
            item.add_marker(
                pytest.mark.skip(reason="needs a real PCIe/CXL fabric: set FABRIC_DRA_REDFISH_URL")
            )


@pytest.fixture(scope="session")
def redfish_dir() -> Path:
    path = redfish_reference_dir()
    if not (path / "csdl").is_dir():
        pytest.skip(f"DMTF Redfish schemas not found at {path} (set FABRIC_DRA_REDFISH_DIR)")
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test still running shortly before its timeout writes what its event loops wait on."""
    with tasks_written_before_timeout(item):
        return (yield)
