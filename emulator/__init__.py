"""The Redfish fabric emulator: a DMTF Redfish composable PCIe/CXL fabric in software, the
topologies it serves, and hosts that see what is bound to them (sysfs trees, or QEMU guests).

Its rooms, from the ground up; a module imports only its own room or those listed before it
(``tests/unit/test_layers.py`` reads this list):

* ``errors``   the one exception tree every part raises from;
* ``settings`` the settings of ``fabric-dra emulator serve``, declared once;
* ``topology`` topology files: the format, its checks, the index the service reads, a generator;
* ``qemu``     hosts of ``kind: qemu``: QEMU guests whose kernel sees bound devices hot-plugged;
* ``redfish``  the Redfish service (its own rooms are listed in ``emulator/redfish/__init__.py``);
* ``cli``      ``fabric-dra emulator``: serve, faults and bindings of a running one, topology tools.
"""

FLOORS = ("errors", "settings", "topology", "qemu", "redfish", "cli")
