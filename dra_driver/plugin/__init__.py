"""The DRA kubelet plugin (``fabric-dra plugin``): registration, DRA v1/v1beta1 gRPC, prepare and
unprepare through the fabric manager, CDI specs, checkpoint, host-side detection and device health.

One module per job, as in kubernetes-sigs/dra-example-driver's kubelet plugin; its rooms, from the
ground up (a module imports only its own room or those before it; ``tests/unit/test_layers.py``
reads this list):

============== ================================================================================
prepare_errors why a prepare failed, as the kubelet and the claim's events read it
cdihook        ``fabric-dra cdi-hook set-mems``: the CDI hook binding a container to a NUMA node
config         flags and environment, validated once
state          per-claim locks (in-process and across pods) and background attaches
claims         reading ResourceClaims (resource.k8s.io v1, older versions as fallback)
registration   ``pluginregistration.Registration`` on the registry socket
hostview       what the host sees of a device: its records, the small sysfs readers
readiness      whether a real host's device is ready (drivers, /dev nodes, NVMe namespaces, udev)
hostside       acting on the host: who uses a device, function-level reset, unbind and remove
hostdev        finding a device in sysfs and waiting for it (udev events, PCI rescan)
partitioner    GPU partitions: the ``Partitioner`` interface, its record, the emulated one
nvml           MIG partitions of real NVIDIA GPUs through NVML (``fabric-dra[nvidia]``)
hostmemory     a CXL share's memory: devdax, or onlined as system RAM of its NUMA node (kmem)
facts          what the node knows of a claim's device, declared once (checkpoint, CDI, manager)
cdi            transient CDI spec files
probes         readiness (registered, checkpoint loaded) and liveness (gRPC answers) for the kubelet
checkpoint     the on-disk record of prepared claims
metrics        per-phase latency histograms, served with the probes
backend        how a device gets here and away: the fabric manager, or no-op for benchmarks
routes         several managers (one per Redfish service): each pool's attach to its own
report         the prepared claims reported to the manager
claimstatus    the claim's ``status.devices``: Ready and where each device is (KEP-4817)
linkhealth     whether a device's PCIe link still runs as negotiated at attach (with hysteresis)
attach         a claim's devices attached at prepare, recorded; rolled back where they cannot work
driver         the gRPC-facing callbacks (NodePrepareResources / NodeUnprepareResources)
health         the DRAResourceHealth stream
reconcile      startup repair of checkpoint vs CDI specs vs the fabric's bindings
server         wiring, sockets, signals
cli            ``register(subparsers)`` for the root command line
============== ================================================================================
"""

FLOORS = (
    "prepare_errors",
    "cdihook",
    "config",
    "state",
    "claims",
    "registration",
    "hostview",
    "readiness",
    "hostside",
    "hostdev",
    "partitioner",
    "nvml",
    "hostmemory",
    "facts",
    "cdi",
    "probes",
    "checkpoint",
    "metrics",
    "backend",
    "routes",
    "report",
    "claimstatus",
    "linkhealth",
    "attach",
    "driver",
    "health",
    "reconcile",
    "server",
    "cli",
)
