"""DRA's CEL environment: the device variable, Kubernetes libraries, errors."""

from __future__ import annotations

import pytest

from dra_driver.selection.celenv import CelCompileError, DeviceInput, SelectorCache
from dra_driver.selection.quantity import parse_quantity
from dra_driver.selection.semver import parse_semver

DEVICE = DeviceInput(
    driver="fabric-dra.io",
    attributes={
        "type": "gpu",
        "fabric-dra.io/switch": "sw1",
        "pcieGen": 5,
        "healthy": True,
        "firmware": parse_semver("2.1.0"),
        "other.example.com/zone": "z1",
    },
    capacity={"memory": parse_quantity("80Gi")},
)

CACHE = SelectorCache()


def evaluate(expression: str) -> tuple[bool | None, str | None]:
    outcome = CACHE.get(expression).evaluate(DEVICE.activation())
    return outcome.matched, outcome.error


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "fabric-dra.io"', True),
        ('device.attributes["fabric-dra.io"].type == "gpu"', True),
        # unqualified and qualified attribute names land in the same domain
        ('device.attributes["fabric-dra.io"].switch == "sw1"', True),
        ('device.attributes["other.example.com"].zone == "z1"', True),
        (
            'device.attributes["fabric-dra.io"].pcieGen >= 4 && device.attributes["fabric-dra.io"].healthy',
            True,
        ),
        # an unknown domain is an empty map, not an error
        ('"model" in device.attributes["nope.example.com"]', False),
        ('device.capacity["fabric-dra.io"].memory.compareTo(quantity("40Gi")) > 0', True),
        ('device.capacity["fabric-dra.io"].memory.isGreaterThan(quantity("100Gi"))', False),
        ('device.capacity["fabric-dra.io"].memory.isLessThan(quantity("100Gi"))', True),
        ('device.capacity["fabric-dra.io"].memory == quantity("81920Mi")', True),
        ('device.capacity["fabric-dra.io"].memory.asInteger() == 85899345920', True),
        ('device.capacity["fabric-dra.io"].memory.sub(quantity("16Gi")) == quantity("64Gi")', True),
        ('quantity("1.5").isInteger()', False),
        ('isQuantity("12Gi") && !isQuantity("12GB")', True),
        ('device.attributes["fabric-dra.io"].firmware.isGreaterThan(semver("2.0.9"))', True),
        ('device.attributes["fabric-dra.io"].firmware.major() == 2', True),
        ('semver("v2.1", true) == device.attributes["fabric-dra.io"].firmware', True),
        ('cel.bind(fd, device.attributes["fabric-dra.io"], fd.type == "gpu" && fd.switch == "sw1")', True),
        ('device.attributes["fabric-dra.io"].type.upperAscii() == "GPU"', True),
        ('device.attributes["fabric-dra.io"].switch.matches("^sw[0-9]+$")', True),
        ('"a,b,c".split(",").size() == 3', True),
        ('device.attributes["fabric-dra.io"].exists(k, k == "switch")', True),
        ("device.allowMultipleAllocations", False),
        # an error on one side of || is absorbed when the other side is true (CEL semantics)
        ('device.attributes["fabric-dra.io"].model == "x" || true', True),
    ],
)
def test_selector_values(expression: str, expected: bool) -> None:
    assert evaluate(expression) == (expected, None)


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ('device.attributes["fabric-dra.io"].model == "H100"', "no such key: model"),
        ('device.capacity["fabric-dra.io"].cores.isGreaterThan(quantity("1"))', "no such key: cores"),
        ('quantity("12GB") == quantity("1")', "'12GB' is not a quantity"),
        ('device.attributes["fabric-dra.io"].type == 1', "no such overload"),
        ("device.attributes", "must evaluate to bool, not map"),
        ("nosuchfunction(1)", "undeclared reference to 'nosuchfunction'"),
    ],
)
def test_selector_runtime_errors(expression: str, error: str) -> None:
    matched, message = evaluate(expression)
    assert matched is None
    assert message is not None and error in message


def test_syntax_errors_are_compile_errors_and_cached() -> None:
    cache = SelectorCache()
    with pytest.raises(CelCompileError):
        cache.get('device.driver == "x" &&')
    with pytest.raises(CelCompileError):
        cache.get('device.driver == "x" &&')
    assert cache.get('device.driver == "x"') is cache.get('device.driver == "x"')
