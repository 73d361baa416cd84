"""``fabric-dra controller``: publishes each fabric pool as ResourceSlices, keeps the nodes' pool
labels right, and (in binding-condition mode) attaches allocated devices before the pod is bound.

One job per module:

- :mod:`.naming` — the names and syntax rules of ``resource.k8s.io/v1`` that this role writes
- :mod:`.quantity` — Kubernetes quantities (capacity values)
- :mod:`.devices` — one inventory device → one DRA ``Device``
- :mod:`.slices` — one pool → its ResourceSlices; semantic comparison with what is stored
- :mod:`.inventory` — the manager's inventory as an event source (long poll)
- :mod:`.publisher` — writes the slices, event-driven, with zero writes when nothing changed
- :mod:`.nodelabels` — the per-pool node labels the slices' node selectors match
- :mod:`.pluginpods` — which nodes have a Ready kubelet plugin (only they get pool labels)
- :mod:`.features` — what the cluster serves (device taints)
- :mod:`.binding` — the binding-condition flow on ResourceClaims
- :mod:`.metrics`, :mod:`.health` — Prometheus metrics and the probe endpoint
- :mod:`.app`, :mod:`.cli` — wiring, leader election and the command line
"""
