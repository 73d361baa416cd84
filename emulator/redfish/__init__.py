"""A DMTF Redfish composable-fabric service in software.

PCIe switches with pooled GPUs, NVMe drives, NICs and FPGAs, a CXL fabric with memory chunks,
and hosts that devices are bound to through PCIe zones, the CompositionService, or CXL
connections — with sessions, ETags, tasks, Server-Sent Events, durable state, injectable
faults, and a per-host sysfs view of what is bound. See docs/emulator.md.

Its rooms, from the ground up; a module imports only its own folder or those listed before it
(``tests/unit/test_layers.py`` reads this list):

* ``model``   what the service declares: messages and errors, resource payloads, URIs, fault
  specs, latency profiles, and the durable state;
* ``sysfs``   what each emulated host sees: its sysfs tree, PCI configuration space images;
* ``engine``  what changes the fabric: binds and unbinds, tasks, injected faults, events;
* ``tree``    the resource tree over HTTP: nodes, rendering and ETags, ``$expand``, sessions;
* ``views``   the resources under ``/redfish/v1``, one module per part of the tree;
* ``service`` the ASGI application and the server that assembles everything.
"""

FLOORS = ("model", "sysfs", "engine", "tree", "views", "service")
