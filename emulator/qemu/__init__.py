"""QEMU-backed hosts: a topology host of ``kind: qemu`` is a q35 guest whose kernel sees each
bound PCIe device hot-plugged on a ``pcie-root-port``, and memory hot-added as DIMMs on a
memory-only NUMA node (see docs/emulator.md, "QEMU hosts")."""
