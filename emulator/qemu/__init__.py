"""QEMU-backed hosts: a topology host of ``kind: qemu`` is a q35 guest whose kernel sees each
bound PCIe device hot-plugged on a ``pcie-root-port`` (see docs/emulator.md, "QEMU hosts")."""
