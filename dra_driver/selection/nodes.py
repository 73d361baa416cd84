"""Which nodes a ResourceSlice or device serves: ``nodeName``, ``nodeSelector``, ``allNodes``.

Node selectors are matched as ``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``
does: terms are ORed, the requirements of one term ANDed, an empty term matches nothing;
``matchFields`` supports only ``metadata.name``.
"""

from __future__ import annotations

from dra_driver.selection.model import Node, NodeSelector, NodeSelectorRequirement

__all__ = ["describe_node_selector", "node_matches", "selector_matches"]


def _requirement_matches(req: NodeSelectorRequirement, value: str | None) -> bool:
    if req.operator == "In":
        return value is not None and value in req.values
    if req.operator == "NotIn":
        return value is None or value not in req.values
    if req.operator == "Exists":
        return value is not None
    if req.operator == "DoesNotExist":
        return value is None
    if value is None or len(req.values) != 1:
        return False
    try:
        actual, bound = int(value), int(req.values[0])
    except ValueError:
        return False
    return actual > bound if req.operator == "Gt" else actual < bound


def selector_matches(selector: NodeSelector, node: Node) -> bool:
    for term in selector.node_selector_terms:
        if not term.match_expressions and not term.match_fields:
            continue
        if all(
            _requirement_matches(r, node.metadata.labels.get(r.key)) for r in term.match_expressions
        ) and all(
            _requirement_matches(r, node.name if r.key == "metadata.name" else None)
            for r in term.match_fields
        ):
            return True
    return False


def node_matches(
    node: Node, node_name: str | None, all_nodes: bool | None, node_selector: NodeSelector | None
) -> bool:
    """``NodeMatches`` of the allocator's pools.go: nodeName, then allNodes, then nodeSelector."""
    if node_name:
        return node.name == node_name
    if all_nodes:
        return True
    if node_selector is not None:
        return selector_matches(node_selector, node)
    return False


def describe_node_selector(selector: NodeSelector) -> str:
    terms = []
    for term in selector.node_selector_terms:
        parts = [
            f"{r.key} {r.operator}" + (f" [{', '.join(r.values)}]" if r.values else "")
            for r in [*term.match_expressions, *term.match_fields]
        ]
        terms.append(" and ".join(parts) or "(empty term)")
    return " or ".join(terms) or "(no terms)"
