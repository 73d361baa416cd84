"""NodeRestriction in the API test server (:mod:`kube_standin.apiserver.admission`): who counts as a
node, which labels a node may not touch on its own Node, and the 403s, against the cases and
messages of kubernetes ``plugin/pkg/admission/noderestriction/admission.go``."""

from __future__ import annotations

from typing import Any

import pytest

from kube_standin.apiserver.admission import admit, forbidden_node_labels, node_identity
from kube_standin.apiserver.auth import TokenUser, node_user, service_account_user
from kube_standin.apiserver.registry import ResourceType, find_resource
from kube_standin.apiserver.status import StatusError


def _resource(plural: str) -> ResourceType:
    res = find_resource("", "v1", plural)
    assert res is not None
    return res


NODES, PODS = _resource("nodes"), _resource("pods")


def node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def refusal(user: TokenUser | None, operation: Any, name: str, obj: Any, old: Any, res: Any = NODES) -> str:
    with pytest.raises(StatusError) as caught:
        admit(user, operation, res, name, obj, old)
    err = caught.value
    assert (err.code, err.reason) == (403, "Forbidden")
    assert err.details["kind"] == res.plural and "group" not in err.details
    return err.message


def test_a_node_user_is_system_node_name_in_the_nodes_group() -> None:
    assert node_identity(node_user("n1")) == ("n1", True)
    # the name alone, or the group alone, is not a node (nodeidentifier.NodeIdentity)
    assert node_identity(TokenUser(username="system:node:n1")) == ("", False)
    assert node_identity(TokenUser(username="n1", groups=["system:nodes"])) == ("", False)
    assert node_identity(service_account_user("fabric-dra", "fabric-dra-plugin", node="n1")) == ("", False)
    assert node_identity(None) == ("", False)
    # a node user without a name is a node, and is refused everything
    nameless = TokenUser(username="system:node:", groups=["system:nodes"])
    assert node_identity(nameless) == ("", True)
    message = refusal(nameless, "CREATE", "", {"metadata": {"name": "p"}}, None, res=PODS)
    assert message == 'pods "p" is forbidden: could not determine node from user "system:node:"'


@pytest.mark.parametrize(
    ("key", "forbidden"),
    [
        # the project's keys: a subdomain of NodeRestriction's namespace
        ("pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie", True),
        ("warm.fabric-dra.io.node-restriction.kubernetes.io/gpu", True),
        ("node-restriction.kubernetes.io/fips", True),
        # the keys of earlier releases: any kubelet could set them
        ("pool.fabric-dra.io/fabric-pcie", False),
        ("warm.fabric-dra.io/gpu", False),
        # kubernetes.io / k8s.io labels other than the kubelet's own
        ("node-role.kubernetes.io/control-plane", True),
        ("kubernetes.io/role", True),
        ("example.k8s.io/x", True),
        ("k8s.io/x", True),
        ("kubernetes.io/hostname", False),
        ("topology.kubernetes.io/zone", False),
        ("beta.kubernetes.io/arch", False),
        ("node.kubernetes.io/instance-type", False),
        ("node.kubernetes.io/anything", False),
        ("team.kubelet.kubernetes.io/anything", False),
        # look-alikes that are not in the namespace
        ("node-restriction.kubernetes.io.example.com/x", False),
        ("evilnode-restriction.kubernetes.io/x", True),  # not NodeRestriction's, but a kubernetes.io one
        ("example.com/x", False),
        ("plain", False),
    ],
)
def test_which_labels_a_node_may_not_touch(key: str, forbidden: bool) -> None:
    assert forbidden_node_labels([key]) == ([key] if forbidden else [])


def test_a_node_may_not_add_change_or_remove_a_forbidden_label_on_update() -> None:
    key = "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie"
    me = node_user("n1")
    old = node("n1", {key: "true", "mine": "a"})
    # its own labels, and the kubelet's, it may change
    admit(me, "UPDATE", NODES, "n1", node("n1", {key: "true", "mine": "b", "kubernetes.io/os": "linux"}), old)
    for labels in ({"mine": "a"}, {key: "false", "mine": "a"}):  # removed, changed
        assert refusal(me, "UPDATE", "n1", node("n1", labels), old) == (
            f'nodes "n1" is forbidden: is not allowed to modify labels: {key}'
        )
    # added, with the forbidden keys listed sorted
    warm = "warm.fabric-dra.io.node-restriction.kubernetes.io/gpu"
    both = node("n1", {key: "true", "mine": "a", warm: "9", "kubernetes.io/role": "x"})
    assert refusal(me, "UPDATE", "n1", both, old) == (
        f'nodes "n1" is forbidden: is not allowed to modify labels: kubernetes.io/role, {warm}'
    )
    # anyone else (the controller) may write them
    admit(service_account_user("fabric-dra", "fabric-dra-controller"), "UPDATE", NODES, "n1", both, old)
    admit(None, "UPDATE", NODES, "n1", both, old)


def test_a_node_may_not_register_with_a_forbidden_label() -> None:
    warm = "warm.fabric-dra.io.node-restriction.kubernetes.io/gpu"
    assert refusal(node_user("n1"), "CREATE", "n1", node("n1", {warm: "1"}), None) == (
        f'nodes "n1" is forbidden: node "n1" is not allowed to set the following labels: {warm}'
    )
    admit(node_user("n1"), "CREATE", NODES, "n1", node("n1", {"kubernetes.io/os": "linux"}), None)


def test_a_node_may_touch_only_its_own_node() -> None:
    me = node_user("n1")
    assert refusal(me, "UPDATE", "n2", node("n2", {"a": "b"}), node("n2")) == (
        'nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"'
    )
    assert refusal(me, "DELETE", "n2", None, None) == (
        'nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"'
    )
    # a collection delete is admitted under an empty name (delete.go), named Unknown in the error
    assert refusal(me, "DELETE", "", None, None) == (
        'nodes "Unknown" is forbidden: node "n1" is not allowed to modify node ""'
    )
    # a generateName create has no name to match: refused, named by its generateName
    assert refusal(me, "CREATE", "", {"metadata": {"generateName": "n1-"}}, None) == (
        'nodes "n1-" is forbidden: node "n1" is not allowed to modify node ""'
    )
    admit(me, "DELETE", NODES, "n1", None, None)
    # names are quoted as Go's %q quotes them: a hostile name cannot forge the message
    assert refusal(me, "DELETE", 'x"\n', None, None).endswith('not allowed to modify node "x\\"\\n"')


def test_a_node_may_not_change_its_taints_or_set_a_config_source() -> None:
    me = node_user("n1")
    taint = {"key": "fabric-dra.io/unhealthy", "effect": "NoSchedule"}
    old = node("n1", taints=[taint])
    assert refusal(me, "UPDATE", "n1", node("n1"), old) == (
        'nodes "n1" is forbidden: node "n1" is not allowed to modify taints'
    )
    # an absent list and an empty one are the same (apiequality.Semantic)
    admit(me, "UPDATE", NODES, "n1", node("n1", taints=[]), node("n1"))
    source = {"configMap": {"name": "c", "namespace": "kube-system", "kubeletConfigKey": "k"}}
    assert refusal(me, "UPDATE", "n1", node("n1", configSource=source), node("n1")) == (
        'nodes "n1" is forbidden: node "n1" is not allowed to update configSource'
        " to a new non-nil configSource"
    )
    assert refusal(me, "CREATE", "n1", node("n1", configSource=source), None) == (
        'nodes "n1" is forbidden: node "n1" is not allowed to create pods with a non-nil configSource'
    )
