"""``fabric-dra manager serve``: its settings, and the wiring that builds every part and runs it."""
