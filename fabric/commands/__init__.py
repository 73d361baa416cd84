"""The command lines of the fabric side: ``fabric-dra manager``, ``status`` and ``usage``."""
