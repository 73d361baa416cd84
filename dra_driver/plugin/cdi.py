"""Transient CDI spec files: how a container gets the devices of a prepared claim.

One file per claim and device type, ``<cdi-root>/k8s.<driver>-<type>_<claim-uid>.json``, kind
``k8s.<driver>/<type>`` (a CDI file has exactly one kind, so a claim mixing a GPU and an NVMe
drive gets two files; the name follows the CDI library's transient-spec convention
``<vendor>-<class>_<id>``). CDI device names are ``<claim-uid>-<device>``, never reused, so a
runtime's spec cache cannot serve a stale entry (k8s.io/dynamic-resource-allocation/kubeletplugin
recommends the claim UID for exactly that).

``cdiVersion`` is the lowest version that has every feature a spec uses, following the rules of
CDI spec 0.8.0 (container-device-interface ``specs-go/version.go``): so runtimes with an older
CDI library still accept the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.errors import InputError
from dra_driver.plugin.cdihook import DEFAULT_HOOK_PATH, HOOK_NAME, HOOK_TIMEOUT_SECONDS, set_mems_args
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import HostDevice
from dra_driver.plugin.hostmemory import MemoryMode, MemoryRecord
from dra_driver.plugin.partitioner import Partition
from plumbing.fsutil import atomic_write
from plumbing.names import (
    QUALIFIED_NAME_PART_PATTERN,
    is_c_identifier,
    is_dns1123_subdomain,
    is_qualified_name_part,
)

__all__ = [
    "CDI_VERSIONS",
    "CONTAINER_DEVICE_DIR",
    "DEFAULT_HOOK_PATH",
    "OCI_HOOKS",
    "CdiDevice",
    "CdiSpec",
    "CdiSpecError",
    "ContainerEdits",
    "DeviceNode",
    "Hook",
    "Mount",
    "SpecDevice",
    "build_specs",
    "cdi_device_id",
    "cdi_device_name",
    "env_prefix",
    "kind_for",
    "minimum_version",
    "read_spec_devices",
    "read_spec_entries",
    "remove_spec_files",
    "spec_file",
    "spec_files_of_claim",
    "validate_spec",
    "write_specs",
]

#: Released CDI spec versions a runtime may know, oldest first (0.3.0 is the earliest parsers accept).
CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0")
#: Where an emulated device's sysfs directory appears inside the container.
CONTAINER_DEVICE_DIR = "/run/fabric-dra/devices"
#: The hook names of an OCI runtime (runtime-spec config.md, "POSIX-platform Hooks"); CDI passes
#: a hook's name through to the runtime's spec (CDI SPEC.md, "Hooks").
OCI_HOOKS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")

# CDI's own name rule ([a-zA-Z0-9], then [a-zA-Z0-9_.-], alphanumeric at the end) is the character
# set of a Kubernetes qualified-name part; a class is also at most 63 long, a device name is not.
_NAME = re.compile(QUALIFIED_NAME_PART_PATTERN)


class CdiSpecError(InputError):
    """A spec that a CDI runtime would reject."""


class _Cdi(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DeviceNode(_Cdi):
    path: str
    host_path: str | None = Field(default=None, alias="hostPath")
    permissions: str | None = None


class Mount(_Cdi):
    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    options: list[str] = Field(default_factory=list)
    type: str | None = None


class Hook(_Cdi):
    hook_name: str = Field(alias="hookName")
    path: str
    args: list[str] = Field(default_factory=list)
    env: list[str] | None = None
    timeout: int | None = None


class ContainerEdits(_Cdi):
    env: list[str] = Field(default_factory=list)
    device_nodes: list[DeviceNode] = Field(default_factory=list, alias="deviceNodes")
    mounts: list[Mount] = Field(default_factory=list)
    #: left out when there are none: a spec without hooks is written as before CDI hooks were used
    hooks: list[Hook] | None = None


class CdiDevice(_Cdi):
    name: str
    annotations: dict[str, str] = Field(default_factory=dict)
    container_edits: ContainerEdits = Field(default_factory=ContainerEdits, alias="containerEdits")


class CdiSpec(_Cdi):
    cdi_version: str = Field(alias="cdiVersion")
    kind: str
    annotations: dict[str, str] = Field(default_factory=dict)
    devices: list[CdiDevice]
    container_edits: ContainerEdits | None = Field(default=None, alias="containerEdits")

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, exclude_defaults=False, indent=2)


class SpecDevice(DeviceFacts):
    """One prepared device as the CDI layer needs it: its facts, and the claim's part."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim_uid: str
    request_names: tuple[str, ...] = ()
    host: HostDevice | None = None
    partition: Partition | None = None
    memory: MemoryRecord | None = None
    extra_env: dict[str, str] = Field(default_factory=dict)


def kind_for(driver: str, device_type: str) -> str:
    return f"k8s.{driver}/{device_type}"


def cdi_device_name(claim_uid: str, key: str) -> str:
    """``<claim-uid>-<device>``, or ``<claim-uid>-<device>-<share-id>`` for a share (its ``key``)."""
    return f"{claim_uid}-{key}"


def cdi_device_id(driver: str, device_type: str, claim_uid: str, key: str) -> str:
    return f"{kind_for(driver, device_type)}={cdi_device_name(claim_uid, key)}"


def spec_file(cdi_root: Path, driver: str, device_type: str, claim_uid: str) -> Path:
    return cdi_root / f"k8s.{driver}-{device_type}_{claim_uid}.json"


def spec_files_of_claim(cdi_root: Path, driver: str, claim_uid: str) -> list[Path]:
    prefix, suffix = f"k8s.{driver}-", f"_{claim_uid}.json"
    try:
        names = os.listdir(cdi_root)
    except FileNotFoundError:
        return []
    return sorted(cdi_root / n for n in names if n.startswith(prefix) and n.endswith(suffix))


def env_prefix(device: str) -> str:
    """``FABRIC_DRA_<DEVICE>_``: device names are DNS labels, so this is a valid variable name."""
    return "FABRIC_DRA_" + device.upper().replace("-", "_").replace(".", "_") + "_"


# -- versions and validation ------------------------------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _all_edits(spec: CdiSpec) -> list[ContainerEdits]:
    edits = [d.container_edits for d in spec.devices]
    if spec.container_edits is not None:
        edits.append(spec.container_edits)
    return edits


def minimum_version(spec: CdiSpec) -> str:
    """The lowest CDI version with every feature ``spec`` uses (CDI 0.8.0 ``specs-go/version.go``)."""
    required = "0.3.0"

    def need(version: str) -> None:
        nonlocal required
        if _version_key(version) > _version_key(required):
            required = version

    edits = _all_edits(spec)
    # 0.4.0 added Mount.type.
    if any(m.type for e in edits for m in e.mounts):
        need("0.4.0")
    # 0.5.0 added DeviceNode.hostPath and allowed device names to start with a digit.
    if any(n.host_path for e in edits for n in e.device_nodes):
        need("0.5.0")
    if any(d.name and not d.name[0].isalpha() for d in spec.devices):
        need("0.5.0")
    # 0.6.0 added annotations and allowed dots in the kind's name segment.
    if spec.annotations or any(d.annotations for d in spec.devices):
        need("0.6.0")
    if "." in spec.kind.partition("/")[2]:
        need("0.6.0")
    return required


def validate_spec(spec: CdiSpec) -> None:
    """Raise :class:`CdiSpecError` for anything a CDI runtime would refuse (CDI spec 0.8.0)."""
    if spec.cdi_version not in CDI_VERSIONS:
        raise CdiSpecError(f"cdiVersion {spec.cdi_version!r} is not a released CDI version")
    required = minimum_version(spec)
    if _version_key(spec.cdi_version) < _version_key(required):
        raise CdiSpecError(f"cdiVersion {spec.cdi_version} is too old for the features used ({required})")
    vendor, slash, cls = spec.kind.partition("/")
    if not slash or "/" in cls:
        raise CdiSpecError(f"kind {spec.kind!r} must be <vendor>/<class>")
    if not is_dns1123_subdomain(vendor):
        raise CdiSpecError(f"kind vendor {vendor!r} is not a DNS subdomain")
    if not is_qualified_name_part(cls):
        raise CdiSpecError(f"kind class {cls!r} is not a valid CDI name")
    if not spec.devices:
        raise CdiSpecError("a CDI spec must define at least one device")
    names: set[str] = set()
    for device in spec.devices:
        if not _NAME.match(device.name):
            raise CdiSpecError(f"device name {device.name!r} is not a valid CDI name")
        if device.name in names:
            raise CdiSpecError(f"device name {device.name!r} is defined twice")
        names.add(device.name)
    for edits in _all_edits(spec):
        for entry in edits.env:
            key, eq, _ = entry.partition("=")
            if not eq or not is_c_identifier(key):
                raise CdiSpecError(f"env entry {entry!r} is not NAME=VALUE")
        for node in edits.device_nodes:
            if not node.path.startswith("/") or (node.host_path and not node.host_path.startswith("/")):
                raise CdiSpecError(f"device node {node.path!r} must be an absolute path")
            if node.permissions and not set(node.permissions) <= set("rwm"):
                raise CdiSpecError(f"device node permissions {node.permissions!r} must be of r, w, m")
        for mount in edits.mounts:
            if not mount.host_path.startswith("/") or not mount.container_path.startswith("/"):
                raise CdiSpecError(
                    f"mount {mount.host_path!r} -> {mount.container_path!r}: paths not absolute"
                )
        for hook in edits.hooks or ():
            if hook.hook_name not in OCI_HOOKS:
                raise CdiSpecError(f"hook name {hook.hook_name!r} is none of {', '.join(OCI_HOOKS)}")
            if not hook.path.startswith("/"):
                raise CdiSpecError(f"hook path {hook.path!r} must be an absolute path")
            if hook.timeout is not None and not 0 < hook.timeout < 1 << 32:
                raise CdiSpecError(f"hook timeout {hook.timeout} must be a positive number of seconds")


# -- building, writing, reading ---------------------------------------------------------------


def _device_edits(item: SpecDevice, *, real_host: bool, hook_path: str) -> ContainerEdits:
    p = env_prefix(item.key)
    facts, optional = item.cdi_env(p)
    env = {**facts, f"{p}CLAIM_UID": item.claim_uid, f"{p}REQUEST": ",".join(item.request_names)}
    host = item.host
    mounts: list[Mount] = []
    nodes: list[str] = []
    hooks: list[Hook] = []
    if host is not None:
        optional |= {
            f"{p}PCI_ADDRESS": host.pci_address,
            f"{p}CXL_MEMDEV": host.memdev,
            f"{p}CXL_REGION": host.region,
            f"{p}DAX": host.dax,
            f"{p}NUMA_NODE": str(host.numa_node) if host.numa_node is not None else None,
            f"{p}DEVICE_NODES": ",".join(host.device_nodes) or None,
            # a NIC's interface is no /dev node: the runtime (or a CNI plugin) moves it by name
            f"{p}NET_INTERFACES": ",".join(host.net_interfaces) or None,
        }
        nodes = list(host.device_nodes)
        exposed = host.sysfs_path
        if item.partition is not None:
            # the container gets the partition, never its whole GPU
            part = item.partition
            nodes = list(part.device_nodes)
            exposed = part.path or exposed
            optional |= {
                f"{p}PARTITION_UUID": part.uuid,
                f"{p}PARTITION_PROFILE": part.profile,
                f"{p}PARTITION_START": str(part.start),
                f"{p}DEVICE_NODES": ",".join(part.device_nodes) or None,
            }
            env |= part.env
        if item.memory is not None:
            memory = item.memory
            optional |= {
                f"{p}MEMORY_MODE": memory.mode.value,
                f"{p}MEMORY_BYTES": str(item.memory_bytes) if item.memory_bytes else None,
            }
            if memory.mode is MemoryMode.KMEM:
                # system RAM of its own NUMA node: no device node; the hook binds the container to it
                nodes = []
                optional |= {f"{p}NUMA_NODE": str(memory.node), f"{p}DEVICE_NODES": None}
                if memory.node is not None:
                    hooks.append(
                        Hook(
                            hook_name=HOOK_NAME,
                            path=hook_path,
                            args=set_mems_args(memory.node),
                            timeout=HOOK_TIMEOUT_SECONDS,
                        )
                    )
        if not real_host:
            # an emulated host has no /dev: the nodes are named, its sysfs directory is shown
            nodes = []
            container_dir = f"{CONTAINER_DEVICE_DIR}/{item.key}"
            mounts.append(
                Mount(
                    host_path=os.path.realpath(exposed),
                    container_path=container_dir,
                    options=["ro", "nosuid", "nodev", "noexec", "bind"],
                )
            )
            optional[f"{p}SYSFS"] = container_dir
    env |= {k: v for k, v in optional.items() if v}
    env |= item.extra_env
    return ContainerEdits(
        env=[f"{k}={v}" for k, v in env.items()],
        device_nodes=[DeviceNode(path=path, permissions="rw") for path in nodes],
        mounts=mounts,
        hooks=hooks or None,
    )


def build_specs(
    driver: str, devices: Sequence[SpecDevice], *, real_host: bool, hook_path: str = DEFAULT_HOOK_PATH
) -> dict[str, CdiSpec]:
    """One spec per device type, keyed by type, each validated."""
    by_type: dict[str, list[CdiDevice]] = {}
    for item in devices:
        by_type.setdefault(item.type, []).append(
            CdiDevice(
                name=cdi_device_name(item.claim_uid, item.key),
                container_edits=_device_edits(item, real_host=real_host, hook_path=hook_path),
            )
        )
    specs: dict[str, CdiSpec] = {}
    for device_type, cdi_devices in by_type.items():
        spec = CdiSpec(cdi_version="0.3.0", kind=kind_for(driver, device_type), devices=cdi_devices)
        spec.cdi_version = minimum_version(spec)
        validate_spec(spec)
        specs[device_type] = spec
    return specs


def write_specs(cdi_root: Path, driver: str, claim_uid: str, specs: dict[str, CdiSpec]) -> list[Path]:
    """Write each spec atomically; a reader never sees half a file.

    Not fsynced: the CDI root is a tmpfs on real nodes, and on start the plugin rewrites any
    spec its checkpoint says should exist.
    """
    paths = []
    for device_type, spec in sorted(specs.items()):
        path = spec_file(cdi_root, driver, device_type, claim_uid)
        atomic_write(path, spec.to_json(), mode=0o644, durable=False)
        paths.append(path)
    # A type the claim no longer has (a re-prepare after a change) must not leave a file behind.
    for stale in set(spec_files_of_claim(cdi_root, driver, claim_uid)) - set(paths):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    return paths


def remove_spec_files(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _is_device_variable(name: str, env: dict[str, str]) -> bool:
    """``FABRIC_DRA_<KEY>_DEVICE`` whose prefix is the one its device (and share) make."""
    if not name.endswith("_DEVICE") or not name.startswith("FABRIC_DRA_"):
        return False
    prefix = name.removesuffix("DEVICE")
    share = env.get(f"{prefix}SHARE_ID")
    return prefix == env_prefix(env[name] if share is None else f"{env[name]}-{share}")


def read_spec_devices(path: Path) -> list[SpecDevice]:
    """The devices one of our spec files describes (for rebuilding a lost checkpoint).

    Raises :class:`CdiSpecError` when the file is not a spec this plugin wrote.
    """
    return [device for device, _prefix, _env in read_spec_entries(path)]


def read_spec_entries(path: Path) -> list[tuple[SpecDevice, str, dict[str, str]]]:
    """Each device of one of our spec files with its variables' prefix and every variable it
    gives (a partition's placement, a share's mode: what the facts do not carry)."""
    try:
        spec = CdiSpec.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, json.JSONDecodeError) as err:
        raise CdiSpecError(f"{path}: not a readable CDI spec: {err}") from err
    device_type = spec.kind.partition("/")[2]
    found: list[tuple[SpecDevice, str, dict[str, str]]] = []
    for cdi_device in spec.devices:
        env = dict(e.partition("=")[::2] for e in cdi_device.container_edits.env)
        p = next((k.removesuffix("DEVICE") for k in env if _is_device_variable(k, env)), None)
        if p is None:
            raise CdiSpecError(f"{path}: device {cdi_device.name} has no FABRIC_DRA_*_DEVICE variable")
        requests = tuple(r for r in env.get(f"{p}REQUEST", "").split(",") if r)
        device = SpecDevice(
            claim_uid=env.get(f"{p}CLAIM_UID", ""),
            request_names=requests,
            **DeviceFacts.from_cdi_env(env, p, type_of_kind=device_type),
        )
        found.append((device, p, env))
    return found
