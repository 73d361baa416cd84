"""The built-in admission plugins of the API test server that judge *who* writes, after the
object is known and before the kind's strategy and rules run (the real server's mutating admission
stage, ``admission.MutationInterface.Admit``, which create.go/update.go/patch.go/delete.go call
before ``rest.BeforeCreate``/``BeforeUpdate``).

**NodeRestriction** (kubernetes ``plugin/pkg/admission/noderestriction/admission.go``), always on,
as in every kubeadm or kind cluster (``cmd/kubeadm/app/phases/controlplane/manifests.go`` passes
``--enable-admission-plugins=NodeRestriction``). A node user is ``system:node:<name>`` in the group
``system:nodes`` (``nodeidentifier.NewDefaultNodeIdentifier``). For one (``Plugin.Admit``):

- any create, update or delete by a node user whose name names no node is refused;
- on ``nodes`` (any subresource; ``admitNode``) it may touch only its own Node; on create it may
  not set ``spec.configSource``; on update it may not set a new non-nil ``spec.configSource`` nor
  change ``spec.taints``; on create and update it may not add, change or remove a label
  ``getForbiddenLabels`` forbids: one under ``node-restriction.kubernetes.io`` (or a subdomain of it), or
  one under ``kubernetes.io``/``k8s.io`` (or a subdomain) that is not a kubelet label
  (``k8s.io/kubelet/pkg/apis/well_known_labels.go``, ``IsKubeletLabel``). Since Kubernetes 1.19
  (kubernetes#90307) create and update forbid the same set.

The labels are compared on the object as the request makes it (a PUT's body, a patch applied to
the stored object) — on ``nodes/status`` too, whose strategy keeps metadata changes on a real
server. The plugin's rules for pods, PVCs, service accounts, leases and CSINodes are not modelled
here; a node user's writes to them pass as anyone's (this server authorises nobody either).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.status import forbidden

__all__ = ["Operation", "admit", "forbidden_node_labels", "node_identity"]

Operation = Literal["CREATE", "UPDATE", "DELETE"]

#: ``nodeidentifier``'s ``nodeUserNamePrefix`` and ``user.NodesGroup``
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"

#: ``v1.LabelNamespaceNodeRestriction``: kubelets may never set a label in it
NODE_RESTRICTION_NAMESPACE = "node-restriction.kubernetes.io"
#: ``kubeletLabels`` of ``well_known_labels.go``: the kubernetes.io labels a kubelet may set
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
)
#: ``kubeletLabelNamespaces``: ``v1.LabelNamespaceSuffixKubelet`` and ``LabelNamespaceSuffixNode``
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def node_identity(user: TokenUser | None) -> tuple[str, bool]:
    """``defaultNodeIdentifier.NodeIdentity``: (node name, is a node user). The name may be empty
    for a node user (``system:node:``), which :func:`admit` then refuses everything."""
    if user is None or not user.username.startswith(NODE_USER_PREFIX):
        return "", False
    if NODES_GROUP not in user.groups:
        return "", False
    return user.username.removeprefix(NODE_USER_PREFIX), True


def _label_namespace(key: str) -> str:
    """``getLabelNamespace``: the part before the first ``/``, empty for a key without one."""
    namespace, slash, _ = key.partition("/")
    return namespace if slash else ""


def _in_namespace(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def _is_kubernetes_label(key: str) -> bool:
    namespace = _label_namespace(key)
    return _in_namespace(namespace, "kubernetes.io") or _in_namespace(namespace, "k8s.io")


def _is_kubelet_label(key: str) -> bool:
    """``kubeletapis.IsKubeletLabel``."""
    if key in KUBELET_LABELS:
        return True
    namespace = _label_namespace(key)
    return any(_in_namespace(namespace, allowed) for allowed in KUBELET_LABEL_NAMESPACES)


def _modified_labels(new: Mapping[str, str], old: Mapping[str, str]) -> set[str]:
    """``getModifiedLabels``: keys added, removed or given another value."""
    return {k for k in new.keys() | old.keys() if k not in new or k not in old or new[k] != old[k]}


def forbidden_node_labels(keys: Iterable[str]) -> list[str]:
    """``getForbiddenLabels``: which of the modified ``keys`` a node may not add, change or
    remove on its own Node, sorted as ``sets.String.List`` sorts them."""
    out = set()
    for key in keys:
        if _in_namespace(_label_namespace(key), NODE_RESTRICTION_NAMESPACE):
            out.add(key)
        if _is_kubernetes_label(key) and not _is_kubelet_label(key):
            out.add(key)
    return sorted(out)


def _labels(obj: Obj | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _spec(obj: Obj | None) -> dict[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _error_name(name: str, obj: Obj | None) -> str:
    """``extractResourceName``: the request's name, else the object's name or generateName, else
    ``Unknown``."""
    meta = (obj or {}).get("metadata") or {}
    return name or str(meta.get("name") or "") or str(meta.get("generateName") or "") or "Unknown"


def admit(
    user: TokenUser | None,
    operation: Operation,
    res: ResourceType,
    name: str,
    obj: Obj | None,
    old: Obj | None,
) -> None:
    """Raise the real server's 403 where NodeRestriction refuses the request, else return.

    ``name`` is the admission name: the URL's, or on create the object's ``metadata.name``
    (create.go: "On create, get name from new object if unset"); ``obj`` the object as the request
    makes it (None on delete), ``old`` the stored one (None on create)."""
    node_name, is_node = node_identity(user)
    if not is_node:
        return
    assert user is not None
    who = _error_name(name, obj)
    if not node_name:
        raise forbidden(res, who, f"could not determine node from user {_go_quote(user.username)}")
    if res.group or res.plural != "nodes":
        return
    _admit_node(node_name, operation, res, name, who, obj, old)


def _admit_node(
    node_name: str,
    operation: Operation,
    res: ResourceType,
    name: str,
    who: str,
    obj: Obj | None,
    old: Obj | None,
) -> None:
    """``admitNode``, its messages word for word."""
    node = _go_quote(node_name)
    if name != node_name:
        raise forbidden(res, who, f"node {node} is not allowed to modify node {_go_quote(name)}")
    if operation == "CREATE":
        if _spec(obj).get("configSource") is not None:
            why = f"node {node} is not allowed to create pods with a non-nil configSource"
            raise forbidden(res, who, why)
        banned = forbidden_node_labels(_modified_labels(_labels(obj), {}))
        if banned:
            why = f"node {node} is not allowed to set the following labels: {', '.join(banned)}"
            raise forbidden(res, who, why)
    elif operation == "UPDATE":
        source = _spec(obj).get("configSource")
        if source is not None and source != _spec(old).get("configSource"):
            why = f"node {node} is not allowed to update configSource to a new non-nil configSource"
            raise forbidden(res, who, why)
        # apiequality.Semantic.DeepEqual counts a nil and an empty slice as equal (the forked
        # reflect of k8s.io/apimachinery/third_party/forked/golang/reflect).
        if (_spec(obj).get("taints") or None) != (_spec(old).get("taints") or None):
            raise forbidden(res, who, f"node {node} is not allowed to modify taints")
        banned = forbidden_node_labels(_modified_labels(_labels(obj), _labels(old)))
        if banned:
            # The plugin's update message names no node (admission.go, admitNode).
            raise forbidden(res, who, f"is not allowed to modify labels: {', '.join(banned)}")


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _go_quote(text: str) -> str:
    """Go's ``%q`` (``strconv.Quote``) for the names the plugin quotes: ``"`` and ``\\`` escaped,
    control characters as ``\\n``-style or ``\\xhh`` escapes, other unprintable characters as
    ``\\u``/``\\U`` escapes — so a name cannot forge the message around it."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not ch.isprintable():
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
