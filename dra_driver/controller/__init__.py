"""``fabric-dra controller``: publishes each fabric pool as ResourceSlices, keeps the nodes' pool
labels right, and (in binding-condition mode) attaches allocated devices before the pod is bound.

Its rooms, from the ground up (a module imports only its own room or those before it;
``tests/unit/test_layers.py`` reads this list):

=================== ==========================================================================
metrics             Prometheus metrics of every part
features            what the cluster serves (device taints, binding conditions)
pluginpods          which nodes have a Ready kubelet plugin (only they get pool labels)
resourcenames       the names and syntax rules of ``resource.k8s.io/v1`` that this role writes
health              the probe endpoint
managers            several managers: each one's inventory less the pools another keeps; up or down
devices             one inventory device → one DRA ``Device``
delta               which devices an inventory version changed, found without a pass over every device
quarantine          devices out of allocation after failed attaches
linktaints          devices whose PCIe link errs past the thresholds (a taint, with hysteresis)
reconciler          the one loop of a level-triggered pass: triggers, debounce, retry after a backoff
drainrules          drains as DeviceTaintRules, where the cluster serves them
render_memo         what was rendered for a device or a slice, kept while its devices stay the same
layout              where each device of a pool sits among its slices; it stays there across changes
slices              one pool → its ResourceSlices; semantic comparison with what is stored
patch               the last pass's pools patched with the devices a change brought
slicediff           what differs between a stored slice and its rewrite, for the log
dropped             the gated fields an API server drops on write, and the policy without them
publisher           writes the slices, event-driven, with zero writes when nothing changed
nodelabels          the per-pool node labels the slices' node selectors match
workqueue           one worker per claim, a failed pass retried after a backoff
claimstatus         binding conditions written into a claim's status (compare-and-swap)
binding_conditions  the binding-condition flow on ResourceClaims
settings            every setting of the command, declared once (flags, environment, file)
app                 wiring and leader election
cli                 the command line
=================== ==========================================================================
"""

FLOORS = (
    "metrics",
    "features",
    "pluginpods",
    "resourcenames",
    "health",
    "managers",
    "devices",
    "delta",
    "quarantine",
    "linktaints",
    "reconciler",
    "drainrules",
    "render_memo",
    "layout",
    "slices",
    "patch",
    "slicediff",
    "dropped",
    "publisher",
    "nodelabels",
    "workqueue",
    "claimstatus",
    "binding_conditions",
    "settings",
    "app",
    "cli",
)
