"""DRA's CEL environment for device selectors, on cel-python (``celpy``).

Kubernetes compiles every ``DeviceSelector.cel.expression`` in the environment of
``k8s.io/dynamic-resource-allocation/cel/compile.go``: one variable ``device`` with
``driver``, ``attributes`` (domain → id → value), ``capacity`` (domain → id → quantity) and,
from 1.34, ``allowMultipleAllocations``; the Kubernetes CEL libraries (quantity, semver,
strings, regex, lists) and ``cel.bind``. This module rebuilds that environment:

- attribute and capacity names without a domain get the driver's domain, and looking up an
  unknown domain yields an empty map (``newStringInterfaceMapWithDefault`` in compile.go), so
  ``"model" in device.attributes["other.io"]`` is false rather than an error;
- looking up a missing attribute id is a runtime error, as in Kubernetes; the allocator
  decides what a runtime error means (``structured/allocator.go`` aborts the allocation);
- ``version`` attributes are semver values, capacities are exact :class:`Quantity` values.

Expressions are parsed once and transpiled to Python by celpy's ``CompiledRunner``, which is
about five times faster than its interpreter; an expression the transpiler cannot handle
falls back to the interpreter. celpy does no static type checking, so a type error that
the API server would reject at admission shows up here as a runtime error instead.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import CELEvalError, TranspilerTree

from dra_driver.errors import InputError
from dra_driver.selection.quantity import Quantity, QuantityError, parse_quantity
from dra_driver.selection.semver import Semver, SemverError, parse_semver

__all__ = [
    "AttributeValue",
    "CelCompileError",
    "CelEvaluationError",
    "CompiledSelector",
    "DeviceInput",
    "SelectorCache",
    "SelectorOutcome",
]

#: A device attribute value as declared in a ResourceSlice (``int``/``bool``/``string``/``version``).
AttributeValue = int | bool | str | Semver

# celpy's transpiler logs every runtime error (a missing attribute, say) at ERROR level;
# for selectors those are ordinary outcomes that the allocator reports itself.
logging.getLogger("celpy").setLevel(logging.CRITICAL)

# The transpiled code calls our functions by their dotted module path, resolved in the
# globals of celpy.evaluation.
import celpy.evaluation as _celpy_evaluation  # noqa: E402

_celpy_evaluation.__dict__.setdefault("dra_driver", sys.modules["dra_driver"])

_LOCK = threading.RLock()  # celpy's compiled runner keeps its activation in module globals


class CelCompileError(InputError):
    """An expression that does not parse."""


class CelEvaluationError(InputError):
    """An expression that failed at run time (a missing key, no such overload)."""


def _err(message: str) -> CELEvalError:
    return CELEvalError(message, ValueError, None)


# -- the quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go) ----------------------


def k8s_quantity(text: Any) -> Any:
    try:
        return parse_quantity(str(text))
    except QuantityError as err:
        return _err(str(err))


def k8s_is_quantity(text: Any) -> Any:
    try:
        parse_quantity(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def k8s_sign(value: Any) -> Any:
    if isinstance(value, Quantity):
        return celtypes.IntType(value.sign())
    return _err(f"no such overload: sign({type(value).__name__})")


def k8s_is_integer(value: Any) -> Any:
    if isinstance(value, Quantity):
        return celtypes.BoolType(value.is_integer())
    return _err(f"no such overload: isInteger({type(value).__name__})")


def k8s_as_integer(value: Any) -> Any:
    if not isinstance(value, Quantity):
        return _err(f"no such overload: asInteger({type(value).__name__})")
    try:
        return celtypes.IntType(value.as_integer())
    except QuantityError as err:
        return _err(str(err))


def k8s_as_approximate_float(value: Any) -> Any:
    if isinstance(value, Quantity):
        return celtypes.DoubleType(value.as_float())
    return _err(f"no such overload: asApproximateFloat({type(value).__name__})")


def k8s_add(value: Any, other: Any) -> Any:
    if isinstance(value, Quantity) and isinstance(other, Quantity | int) and not isinstance(other, bool):
        return value.add(other if isinstance(other, Quantity) else int(other))
    return _err(f"no such overload: add({type(value).__name__}, {type(other).__name__})")


def k8s_sub(value: Any, other: Any) -> Any:
    if isinstance(value, Quantity) and isinstance(other, Quantity | int) and not isinstance(other, bool):
        return value.sub(other if isinstance(other, Quantity) else int(other))
    return _err(f"no such overload: sub({type(value).__name__}, {type(other).__name__})")


def _compare(value: Any, other: Any, name: str) -> int | CELEvalError:
    if isinstance(value, Quantity) and isinstance(other, Quantity):
        return value.compare(other)
    if isinstance(value, Semver) and isinstance(other, Semver):
        return value.compare(other)
    return _err(f"no such overload: {name}({type(value).__name__}, {type(other).__name__})")


def k8s_compare_to(value: Any, other: Any) -> Any:
    result = _compare(value, other, "compareTo")
    return result if isinstance(result, CELEvalError) else celtypes.IntType(result)


def k8s_is_greater_than(value: Any, other: Any) -> Any:
    result = _compare(value, other, "isGreaterThan")
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result > 0)


def k8s_is_less_than(value: Any, other: Any) -> Any:
    result = _compare(value, other, "isLessThan")
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result < 0)


# -- the semver library (k8s.io/apiserver/pkg/cel/library/semverlib.go) -----------------------


def k8s_semver(text: Any, normalize: Any = False) -> Any:
    try:
        return parse_semver(str(text), normalize=bool(normalize))
    except SemverError as err:
        return _err(str(err))


def k8s_is_semver(text: Any, normalize: Any = False) -> Any:
    try:
        parse_semver(str(text), normalize=bool(normalize))
    except SemverError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def k8s_major(value: Any) -> Any:
    return celtypes.IntType(value.major) if isinstance(value, Semver) else _err("no such overload: major")


def k8s_minor(value: Any) -> Any:
    return celtypes.IntType(value.minor) if isinstance(value, Semver) else _err("no such overload: minor")


def k8s_patch(value: Any) -> Any:
    return celtypes.IntType(value.patch) if isinstance(value, Semver) else _err("no such overload: patch")


# -- strings (cel-go ext.Strings), regex and lists (k8s.io/apiserver/pkg/cel/library) ---------


def _str_arg(value: Any, name: str) -> str | CELEvalError:
    return str(value) if isinstance(value, str) else _err(f"no such overload: {name}({type(value).__name__})")


def k8s_lower_ascii(value: Any) -> Any:
    text = _str_arg(value, "lowerAscii")
    if isinstance(text, CELEvalError):
        return text
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in text))


def k8s_upper_ascii(value: Any) -> Any:
    text = _str_arg(value, "upperAscii")
    if isinstance(text, CELEvalError):
        return text
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in text))


def k8s_trim(value: Any) -> Any:
    text = _str_arg(value, "trim")
    return text if isinstance(text, CELEvalError) else celtypes.StringType(text.strip())


def k8s_replace(value: Any, old: Any, new: Any, limit: Any = -1) -> Any:
    text = _str_arg(value, "replace")
    if isinstance(text, CELEvalError):
        return text
    return celtypes.StringType(text.replace(str(old), str(new), int(limit)))


def k8s_split(value: Any, separator: Any, limit: Any = -1) -> Any:
    text = _str_arg(value, "split")
    if isinstance(text, CELEvalError):
        return text
    limit = int(limit)
    if limit == 0:
        return celtypes.ListType([])
    parts = text.split(str(separator), limit - 1) if limit > 0 else text.split(str(separator))
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def k8s_substring(value: Any, start: Any, end: Any = None) -> Any:
    text = _str_arg(value, "substring")
    if isinstance(text, CELEvalError):
        return text
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        return _err(f"index out of range: substring({int(start)}, {stop}) of a {len(text)}-character string")
    return celtypes.StringType(text[int(start) : stop])


def k8s_char_at(value: Any, index: Any) -> Any:
    text = _str_arg(value, "charAt")
    if isinstance(text, CELEvalError):
        return text
    if not 0 <= int(index) <= len(text):
        return _err(f"index out of range: {int(index)}")
    return celtypes.StringType(text[int(index) : int(index) + 1])


def k8s_index_of(value: Any, item: Any, start: Any = 0) -> Any:
    if isinstance(value, str):
        return celtypes.IntType(str(value).find(str(item), int(start)))
    if isinstance(value, list):
        for position, element in enumerate(value):
            if element == item:
                return celtypes.IntType(position)
        return celtypes.IntType(-1)
    return _err(f"no such overload: indexOf({type(value).__name__})")


def k8s_last_index_of(value: Any, item: Any) -> Any:
    if isinstance(value, str):
        return celtypes.IntType(str(value).rfind(str(item)))
    if isinstance(value, list):
        for position in range(len(value) - 1, -1, -1):
            if value[position] == item:
                return celtypes.IntType(position)
        return celtypes.IntType(-1)
    return _err(f"no such overload: lastIndexOf({type(value).__name__})")


def k8s_join(value: Any, separator: Any = "") -> Any:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return _err("no such overload: join needs a list of strings")
    return celtypes.StringType(str(separator).join(str(v) for v in value))


def k8s_find(value: Any, pattern: Any) -> Any:
    try:
        found = re.search(str(pattern), str(value))
    except re.error as err:
        return _err(f"invalid regular expression {pattern!r}: {err}")
    return celtypes.StringType(found.group(0) if found else "")


def k8s_find_all(value: Any, pattern: Any, limit: Any = -1) -> Any:
    try:
        found = [m.group(0) for m in re.finditer(str(pattern), str(value))]
    except re.error as err:
        return _err(f"invalid regular expression {pattern!r}: {err}")
    if int(limit) >= 0:
        found = found[: int(limit)]
    return celtypes.ListType([celtypes.StringType(s) for s in found])


def k8s_is_sorted(value: Any) -> Any:
    if not isinstance(value, list):
        return _err("no such overload: isSorted")
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(value)))


def k8s_sum(value: Any) -> Any:
    if not isinstance(value, list):
        return _err("no such overload: sum")
    total: Any = celtypes.IntType(0)
    for item in value:
        total = total + item
    return total


def k8s_max(value: Any, *more: Any) -> Any:
    items = list(value) if isinstance(value, list) and not more else [value, *more]
    if not items:
        return _err("max of an empty list")
    return max(items)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": k8s_quantity,
    "isQuantity": k8s_is_quantity,
    "sign": k8s_sign,
    "isInteger": k8s_is_integer,
    "asInteger": k8s_as_integer,
    "asApproximateFloat": k8s_as_approximate_float,
    "add": k8s_add,
    "sub": k8s_sub,
    "compareTo": k8s_compare_to,
    "isGreaterThan": k8s_is_greater_than,
    "isLessThan": k8s_is_less_than,
    "semver": k8s_semver,
    "isSemver": k8s_is_semver,
    "major": k8s_major,
    "minor": k8s_minor,
    "patch": k8s_patch,
    "lowerAscii": k8s_lower_ascii,
    "upperAscii": k8s_upper_ascii,
    "trim": k8s_trim,
    "replace": k8s_replace,
    "split": k8s_split,
    "substring": k8s_substring,
    "charAt": k8s_char_at,
    "indexOf": k8s_index_of,
    "lastIndexOf": k8s_last_index_of,
    "join": k8s_join,
    "find": k8s_find,
    "findAll": k8s_find_all,
    "isSorted": k8s_is_sorted,
    "sum": k8s_sum,
    "max": k8s_max,
}


# -- the ``device`` variable ------------------------------------------------------------------


class _DomainMap(celtypes.MapType):
    """domain → id → value; an unknown domain is an empty map, as in compile.go."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return _EMPTY_MAP


_EMPTY_MAP = celtypes.MapType({})


def _cel_value(value: AttributeValue) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value  # Semver is opaque


def _split_name(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


@dataclass(frozen=True)
class DeviceInput:
    """What a selector sees of one device (``cel.Device`` in compile.go)."""

    driver: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, Quantity]
    allow_multiple_allocations: bool = False

    def activation(self) -> dict[str, Any]:
        attributes: dict[str, dict[Any, Any]] = {}
        for name, value in self.attributes.items():
            domain, ident = _split_name(name, self.driver)
            attributes.setdefault(domain, {})[celtypes.StringType(ident)] = _cel_value(value)
        capacity: dict[str, dict[Any, Any]] = {}
        for name, quantity in self.capacity.items():
            domain, ident = _split_name(name, self.driver)
            capacity.setdefault(domain, {})[celtypes.StringType(ident)] = quantity
        device: dict[Any, Any] = {
            celtypes.StringType("driver"): celtypes.StringType(self.driver),
            celtypes.StringType("attributes"): _DomainMap(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in attributes.items()}
            ),
            celtypes.StringType("capacity"): _DomainMap(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in capacity.items()}
            ),
        }
        # compile.go (1.34+) always sets it, false unless the device says otherwise.
        device[celtypes.StringType("allowMultipleAllocations")] = celtypes.BoolType(
            self.allow_multiple_allocations
        )
        return {"device": celtypes.MapType(device)}


@dataclass(frozen=True)
class SelectorOutcome:
    """``matched`` is None when evaluation failed; ``error`` then says why."""

    matched: bool | None
    error: str | None = None


# -- compilation ------------------------------------------------------------------------------

_BIND_TEMPLATE = "[__bind_init].map(__bind_var, __bind_body)[0]"


def _parser() -> CELParser:
    # One Lark parser is shared process-wide by celpy; the transpiler needs its node class.
    existing = CELParser.CEL_PARSER
    if existing is not None and existing.options.tree_class is not TranspilerTree:
        CELParser.CEL_PARSER = None
    return CELParser(tree_class=TranspilerTree)


def _ident(node: lark.Tree[Any]) -> str:
    token = node.children[0]
    return token.value if isinstance(token, lark.Token) else ""


def _rewrite_bind(tree: lark.Tree[Any], parser: CELParser) -> None:
    """``cel.bind(v, init, body)`` → ``[init].map(v, body)[0]``: same value, init evaluated once.

    celpy has no ``cel.bind`` macro (cel-go ``ext.Bindings``, which Kubernetes enables for DRA).
    """
    for node in list(tree.iter_subtrees()):
        for index, child in enumerate(node.children):
            if not (isinstance(child, lark.Tree) and child.data == "member_dot_arg"):
                continue
            target, method = child.children[0], child.children[1]
            if not (
                isinstance(method, lark.Token)
                and method.value == "bind"
                and isinstance(target, lark.Tree)
                and [_ident(t) for t in target.find_data("ident")] == ["cel"]
                and len(child.children) == 3
            ):
                continue
            args = child.children[2]
            if not isinstance(args, lark.Tree) or len(args.children) != 3:
                raise CelCompileError("cel.bind needs three arguments: cel.bind(name, value, expression)")
            var, init, body = args.children
            template = parser.parse(_BIND_TEMPLATE)
            replacement = next(template.find_data("member_index"))
            placeholders = {
                "__bind_init": init,
                "__bind_var": var,
                "__bind_body": body,
            }
            for holder in list(replacement.iter_subtrees()):
                for position, grandchild in enumerate(holder.children):
                    if isinstance(grandchild, lark.Tree) and grandchild.data == "expr":
                        names = [_ident(t) for t in grandchild.find_data("ident")]
                        if len(names) == 1 and names[0] in placeholders:
                            holder.children[position] = placeholders[names[0]]
            node.children[index] = replacement


class CompiledSelector:
    """One compiled expression; evaluate it against :class:`DeviceInput` activations."""

    def __init__(self, expression: str, *, interpreted: bool = False) -> None:
        self.expression = expression
        with _LOCK:
            parser = _parser()
            try:
                tree = parser.parse(expression)
            except CELParseError as err:
                raise CelCompileError(_one_line(str(err))) from err
            except lark.exceptions.LarkError as err:
                raise CelCompileError(_one_line(str(err))) from err
            _rewrite_bind(tree, parser)
            if not isinstance(tree, TranspilerTree):  # _parser() builds this node class
                raise CelCompileError(f"the CEL parser built a {type(tree).__name__}, not a TranspilerTree")
            self._runner = self._build(tree, interpreted=interpreted)

    @staticmethod
    def _build(tree: TranspilerTree, *, interpreted: bool) -> celpy.Runner:
        if interpreted:
            # celpy's transpiler applies ``!`` to has()'s plain bool and fails ("no such
            # overload"); the interpreter does not. Callers that value fidelity over speed ask for it.
            return celpy.InterpretedRunner(celpy.Environment(), tree, _FUNCTIONS)
        try:
            return celpy.CompiledRunner(
                celpy.Environment(runner_class=celpy.CompiledRunner), tree, _FUNCTIONS
            )
        except Exception:
            return celpy.InterpretedRunner(celpy.Environment(), tree, _FUNCTIONS)

    def evaluate(self, activation: Mapping[str, Any]) -> SelectorOutcome:
        try:
            result = self.value(activation)
        except CelEvaluationError as err:
            return SelectorOutcome(None, str(err))
        if isinstance(result, celtypes.BoolType | bool):
            return SelectorOutcome(bool(result))
        return SelectorOutcome(None, f"must evaluate to bool, not {_cel_type_name(result)}")

    def value(self, activation: Mapping[str, Any]) -> Any:
        """The expression's value, whatever its type (a CRD's ``messageExpression`` is a string);
        raises :class:`CelEvaluationError` with a one-line message when evaluation fails."""
        try:
            with _LOCK:
                result = self._runner.evaluate(dict(activation))
        except CELEvalError as err:
            raise CelEvaluationError(_describe(err)) from err
        except RecursionError as err:
            raise CelEvaluationError("expression nests too deeply") from err
        except Exception as err:
            raise CelEvaluationError(_one_line(f"{type(err).__name__}: {err}")) from err
        if isinstance(result, CELEvalError):
            raise CelEvaluationError(_describe(result))
        return result


def _cel_type_name(value: Any) -> str:
    for cls, name in (
        (celtypes.BoolType, "bool"),
        (celtypes.IntType, "int"),
        (celtypes.UintType, "uint"),
        (celtypes.DoubleType, "double"),
        (celtypes.StringType, "string"),
        (celtypes.ListType, "list"),
        (celtypes.MapType, "map"),
        (Quantity, "Quantity"),
        (Semver, "Semver"),
    ):
        if isinstance(value, cls):
            return name
    return type(value).__name__


def _describe(err: CELEvalError) -> str:
    """A one-line message like Kubernetes' ("no such key: model")."""
    args: Iterable[Any] = err.args
    while True:
        args = list(args)
        if len(args) >= 3 and isinstance(args[2], tuple) and args[1] is CELEvalError:
            args = args[2]  # the transpiler wraps the original error once more
            continue
        break
    message = str(args[0]) if args else "evaluation error"
    cause = args[1] if len(args) > 1 else None
    detail = args[2] if len(args) > 2 else None
    if message == "unbound function" and isinstance(detail, tuple) and detail:
        return f"undeclared reference to '{detail[0]}'"
    if cause is KeyError or message.startswith("no such member"):
        key = detail[0] if isinstance(detail, tuple) and detail else None
        if key is None:
            found = re.search(r"'([^']*)'", message)
            key = found.group(1) if found else "?"
        return f"no such key: {key}"
    if message.startswith("undeclared reference"):
        found = re.search(r"undeclared reference to '([^']+)'", message)
        return f"undeclared reference to '{found.group(1)}'" if found else "undeclared reference"
    return _one_line(message)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class SelectorCache:
    """Compiled programs by expression text (``cel.Cache`` in Kubernetes), bounded LRU."""

    def __init__(self, max_entries: int = 1024, *, interpreted: bool = False) -> None:
        self._max = max_entries
        self._interpreted = interpreted
        self._entries: dict[str, CompiledSelector | CelCompileError] = {}
        self._lock = threading.Lock()

    def get(self, expression: str) -> CompiledSelector:
        """The compiled selector, or raise :class:`CelCompileError` (also cached)."""
        with self._lock:
            entry = self._entries.pop(expression, None)
            if entry is not None:
                self._entries[expression] = entry  # most recently used last
        if entry is None:
            try:
                entry = CompiledSelector(expression, interpreted=self._interpreted)
            except CelCompileError as err:
                entry = err
            with self._lock:
                self._entries[expression] = entry
                while len(self._entries) > self._max:
                    self._entries.pop(next(iter(self._entries)))
        if isinstance(entry, CelCompileError):
            raise entry
        return entry
