"""fabric-dra's testbed beside the Kubernetes stand-ins (:mod:`kube_standin`): the one stack builder
that starts every process of a local fabric-dra for the demo, the benchmarks and the tests
(:mod:`fabric_dra_testbed.stack`), the stand-ins around a role under test
(:mod:`fabric_dra_testbed.standins`) and ``fabric-dra demo`` (:mod:`fabric_dra_testbed.demo`).

A distribution of its own (``fabric-dra-testbed``, ``testbed/pyproject.toml``): the product never
imports it; it adds its subcommands to ``fabric-dra`` through the ``fabric_dra.commands`` entry points.
"""
