"""fabric-dra's fabric side: the Redfish client, binding backends and the fabric manager service.

Its rooms, from the ground up; a module imports only its own room or those listed before it
(``tests/unit/test_layers.py`` reads this list):

* ``errors``   the exception tree: the wire family's additions, the manager's own root, the wire body;
* ``redfish``  the Redfish client (its own rooms are listed in ``fabric/redfish/__init__.py``);
* ``state``    what the manager knows and records: device records and names, the inventory, the
  ledger, the operation log, nodes, ResourceClaims, plugin reports, metrics — no Redfish;
* ``backends`` the fabric over Redfish: binding styles, discovery and its watch, reachability;
* ``driver``   one operation per device: durable intent, attempts on the fabric, recorded result;
* ``bindings`` who holds which device: the attach/detach front, the warm pool, reconciliation,
  orphans, device-seconds;
* ``api``      the REST API: routes, auth, the request guard, OpenAPI, the fabric map (``ui``);
* ``service``  ``fabric-dra manager serve``: settings and the wiring that runs every part;
* ``commands`` the command lines: ``fabric-dra manager``, ``status``, ``usage``.

Only the operation driver is handed the backends and the Redfish task control: ``bindings`` and
``api`` import nothing of ``redfish`` or ``backends`` (the layer test holds that too).
"""

FLOORS = ("errors", "redfish", "state", "backends", "driver", "bindings", "api", "service", "commands")
