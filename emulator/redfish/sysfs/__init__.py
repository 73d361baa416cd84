"""What each emulated host sees: a sysfs-like tree per host, with PCI configuration space images."""
