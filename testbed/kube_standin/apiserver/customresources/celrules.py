"""A custom resource's ``x-kubernetes-validations``, as
``k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go`` (``Validator.Validate``)
evaluates them on create, update and status update:

* every rule of a schema node runs on each value at that node, ``self`` bound to the value as CEL
  sees it (``k8s.io/apiserver/pkg/cel/common/values.go``): an object is a map, a ``duration``
  string a duration, a ``date-time`` string a timestamp, an int-or-string an int or a string;
* a rule that names ``oldSelf`` is a *transition rule*: it runs on update only, where the old
  object has a correlatable value (same property path; the item of a ``map`` list with the same
  keys; never an item of an atomic list);
* a false rule adds the rule's error (``fieldErrorForReason``): ``reason`` chooses the error type
  (default ``FieldValueInvalid``), ``fieldPath`` the path under the node, the message is
  ``messageExpression``'s string, else ``message``, else ``failed rule: <rule>``; a scalar's value
  is shown (``Invalid value: "3s": ...``), an object's or array's is not (``Invalid value: ...``);
* an evaluation error is ``<error> evaluating rule: <rule>`` (``no such overload`` gets the real
  server's longer wording).

The expressions run on cel-python with DRA's Kubernetes CEL libraries
(:mod:`dra_driver.selection.celenv`: quantity, semver, strings, regex, lists, ``cel.bind``). What
the real server does and this one does not: CEL type checking at CRD creation (an undeclared
field is an error there, a runtime error here), the cost estimator and runtime cost budget, and
``optionalOldSelf`` (docs/testing.md, "Custom resources").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celpy import celtypes

from dra_driver.selection.celenv import CelCompileError, CelEvaluationError, CompiledSelector, SelectorCache
from kube_standin.apiserver.customresources.durations import parse_date_time, parse_duration_nanos
from kube_standin.apiserver.customresources.structural import SchemaNode, child_path, go_value, index_path
from kube_standin.apiserver.fielderrors import FieldErrors
from kube_standin.apiserver.status import Cause

__all__ = ["check_rules", "compile_rule", "to_cel"]

_OLD_SELF = re.compile(r"\boldSelf\b")
# Interpreted: a CRD's rules run once per write, and celpy's transpiler mis-evaluates ``!has(x)``.
_RULES = SelectorCache(max_entries=4096, interpreted=True)


def compile_rule(expression: str) -> CompiledSelector:
    """The compiled expression (cached); raises :class:`CelCompileError` when it does not parse."""
    return _RULES.get(expression)


def to_cel(node: SchemaNode | None, value: Any) -> Any:
    """``value`` as a CEL value typed by its schema node (``UnstructuredToVal``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return _string_value(node, value)
    if isinstance(value, list):
        items = node.items if node is not None else None
        return celtypes.ListType([to_cel(items, v) for v in value])
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            sub = (node.properties.get(key) or node.additional) if node is not None else None
            out[celtypes.StringType(key)] = to_cel(sub, item)
        return celtypes.MapType(out)
    return value


def _string_value(node: SchemaNode | None, value: str) -> Any:
    fmt = node.format if node is not None else ""
    if fmt == "duration":
        nanos = parse_duration_nanos(value)
        if nanos is not None:
            return celtypes.DurationType(seconds=nanos // 10**9, nanos=nanos % 10**9)
    if fmt == "date-time":
        moment: datetime | None = parse_date_time(value)
        if moment is not None:
            return celtypes.TimestampType(moment)
    return celtypes.StringType(value)


def check_rules(node: SchemaNode, value: Any, old: Any, path: str, errs: FieldErrors) -> None:
    """Evaluate every rule of ``node`` and its descendants on ``value`` (``old``: the correlated
    old value, None on create or where there is none)."""
    if value is None:
        return
    if node.rules:
        _run_rules(node, value, old, path, errs)
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            sub = node.properties.get(key) or node.additional
            if sub is not None:
                sub_path = child_path(path, key) if key in node.properties else index_path(path, key)
                check_rules(sub, item, old_map.get(key), sub_path, errs)
    elif isinstance(value, list) and node.items is not None:
        for index, item in enumerate(value):
            check_rules(node.items, item, _correlated_item(node, item, old), index_path(path, index), errs)


def _correlated_item(node: SchemaNode, item: Any, old: Any) -> Any:
    """The old list's item with the same map keys (``x-kubernetes-list-type: map``); nothing else
    correlates (``common.CorrelatableOldValue``)."""
    if (
        node.list_type != "map"
        or not node.list_keys
        or not isinstance(old, list)
        or not isinstance(item, dict)
    ):
        return None
    wanted = [item.get(k) for k in node.list_keys]
    for candidate in old:
        if isinstance(candidate, dict) and [candidate.get(k) for k in node.list_keys] == wanted:
            return candidate
    return None


def _run_rules(node: SchemaNode, value: Any, old: Any, path: str, errs: FieldErrors) -> None:
    self_value = to_cel(node, value)
    old_value = to_cel(node, old) if old is not None else None
    for rule in node.rules:
        expression = str(rule.get("rule") or "")
        if _OLD_SELF.search(expression) and old_value is None:
            continue  # a transition rule, and nothing to transition from
        activation = {"self": self_value}
        if old_value is not None:
            activation["oldSelf"] = old_value
        rule_path = _rule_path(path, str(rule.get("fieldPath") or ""))
        shown = node.type_name()
        try:
            outcome = compile_rule(expression).value(activation)
        except (CelCompileError, CelEvaluationError) as err:
            errs.causes.append(Cause(path, "FieldValueInvalid", _runtime_error(shown, str(err), rule)))
            continue
        if isinstance(outcome, celtypes.BoolType | bool) and bool(outcome):
            continue
        if not isinstance(outcome, celtypes.BoolType | bool):
            detail = f"rule must evaluate to bool, not {type(outcome).__name__}"
            errs.causes.append(Cause(path, "FieldValueInvalid", _runtime_error(shown, detail, rule)))
            continue
        # validation.go: an object or array is not shown (field.OmitValueType), a scalar is.
        value_shown = None if node.type in ("object", "array") else go_value(value)
        _add_failure(errs, rule, rule_path, value_shown, _message(rule, activation))


def _rule_path(path: str, field_path: str) -> str:
    """``fieldPath`` (``.spec.max``, ``['key']``) appended to the node's path."""
    if not field_path:
        return path
    if field_path.startswith("."):
        return child_path(path, field_path[1:])
    return f"{path}{field_path}"


def _rule_error_string(rule: Mapping[str, Any]) -> str:
    """``ruleErrorString``: the rule's message when it has one, else the rule."""
    return str(rule.get("message") or "").strip() or str(rule.get("rule") or "").strip()


def _runtime_error(shown: str, error: str, rule: Mapping[str, Any]) -> str:
    rule_text = _rule_error_string(rule)
    if error.startswith("no such overload"):
        return (
            f"Invalid value: \"{shown}\": '{error}': call arguments did not match a supported operator, "
            f"function or macro signature for rule: {rule_text}"
        )
    return f'Invalid value: "{shown}": {error} evaluating rule: {rule_text}'


def _message(rule: Mapping[str, Any], activation: Mapping[str, Any]) -> str:
    """``messageExpression``'s string when it yields a non-blank one, else ``message``, else the
    default (``ruleMessageOrDefault``)."""
    message_expression = str(rule.get("messageExpression") or "")
    if message_expression:
        try:
            text = compile_rule(message_expression).value(activation)
        except (CelCompileError, CelEvaluationError):
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text.strip():
            return text.strip()
    message = str(rule.get("message") or "").strip()
    return message or f"failed rule: {str(rule.get('rule') or '').strip()}"


def _add_failure(
    errs: FieldErrors, rule: Mapping[str, Any], path: str, shown: str | None, message: str
) -> None:
    """``fieldErrorForReason``; ``shown`` is the value as ``field.Error`` prints it (None: omitted)."""
    reason = rule.get("reason") or "FieldValueInvalid"
    if reason == "FieldValueForbidden":
        errs.forbidden(path, message)
    elif reason == "FieldValueRequired":
        errs.required(path, message)
    elif reason == "FieldValueDuplicate":
        errs.causes.append(
            Cause(
                path, "FieldValueDuplicate", "Duplicate value" + (f": {shown}" if shown is not None else "")
            )
        )
    else:
        value = f"{shown}: " if shown is not None else ""
        errs.causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {value}{message}"))
