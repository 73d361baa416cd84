"""Render fabric-dra's kustomize overlays and look inside them (tests/unit/deploy).

Rendering goes through the real ``kubectl kustomize`` (or a standalone ``kustomize``), the same
tool ``kubectl apply -k`` uses, so what the tests check is what a cluster receives.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = [
    "ARTICLE_MANIFESTS",
    "COMPONENTS_DIR",
    "COMPOSITIONS",
    "DEPLOY_DIR",
    "DRIVER_NAME",
    "FABRIC_DRA_IMAGES",
    "KUBERNETES_VERSIONS",
    "OVERLAYS_DIR",
    "PACKAGED_MANIFESTS",
    "PACKAGES",
    "PACKAGE_DIRS",
    "REPO_ROOT",
    "SHARING_MANIFESTS",
    "TESTBED_DIR",
    "TESTBED_PACKAGES",
    "Container",
    "component_names",
    "containers",
    "expand",
    "find",
    "kustomize_command",
    "load_yaml_documents",
    "make_image_refs",
    "overlay_names",
    "overlay_params",
    "pod_templates",
    "render",
    "render_composition",
    "render_target",
    "run_make",
    "target_names",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"


def _top_level_packages(project: Path) -> tuple[str, ...]:
    """The top-level packages a project's pyproject.toml lists for setuptools, in its order."""
    setuptools = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setuptools["packages"]["find"]["include"]
    return tuple(dict.fromkeys(pattern.split(".")[0].rstrip("*") for pattern in include))


#: The product's top-level packages, as pyproject.toml lists them for setuptools.
PACKAGES: tuple[str, ...] = _top_level_packages(REPO_ROOT)
#: The testbed: a distribution of its own, built from this directory (docs/architecture.md).
TESTBED_DIR = REPO_ROOT / "testbed"
#: The testbed's top-level packages, as testbed/pyproject.toml lists them.
TESTBED_PACKAGES: tuple[str, ...] = _top_level_packages(TESTBED_DIR)
#: Every top-level package of the repository → its directory: the product's, then the testbed's.
PACKAGE_DIRS: dict[str, Path] = {
    **{package: REPO_ROOT / package for package in PACKAGES},
    **{package: TESTBED_DIR / package for package in TESTBED_PACKAGES},
}
OVERLAYS_DIR = DEPLOY_DIR / "overlays"
COMPONENTS_DIR = DEPLOY_DIR / "components"
#: What a platform engineer composes from the shipped pieces (docs/deploy.md, "Production
#: checklist"): an overlay plus opt-in components, rendered like an overlay of their own, so every
#: check of the rendered overlays holds for them too. name → (overlay, components).
#: The deploy/ files the testbed ships (testbed/fabric_dra_testbed/demo/manifests links to them),
#: repository-relative.
PACKAGED_MANIFESTS = sorted(
    str((p.parent / os.readlink(p)).resolve().relative_to(REPO_ROOT))
    for p in (TESTBED_DIR / "fabric_dra_testbed" / "demo" / "manifests").iterdir()
)
COMPOSITIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    # a second Redfish service with its own manager beside the emulator's (docs/deploy.md)
    "production-two-fabrics": ("production", ("second-fabric",)),
    "production-complete": (
        "production",
        (
            "binding-conditions",
            "plugin-scheduling",
            "critical-priority-quota",
            "selinux",
            "monitoring",
            "warm-affinity",
        ),
    ),
}
#: The Kubernetes minor versions fabric-dra supports (resource.k8s.io/v1 is served from 1.34).
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
DRIVER_NAME = "fabric-dra.io"
#: Image repositories of fabric-dra's own image, as the base and the overlays name it.
FABRIC_DRA_IMAGES = frozenset({"ghcr.io/fabric-dra/fabric-dra", "fabric-dra"})
#: The composable-DRA article's manifest, brought to each resource.k8s.io version e2e.sh applies.
ARTICLE_MANIFESTS = {
    "v1": DEPLOY_DIR / "kind" / "agent-infrastructure.yaml",
    "v1beta1": DEPLOY_DIR / "kind" / "agent-infrastructure.v1beta1.yaml",
}
#: What the demo applies beside the article's manifest: a GPU shared through partitions (Kubernetes
#: >= 1.36, with binding conditions) and a share of a CXL memory pool.
SHARING_MANIFESTS = {
    "gpu-partitions": DEPLOY_DIR / "kind" / "gpu-partitions.yaml",
    "cxl-memory": DEPLOY_DIR / "kind" / "cxl-memory.yaml",
}

Obj = dict[str, Any]


def kustomize_command() -> list[str] | None:
    """``kubectl kustomize`` when kubectl is installed, else a standalone ``kustomize build``."""
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize"]
    if kustomize := shutil.which("kustomize"):
        return [kustomize, "build"]
    return None


#: libyaml's loader where PyYAML was built with it (the wheels are): the same safe tags, parsed in
#: C. Rendered overlays are loaded at collection (the role-flag parameters) and by every deploy
#: test; the pure-Python loader took ~0.12 s of CPU per overlay (~35 kB), libyaml 0.015 s.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_documents(text: str) -> list[Obj]:
    return [doc for doc in yaml.load_all(text, Loader=_SAFE_LOADER) if doc]


@cache
def _render(path: str) -> str:
    command = kustomize_command()
    if command is None:
        raise RuntimeError("neither kubectl nor kustomize is installed")
    result = subprocess.run([*command, path], capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} {path} failed:\n{result.stderr.strip()}")
    return result.stdout


def render(path: Path) -> list[Obj]:
    """The objects a kustomization renders to (a fresh copy each call; rendering is cached)."""
    return load_yaml_documents(_render(str(path)))


@cache
def _render_composition(name: str) -> str:
    overlay, components = COMPOSITIONS[name]
    with tempfile.TemporaryDirectory(prefix="fabric-dra-kustomize-") as tmp:
        # kustomize takes only relative paths to other kustomizations.
        def rel(path: Path) -> str:
            return os.path.relpath(path, tmp)

        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [rel(OVERLAYS_DIR / overlay)],
            "components": [rel(COMPONENTS_DIR / c) for c in components],
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return _render.__wrapped__(tmp)


def render_composition(name: str) -> list[Obj]:
    """The objects of :data:`COMPOSITIONS` ``name``: its overlay with its components added."""
    return load_yaml_documents(_render_composition(name))


def render_target(name: str) -> list[Obj]:
    """An overlay's or a composition's objects, by the name :func:`target_names` lists."""
    return render_composition(name) if name in COMPOSITIONS else render(OVERLAYS_DIR / name)


def overlay_names() -> list[str]:
    return sorted(p.parent.name for p in OVERLAYS_DIR.glob("*/kustomization.yaml"))


def component_names() -> list[str]:
    return sorted(p.parent.name for p in COMPONENTS_DIR.glob("*/kustomization.yaml"))


def target_names() -> list[str]:
    """Every overlay and every composition."""
    return overlay_names() + sorted(COMPOSITIONS)


def overlay_params() -> list[Any]:
    """Overlay and composition names as pytest parameters. The ids are paths, never the bare word
    "kind": pytest counts parameter ids as keywords, and tests/conftest.py skips anything with the
    keyword "kind" where Docker is missing."""
    return [pytest.param(name, id=f"overlays/{name}") for name in overlay_names()] + [
        pytest.param(name, id=f"compositions/{name}") for name in sorted(COMPOSITIONS)
    ]


def run_make(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``make`` in the repository with ``args`` (targets, options such as ``-n``, variables)."""
    return subprocess.run(
        ["make", "-C", str(REPO_ROOT), "--no-print-directory", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def make_image_refs(*variables: str) -> list[str]:
    """The image references `make image` tags (its `print-image` target), with make variables
    such as ``REGISTRY=`` given."""
    return run_make("-s", "print-image", *variables).stdout.split()


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o
        for o in objects
        if o.get("kind") == kind and (name is None or o.get("metadata", {}).get("name") == name)
    ]


def pod_templates(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, pod spec) for every object that runs pods."""
    for obj in objects:
        if obj.get("kind") in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            yield obj, obj["spec"]["template"]["spec"]
        elif obj.get("kind") == "Pod":
            yield obj, obj["spec"]


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` as the kubelet does for args and env values: ``$$`` escapes a dollar,
    a reference to an undefined variable stays as written."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(substitute, value)


def references(value: str) -> set[str]:
    return {m.group(1) for m in _REFERENCE.finditer(value) if m.group(1)}


@dataclass
class Container:
    """One container of a rendered workload, with its environment resolved the way the kubelet
    resolves it (downward-API and Secret values replaced by recognisable stand-ins)."""

    workload_kind: str
    workload_name: str
    namespace: str
    spec: Obj
    pod_spec: Obj
    env: dict[str, str] = field(default_factory=dict)
    #: variables that Kubernetes itself consumes by expanding $(NAME) in args or other env values
    expanded_by_kubernetes: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def id(self) -> str:
        return f"{self.workload_kind}/{self.workload_name}/{self.name}"

    @property
    def image_repository(self) -> str:
        image = str(self.spec["image"]).split("@", 1)[0]
        repository, _, tag = image.rpartition(":")
        return repository if repository and "/" not in tag else image

    @property
    def is_fabric_dra(self) -> bool:
        return self.image_repository in FABRIC_DRA_IMAGES

    @property
    def args(self) -> list[str]:
        """The command line after ``fabric-dra``, with $(VAR) references expanded."""
        return [expand(str(a), self.env) for a in self.spec.get("args", [])]

    def mount_paths(self) -> list[str]:
        return [str(m["mountPath"]) for m in self.spec.get("volumeMounts", [])]

    def port_names(self) -> set[str]:
        return {str(p["name"]) for p in self.spec.get("ports", []) if "name" in p}

    def port_numbers(self) -> set[int]:
        return {int(p["containerPort"]) for p in self.spec.get("ports", [])}


def _stand_in(var: Obj) -> str:
    source = var["valueFrom"]
    if "fieldRef" in source:
        return "downward-" + re.sub(r"[^a-z0-9]+", "-", source["fieldRef"]["fieldPath"].lower())
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return f"secret-{ref['name']}-{ref['key']}"
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        return f"configmap-{ref['name']}-{ref['key']}"
    if "resourceFieldRef" in source:
        return "1"
    raise ValueError(f"unknown env source {json.dumps(source)}")


def containers(objects: list[Obj]) -> Iterator[Container]:
    for workload, pod_spec in pod_templates(objects):
        meta = workload["metadata"]
        for spec in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
            env: dict[str, str] = {}
            expanded: set[str] = set()
            for var in spec.get("env", []):
                if "value" in var:
                    raw = str(var["value"])
                    expanded |= references(raw) & env.keys()
                    env[var["name"]] = expand(raw, env)
                elif "valueFrom" in var:
                    env[var["name"]] = _stand_in(var)
                else:
                    env[var["name"]] = ""
            for arg in spec.get("args", []):
                expanded |= references(str(arg)) & env.keys()
            yield Container(
                workload_kind=workload["kind"],
                workload_name=meta["name"],
                namespace=meta.get("namespace", ""),
                spec=spec,
                pod_spec=pod_spec,
                env=env,
                expanded_by_kubernetes=expanded,
            )
