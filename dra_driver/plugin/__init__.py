"""The DRA kubelet plugin (``fabric-dra plugin``): registration, DRA v1/v1beta1 gRPC, prepare and
unprepare through the fabric manager, CDI specs, checkpoint, host-side detection and device health.

One module per job, as in kubernetes-sigs/dra-example-driver's kubelet plugin:

============== ================================================================================
config         flags and environment, validated once
registration   ``pluginregistration.Registration`` on the registry socket
driver         the gRPC-facing callbacks (NodePrepareResources / NodeUnprepareResources)
claims         reading ResourceClaims (resource.k8s.io v1, older versions as fallback)
state          per-claim locks (in-process and across pods) and background attaches
backend        how a device gets here and away: the fabric manager, or no-op for benchmarks
hostdev        host-side detection in sysfs (+ udev), PCI rescan, host-side removal
cdi            transient CDI spec files
checkpoint     the on-disk record of prepared claims
reconcile      startup repair of checkpoint vs CDI specs vs the fabric's bindings
health         the DRAResourceHealth stream
metrics        per-phase latency histograms, served with the probes
probes         readiness (registered, checkpoint loaded) and liveness (gRPC answers) for the kubelet
server         wiring, sockets, signals
cli            ``register(subparsers)`` for the root command line
============== ================================================================================
"""
