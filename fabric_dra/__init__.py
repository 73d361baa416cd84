"""The ``fabric-dra`` command (every role behind one entry point), the local demo and the stack
builder that starts every process of a local fabric-dra for the demo, the benchmarks and the tests."""
