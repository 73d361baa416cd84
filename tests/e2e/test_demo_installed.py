"""fabric-dra as a user installs it, from its wheels into a virtualenv of their own
(tests/support/install.py), outside the source tree.

The product's wheel alone (a plain ``pip install fabric-dra``, what the image holds) runs every
role's command line and carries no testbed: ``fabric-dra demo`` then says in one line how to get
it. With the testbed's wheel beside it (``pip install 'fabric-dra[testbed]'``) ``fabric-dra demo``
runs the article's scenario — no deploy/ beside the code, the manifests the testbed ships, the
ports its processes would once have defaulted to (8080, 8081) taken by something else, printing
how long each step took."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest import TempPathFactory

from tests.support.deploy import PACKAGES, REPO_ROOT, TESTBED_DIR, TESTBED_PACKAGES
from tests.support.install import Installed, build_wheel, copy_project, install

pytestmark = pytest.mark.slow(seconds=40)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: TempPathFactory) -> dict[str, Path]:
    into = tmp_path_factory.mktemp("wheels")
    sources = tmp_path_factory.mktemp("sources")
    return {
        "product": build_wheel(copy_project(REPO_ROOT, PACKAGES, sources / "product"), into),
        "testbed": build_wheel(copy_project(TESTBED_DIR, TESTBED_PACKAGES, sources / "testbed"), into),
    }


@pytest.fixture(scope="module")
def dependencies(tmp_path_factory: TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dependencies") / "site"


@pytest.fixture(scope="module")
def product(wheels: dict[str, Path], dependencies: Path, tmp_path_factory: TempPathFactory) -> Installed:
    """``pip install fabric-dra``: the product alone."""
    return install(tmp_path_factory.mktemp("product") / "venv", [wheels["product"]], dependencies)


@pytest.fixture(scope="module")
def testbed(wheels: dict[str, Path], dependencies: Path, tmp_path_factory: TempPathFactory) -> Installed:
    """``pip install 'fabric-dra[testbed]'``: the product and its testbed."""
    return install(
        tmp_path_factory.mktemp("testbed") / "venv", [wheels["product"], wheels["testbed"]], dependencies
    )


def test_the_product_alone_runs_every_role_and_has_no_testbed(product: Installed, tmp_path: Path) -> None:
    site = product.site_packages
    assert all((site / package).is_dir() for package in PACKAGES)
    assert not any((site / package).exists() for package in TESTBED_PACKAGES)
    for command in (["--help"], ["manager", "serve", "--help"], ["emulator", "serve", "--help"]):
        done = product.run(*command, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("usage: fabric-dra"), done.stdout
        assert "Traceback" not in done.stderr
    listed = " ".join(product.run("--help", cwd=tmp_path).stdout.split())
    assert "demo not installed: it comes with the testbed (pip install 'fabric-dra[testbed]')" in listed


@pytest.mark.parametrize("command", [["demo"], ["demo", "--workdir", "x"], ["standin", "apiserver"]])
def test_a_testbed_command_without_the_testbed_is_one_line(
    product: Installed, tmp_path: Path, command: list[str]
) -> None:
    done = product.run(*command, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"fabric-dra {command[0]}: the {command[0]} command comes with the testbed: "
        "pip install 'fabric-dra[testbed]'"
    ]


@pytest.fixture
def busy_ports() -> Iterator[list[int]]:
    """Listen on 127.0.0.1:8080 and :8081 (or leave them to whoever holds them already)."""
    held: list[socket.socket] = []
    for port in (8080, 8081):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        except OSError:  # taken already: busy either way
            sock.close()
    yield [8080, 8081]
    for sock in held:
        sock.close()


def test_the_installed_demo_runs_outside_the_tree_with_the_usual_ports_taken(
    testbed: Installed, tmp_path: Path, busy_ports: list[int]
) -> None:
    where = testbed.python_run(
        "import fabric_dra_testbed.demo.run as r; print(r.__file__, r.packaged_manifests())", cwd=tmp_path
    )
    module, manifests = where.stdout.split()
    site = str(testbed.site_packages)
    assert module.startswith(site) and manifests.startswith(site), where.stdout
    assert not any(p.is_symlink() for p in Path(manifests).iterdir())
    for port in busy_ports:
        with pytest.raises(OSError):
            socket.create_server(("127.0.0.1", port)).close()

    workdir = tmp_path / "work"
    done = testbed.run(
        "demo", "--no-binding-conditions", "--workdir", str(workdir), cwd=tmp_path, timeout=240
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    # the article's four steps, then the memory pool's two (the shipped sharing manifests)
    for number in range(1, 7):
        assert f"Step {number}/6" in done.stdout
    # each step says how long it took
    assert done.stdout.count(" -> ok in ") == 6, done.stdout
    assert "All steps verified" in done.stdout


def test_a_missing_dependency_is_named(testbed: Installed, tmp_path: Path) -> None:
    """Without kubernetes-validate (a dependency of the testbed) the demo says what to install, in
    one line."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # None in sys.modules: an import of it fails, and importlib.util.find_spec finds nothing
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['kubernetes_validate'] = None\n")
    done = testbed.run("demo", cwd=tmp_path, timeout=60, PYTHONPATH=str(blocker))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip().splitlines() == [
        "fabric-dra demo: the demo needs kubernetes-validate: pip install 'fabric-dra[testbed]'"
    ]
