"""fabric-dra's Kubernetes side: the kubelet plugin, the ResourceSlice controller, the scheduler's
device selection (for ``explain``) and the kubelet's protocol bindings.

Its rooms, from the ground up; a module imports only its own room or those on a floor below it,
and the two roles, side by side on one floor, never import each other (``tests/unit/test_layers.py``
reads this list):

* ``errors``      the one exception tree (``DriverError``) and the bases callers catch;
* ``proto``       the kubelet's gRPC protocols (registration, DRA v1 and v1beta1, health), generated;
* ``selection``   the scheduler's device selection of ``resource.k8s.io/v1`` with DRA's CEL;
* ``linkerrors``  the one judgement of a PCIe link's error counters (with hysteresis), which the
  plugin (device health) and the controller (a device taint) make with thresholds of their own;
* ``plugin``      ``fabric-dra plugin``, the kubelet plugin on every node (its rooms:
  ``dra_driver/plugin/__init__.py``) — beside it
  ``controller``  ``fabric-dra controller``, the ResourceSlices, node labels and binding conditions
  (``dra_driver/controller/__init__.py``);
* ``explain``     ``fabric-dra explain``: why a claim does (not) fit, from the controller's slices and
  the scheduler's selection.
"""

FLOORS = ("errors", "proto", "selection", "linkerrors", ("plugin", "controller"), "explain")
