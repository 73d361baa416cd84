#!/bin/sh
# Second stage of a QEMU host's boot, run as PID 1 from the host's own root filesystem (mounted
# read-only over 9p by the initramfs, which also mounted the node's writable directories and set
# up user networking: image.py). Starts udevd (events for pyudev, module autoloading on
# hot-plug), replays the PCI devices' add events, and then the guest agent, which the emulator
# and the tests drive over a forwarded TCP port.
HOME=/tmp
export HOME
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
/lib/systemd/systemd-udevd --daemon
# Coldplug, as systemd-udev-trigger does at a node's boot, but of PCI devices only: their drivers
# load (a device still plugged in across a reboot is set up again); the rest needs nothing.
udevadm trigger --action=add --subsystem-match=pci
agent=$(sed -n 's/.*fabric_dra_agent=\([^ ]*\).*/\1/p' /proc/cmdline)
python=$(sed -n 's/.*fabric_dra_python=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "fabric-dra guest: starting the agent at $(cut -d' ' -f1 /proc/uptime)s" > /dev/console
"$python" -S "$agent" 7000 > /dev/console 2>&1
echo "fabric-dra guest: agent exited, powering off" > /dev/console
poweroff -f
