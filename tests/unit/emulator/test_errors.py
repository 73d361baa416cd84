"""One exception tree: every error the emulator raises on purpose is an EmulatorError, and each of
the engine's FabricErrors answers with the Base MessageId and status Redfish clients rely on."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import emulator
import emulator.errors
from emulator.errors import (
    ChunkSizeRefused,
    DomainExhausted,
    EmulatorError,
    FabricError,
    GuestFailed,
    GuestTimedOut,
    InjectedFailure,
    Interrupted,
    PortIsDown,
    TargetBusy,
    TaskFinished,
    UnknownName,
)
from emulator.redfish.model.errors import RedfishError, redfish_error
from emulator.redfish.model.registries import all_message_defs

PACKAGE = Path(emulator.__file__).parent


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class name) of every class defined in the emulator that derives from an exception."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.bases:
                found.append((module, node.name))
    classes = []
    for module, name in found:
        if module == "emulator.qemu.agent":  # runs inside the guest, apart from the package
            continue
        cls = getattr(importlib.import_module(module), name, None)
        if inspect.isclass(cls) and issubclass(cls, BaseException):
            classes.append((module, name))
    return classes


def test_every_emulator_exception_derives_from_one_root() -> None:
    classes = _exception_classes()
    assert len(classes) >= 15, "the scan must see the emulator's exceptions"
    strays = [
        f"{module}.{name}"
        for module, name in classes
        if not issubclass(getattr(importlib.import_module(module), name), EmulatorError)
    ]
    assert strays == []


#: What each of the engine's errors answers over Redfish: (HTTP status, Base MessageId key).
ANSWERS: dict[type[FabricError], tuple[FabricError, int, str]] = {
    TargetBusy: (TargetBusy("gpu0 is bound to kind-worker."), 409, "ResourceInUse"),
    TaskFinished: (TaskFinished("Task 7 already ended."), 409, "ResourceInUse"),
    PortIsDown: (PortIsDown("The host port UP0 is down."), 409, "ConditionInRelatedResource"),
    UnknownName: (UnknownName("device", "gpu9", "Device"), 400, "PropertyValueNotInList"),
    InjectedFailure: (InjectedFailure("refused", "ResourceInUse", None), 409, "ResourceInUse"),
    GuestFailed: (GuestFailed("QMP failed"), 500, "OperationFailed"),
    GuestTimedOut: (GuestTimedOut("the guest kept the device"), 504, "OperationTimeout"),
    Interrupted: (Interrupted("a restart ended the task"), 503, "ServiceShuttingDown"),
    ChunkSizeRefused: (
        ChunkSizeRefused("512 MiB is too small", 512, misaligned=False),
        400,
        "PropertyValueOutOfRange",
    ),
    DomainExhausted: (
        DomainExhausted("1024 MiB free", "/redfish/v1/Chassis/p/MemoryDomains/0"),
        409,
        "ResourceExhaustion",
    ),
}


def test_every_fabric_error_has_its_redfish_answer() -> None:
    declared = {
        cls
        for cls in vars(emulator.errors).values()
        if inspect.isclass(cls) and issubclass(cls, FabricError) and cls is not FabricError
    }
    assert declared == set(ANSWERS), "a new FabricError needs its Redfish answer here and in redfish_error"
    base = {d.key for d in all_message_defs() if d.prefix == "Base"}
    for error, status, key in ANSWERS.values():
        answer = redfish_error(error)
        assert isinstance(answer, RedfishError)
        assert (answer.status, answer.message_id.rsplit(".", 1)[-1]) == (status, key), type(error).__name__
        assert key in base
        assert answer.summary == error.detail, "the fabric's own words reach the client"


@pytest.mark.parametrize(("status", "expected"), [(None, 409), (418, 418)])
def test_an_injected_failure_answers_with_its_faults_status(status: int | None, expected: int) -> None:
    assert redfish_error(InjectedFailure("refused", "ResourceInUse", status)).status == expected
    assert redfish_error(InjectedFailure("refused", "MalformedJSON", None)).status == 400


def test_memory_domain_refusals_carry_the_registry_arguments_in_its_order() -> None:
    """Base 1.22.1: PropertyValueOutOfRange is (value, property), PropertyValueIncorrect (property,
    value), ResourceExhaustion (the resource's URI); CreateLimitReachedForResource takes none."""
    domain = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0"
    cases = [
        (
            ChunkSizeRefused("small", 512, misaligned=False),
            400,
            "PropertyValueOutOfRange",
            ["512", "MemoryChunkSizeMiB"],
        ),
        (
            ChunkSizeRefused("off", 1500, misaligned=True),
            400,
            "PropertyValueIncorrect",
            ["MemoryChunkSizeMiB", "1500"],
        ),
        (DomainExhausted("full", domain), 409, "ResourceExhaustion", [domain]),
        (DomainExhausted("many", domain, limit=True), 409, "CreateLimitReachedForResource", []),
    ]
    for error, status, key, args in cases:
        answer = redfish_error(error)
        first = answer.messages[0]
        assert (answer.status, first["MessageId"], first["MessageArgs"]) == (status, f"Base.1.22.{key}", args)
