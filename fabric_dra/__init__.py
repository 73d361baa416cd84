"""The ``fabric-dra`` command: every role of the product behind one entry point (the testbed adds
``demo`` and ``standin`` when it is installed, :mod:`fabric_dra.cli`)."""
