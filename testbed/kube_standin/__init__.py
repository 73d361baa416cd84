"""Stand-ins for the parts of Kubernetes fabric-dra talks to, for tests, benchmarks and the demo.
See docs/testing.md.

Its rooms, from the ground up; a module imports only its own room or those on the floors below it,
and rooms side by side on one floor never import each other (``tests/unit/test_layers.py`` reads
this list):

* ``errors``         the one exception tree every part raises from;
* ``kubelet_client`` the kubelet's side of the plugin-registration and DRA protocols;
* ``apiserver``      the API test server (talks to nobody), beside ``cluster``: the stand-in
  control plane and kubelets, which reach the API server over HTTP as every client does, and drive
  the plugins through ``kubelet_client``;
* ``cli``            ``fabric-dra standin``: the API server and the kubelet client as commands;
* ``__main__``       ``python -m kube_standin``: the same commands on their own.
"""

FLOORS = ("errors", "kubelet_client", ("apiserver", "cluster"), "cli", "__main__")
