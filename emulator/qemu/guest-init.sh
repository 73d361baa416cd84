#!/bin/sh
# Second stage of a QEMU host's boot, run as PID 1 from the host's own root filesystem (mounted
# read-only over 9p by the initramfs). Makes the writable directories a node needs, brings up
# user networking, starts udevd (events for pyudev, module autoloading on hot-plug) and then the
# guest agent, which the emulator and the tests drive over a forwarded TCP port.
HOME=/tmp
export HOME
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
for dir in /tmp /run /var/tmp /var/log /var/lib /var/cache; do
    mount -t tmpfs -o mode=0755 tmpfs "$dir"
done
chmod 1777 /tmp /var/tmp
# /etc stays the host's, but writable (modprobe.d, hostname): an overlay with a tmpfs upper.
mkdir -p /run/etc-upper /run/etc-work
mount -t overlay overlay -o lowerdir=/etc,upperdir=/run/etc-upper,workdir=/run/etc-work /etc
if grep -q fabric_dra_share /proc/cmdline; then
    share=$(sed -n 's/.*fabric_dra_share=\([^ ]*\).*/\1/p' /proc/cmdline)
    # under /tmp the mount point lives on the guest's tmpfs: make it, so the share keeps its path
    mkdir -p "$share" 2>/dev/null
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 fdshare "$share"
fi
hostname "$(sed -n 's/.*fabric_dra_hostname=\([^ ]*\).*/\1/p' /proc/cmdline)"
ip link set lo up
modprobe virtio_net
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
/lib/systemd/systemd-udevd --daemon
agent=$(sed -n 's/.*fabric_dra_agent=\([^ ]*\).*/\1/p' /proc/cmdline)
python=$(sed -n 's/.*fabric_dra_python=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "fabric-dra guest: starting agent $agent" > /dev/console
"$python" -S "$agent" --port 7000 > /dev/console 2>&1
echo "fabric-dra guest: agent exited, powering off" > /dev/console
poweroff -f
