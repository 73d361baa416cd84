"""Benchmarks: figures come from here, never from timed tests. Run ``python -m bench``."""
