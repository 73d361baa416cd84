"""ValidatingAdmissionPolicy: the API test server evaluates the policies and bindings stored in it
(``admissionregistration.k8s.io/v1``) on every create, update and delete, as the real server's
``ValidatingAdmissionPolicy`` admission plugin does (``k8s.io/apiserver/pkg/admission/plugin/
policy/validating``: ``dispatcher.go``, ``validator.go``; on by default since 1.30).

Where it runs: after the kind's strategy and the server's own validation, inside the store's
compare-and-swap, on the object as it would be stored — the validating admission stage that
``registry/generic/registry/store.go`` calls (``createValidation``/``updateValidation``) — and for
a delete, on the stored object before it goes. For each binding (by name) whose policy exists:

- **match**: the policy's ``matchConstraints.resourceRules`` and, when the binding has them, its
  ``matchResources.resourceRules`` (operations, apiGroups, apiVersions, resources with ``*``,
  ``resource/subresource``, ``*/subresource`` and ``resource/*``, scope); ``excludeResourceRules``
  exclude. Namespace and object selectors are not modelled: a rule with one is refused at
  evaluation (deny), never silently widened;
- **matchConditions**, in order: all must be true, or the policy does not apply;
- **variables**, in order, then each **validation**: a false one denies with its ``message``
  (``messageExpression`` when it evaluates to a string), else ``failed expression: <expr>``; its
  ``reason`` (default ``Invalid``) gives the HTTP code (``reasonToCode``: Forbidden 403, Invalid 422,
  Unauthorized 401, RequestEntityTooLarge 413);
- an expression that does not compile or fails at run time follows ``failurePolicy`` (default
  ``Fail``: deny, ``expression '<expr>' resulted in error: <error>``; ``Ignore``: skip);
- only bindings whose ``validationActions`` include ``Deny`` refuse (``Warn``/``Audit`` are not
  modelled: they never refuse on a real server either).

The answer is ``admission.NewForbidden``'s Status with the policy's reason and code:
``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>'
denied request: <message>``, the same line in ``details.causes``.

CEL is cel-python (``celpy``) without the Kubernetes libraries and without optional types
(``?.``, ``[?…]``, ``orValue``): an expression using them does not compile here and is denied as
above, so a policy this server accepts uses ``has()`` and ``in`` instead — which the real server
evaluates the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.registry import ResourceType, find_resource
from kube_standin.apiserver.status import StatusError
from kube_standin.apiserver.storage import Storage
from kube_standin.errors import RequestError

__all__ = ["POLICIES", "POLICY_BINDINGS", "validate"]

Operation = Literal["CREATE", "UPDATE", "DELETE"]

logging.getLogger("celpy").setLevel(logging.CRITICAL)

_GROUP = "admissionregistration.k8s.io"

#: ``reasonToCode`` of validating/dispatcher.go
_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}


def _resource(plural: str) -> ResourceType:
    found = find_resource(_GROUP, "v1", plural)
    assert found is not None, plural
    return found


POLICIES = _resource("validatingadmissionpolicies")
POLICY_BINDINGS = _resource("validatingadmissionpolicybindings")


class _CompileError(RequestError):
    """A policy's expression does not compile or fails at run time (the policy's failurePolicy decides)."""


@lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    """The compiled expression (cached: policies are evaluated on every write)."""
    env = celpy.Environment()
    try:
        return env.program(env.compile(expression))
    except Exception as err:  # celpy raises its own parse error types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise _CompileError(f"compilation failed: {first}") from err


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    """The expression's value, as JSON-like Python; raises on a compile or run-time error."""
    try:
        value = _program(expression).evaluate(dict(activation))
    except CELEvalError as err:
        raise _CompileError(str(err.args[0] if err.args else err)) from err
    if isinstance(value, CELEvalError):
        raise _CompileError(str(value.args[0] if value.args else value))
    return value


def _matches_rule(
    rule: Mapping[str, Any], operation: Operation, res: ResourceType, sub: str, version: str
) -> bool:
    """One ``NamedRuleWithOperations`` (``admission/plugin/webhook/predicates/rules/rules.go``)."""
    operations = rule.get("operations") or []
    if "*" not in operations and operation not in operations:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and res.group not in groups:
        return False
    versions = rule.get("apiVersions") or []
    if "*" not in versions and version not in versions:
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and res.namespaced) or (scope == "Namespaced" and not res.namespaced):
        return False
    for resource in rule.get("resources") or []:
        plural, _, subresource = str(resource).partition("/")
        if plural not in ("*", res.plural):
            continue
        if subresource == "*" or subresource == sub:
            return True
    return False


def _selectors_set(constraints: Mapping[str, Any]) -> bool:
    return any((constraints.get(k) or {}) not in ({}, None) for k in ("namespaceSelector", "objectSelector"))


def _matches(
    constraints: Mapping[str, Any] | None, operation: Operation, res: ResourceType, sub: str, version: str
) -> bool:
    if not constraints:
        return True
    rules = constraints.get("resourceRules") or []
    if not any(_matches_rule(r, operation, res, sub, version) for r in rules):
        return False
    return not any(
        _matches_rule(r, operation, res, sub, version) for r in constraints.get("excludeResourceRules") or []
    )


def _user_info(user: TokenUser | None) -> dict[str, Any]:
    if user is None:
        return {"username": "system:anonymous", "groups": ["system:unauthenticated"], "extra": {}}
    info = user.user_info()
    info.setdefault("extra", {})
    info.setdefault("uid", "")
    return info


def _denial(
    res: ResourceType, name: str, policy: str, binding: str, message: str, reason: str
) -> StatusError:
    line = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    details: dict[str, Any] = {"name": name, "kind": res.plural, "causes": [{"message": line}]}
    if res.group:
        details["group"] = res.group
    return StatusError(
        _CODES.get(reason, 422), reason, f'{res.group_resource} "{name}" is forbidden: {line}', details
    )


def validate(
    storage: Storage,
    user: TokenUser | None,
    operation: Operation,
    res: ResourceType,
    subresource: str | None,
    version: str,
    name: str,
    namespace: str | None,
    obj: Obj | None,
    old: Obj | None,
) -> None:
    """Raise the first denial of the stored policies for this request (objects as ``version``
    presents them), else return."""
    if res.group == _GROUP:
        return  # policies never judge writes of policies (the real plugin excludes its own kinds)
    bindings = sorted(storage.objects(POLICY_BINDINGS), key=lambda b: str(b["metadata"]["name"]))
    if not bindings:
        return
    policies = {str(p["metadata"]["name"]): p for p in storage.objects(POLICIES)}
    sub = subresource or ""
    request = {
        "operation": operation,
        "name": name,
        "namespace": namespace or "",
        "subResource": sub,
        "kind": {"group": res.group, "version": version, "kind": res.kind},
        "resource": {"group": res.group, "version": version, "resource": res.plural},
        "userInfo": _user_info(user),
        "dryRun": False,
    }
    base = {
        "object": json_to_cel(obj) if obj is not None else None,
        "oldObject": json_to_cel(old) if old is not None else None,
        "request": json_to_cel(request),
        "params": None,
        "namespaceObject": None,
    }
    for binding in bindings:
        spec = binding.get("spec") or {}
        policy = policies.get(str(spec.get("policyName") or ""))
        if policy is None or "Deny" not in (spec.get("validationActions") or []):
            continue
        _judge(res, name, operation, sub, version, policy, binding, base)


def _judge(
    res: ResourceType,
    name: str,
    operation: Operation,
    sub: str,
    version: str,
    policy: Obj,
    binding: Obj,
    base: Mapping[str, Any],
) -> None:
    spec = policy.get("spec") or {}
    policy_name, binding_name = str(policy["metadata"]["name"]), str(binding["metadata"]["name"])
    constraints = spec.get("matchConstraints") or {}
    narrowed = (binding.get("spec") or {}).get("matchResources") or {}
    if not _matches(constraints, operation, res, sub, version) or not _matches(
        narrowed, operation, res, sub, version
    ):
        return
    fail = (spec.get("failurePolicy") or "Fail") == "Fail"

    def deny(message: str, reason: str = "Invalid") -> StatusError:
        return _denial(res, name, policy_name, binding_name, message, reason)

    if _selectors_set(constraints) or _selectors_set(narrowed):
        raise deny("namespaceSelector and objectSelector are not evaluated by the API test server")
    activation = dict(base)
    try:
        for condition in spec.get("matchConditions") or []:
            if _evaluate(str(condition.get("expression")), activation) != celtypes.BoolType(True):
                return
    except _CompileError as err:
        if fail:
            raise deny(f"failed to evaluate matchConditions: {err}") from None
        return
    variables: dict[str, Any] = {}
    activation["variables"] = celtypes.MapType({})
    for variable in spec.get("variables") or []:
        expression = str(variable.get("expression"))
        try:
            variables[str(variable.get("name"))] = _evaluate(expression, activation)
        except _CompileError as err:
            if fail:
                raise deny(f"expression '{expression}' resulted in error: {err}") from None
            return
        activation["variables"] = celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()})
    for validation in spec.get("validations") or []:
        expression = str(validation.get("expression"))
        try:
            passed = _evaluate(expression, activation) == celtypes.BoolType(True)
        except _CompileError as err:
            if fail:
                raise deny(f"expression '{expression}' resulted in error: {err}") from None
            continue
        if passed:
            continue
        raise deny(_message(validation, expression, activation), str(validation.get("reason") or "Invalid"))


def _message(validation: Mapping[str, Any], expression: str, activation: Mapping[str, Any]) -> str:
    """``messageExpression`` when it gives a non-empty string, else ``message``, else the default."""
    text = validation.get("messageExpression")
    if text:
        try:
            value = _evaluate(str(text), activation)
        except _CompileError:
            value = None
        if isinstance(value, str) and value.strip():
            return value
    message = validation.get("message")
    if message:
        return str(message)
    return f"failed expression: {expression}"
