#!/usr/bin/env bash
# Builds the node image of the real-node cluster lab: a Debian minbase rootfs (debootstrap, from
# Debian's packages) with systemd, containerd, runc, iptables, conntrack and the CNI plugins,
# plus the kubeadm/kubelet/kubectl/cri-tools packages of build-debs.sh (with the kubelet unit and
# kubeadm drop-in), the containerd config and sysctls from tests/cluster/node/. It is imported into podman as
# localhost/bosun-cluster-node:<key>, where <key> hashes everything that went in.
# Usage: build-node.sh <go bin dir> <apt repository>. Prints the image name as its last line.
set -euo pipefail

GOBIN_DIR="${1:?usage: build-node.sh <directory of build-go.sh binaries> <apt repository>}"
REPO="${2:?usage: build-node.sh <directory of build-go.sh binaries> <apt repository>}"
k8s=$("$GOBIN_DIR/kubeadm" version -o short)
[ -f "$REPO/set-$k8s.list" ] || { echo "cluster node: $REPO/set-$k8s.list is missing; run build-debs.sh first" >&2; exit 1; }
mapfile -t DEBS < <(sed "s|^|$REPO/|" "$REPO/set-$k8s.list")
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
SUITE="${BOSUN_CLUSTER_SUITE:-bookworm}"
MIRROR="${BOSUN_CLUSTER_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=systemd,systemd-sysv,dbus,containerd,runc,iptables,conntrack,socat,ethtool,iproute2,kmod,procps,ca-certificates,containernetworking-plugins,iputils-ping,less,apt-utils
BASE="$CACHE/cluster/rootfs-$SUITE-$(echo "$PACKAGES $MIRROR" | sha256sum | cut -c1-12)"
mkdir -p "$BASE"
LOG="$BASE/build.log"

exec 8>"$BASE/.lock"
flock 8
if [ ! -f "$BASE/rootfs.tar" ]; then
  t0=$(date +%s)
  echo "cluster node: debootstrap $SUITE (minbase + $PACKAGES); log: $LOG" >&2
  rm -rf "$BASE/rootfs"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$BASE/rootfs" "$MIRROR" >"$LOG" 2>&1 \
    || { echo "cluster node: debootstrap failed; last lines of $LOG:" >&2; tail -n 25 "$LOG" >&2; exit 1; }
  rm -rf "$BASE/rootfs/var/cache/apt/archives/"*.deb "$BASE/rootfs/var/lib/apt/lists/"*_Packages
  tar -C "$BASE/rootfs" --numeric-owner -cf "$BASE/rootfs.tar.tmp" .
  mv "$BASE/rootfs.tar.tmp" "$BASE/rootfs.tar"
  rm -rf "$BASE/rootfs"
  echo "cluster node: debootstrap took $(( $(date +%s) - t0 ))s" | tee -a "$LOG" >&2
fi

# The key hashes contents and the node files' names relative to tests/cluster/node, never where
# the clone or the cache is, so a new clone of the same tree finds the image it built before.
key=$( { sha256sum "$BASE/rootfs.tar" | cut -c1-64
         sha256sum "${DEBS[@]}" | cut -c1-64
         cd "$HERE/node" && find . -type f -print0 | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-12)
IMAGE="localhost/bosun-cluster-node:$key"
if podman image exists "$IMAGE"; then echo "$IMAGE"; exit 0; fi

t0=$(date +%s)
rm -rf "$BASE"/stage-*
stage="$BASE/stage-$key"; mkdir -p "$stage"
tar -C "$stage" -xf "$BASE/rootfs.tar"
# kubeadm, kubelet, kubectl and cri-tools as packages (build-debs.sh), so that apt and dpkg know
# them and the packages step can upgrade them from the lab's repository.
mkdir -p "$stage/tmp/debs"
cp "${DEBS[@]}" "$stage/tmp/debs/"
chroot "$stage" sh -c 'dpkg -i /tmp/debs/*.deb' >>"$LOG" 2>&1 \
  || { echo "cluster node: dpkg -i of ${DEBS[*]} in the node rootfs failed; see $LOG" >&2; exit 1; }
rm -rf "$stage/tmp/debs"
cp -a "$HERE/node/rootfs/." "$stage/"
# Only the lab's repository (cluster.sh up adds it): no traffic to Debian's mirrors from a node.
mv "$stage/etc/apt/sources.list" "$stage/etc/apt/sources.list.debian-disabled"
# Units the node does not need (and that fail in a container), off; kubelet and containerd on.
for u in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
         systemd-remount-fs.service systemd-modules-load.service getty.target \
         console-getty.service systemd-networkd.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$stage/etc/systemd/system/$u"
done
mkdir -p "$stage/etc/systemd/system/multi-user.target.wants"
ln -sf /usr/lib/systemd/system/kubelet.service "$stage/etc/systemd/system/multi-user.target.wants/kubelet.service"
ln -sf /lib/systemd/system/containerd.service "$stage/etc/systemd/system/multi-user.target.wants/containerd.service"
ln -sf /etc/systemd/system/bosun-shared-root.service "$stage/etc/systemd/system/multi-user.target.wants/bosun-shared-root.service"
: >"$stage/etc/machine-id"
tar -C "$stage" --numeric-owner -c . | podman import \
  --change 'ENTRYPOINT ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' --change 'ENV container=podman' \
  - "$IMAGE" >>"$LOG" 2>&1 || { echo "cluster node: podman import failed; see $LOG" >&2; exit 1; }
rm -rf "$stage"
# Older node images of this lab are not needed any more (each is about 0.5 GB), except those
# of the other Kubernetes versions built (build.sh's versions/*.env name them).
for old in $(podman images --format '{{.Repository}}:{{.Tag}}'); do
  case "$old" in localhost/bosun-cluster-node:*) ;; *) continue ;; esac
  [ "$old" = "$IMAGE" ] && continue
  grep -qsx "BOSUN_CLUSTER_NODE_IMAGE=$old" "$CACHE"/cluster/versions/*.env && continue
  podman rmi "$old" >/dev/null 2>&1 || true
done
echo "cluster node: image $IMAGE built in $(( $(date +%s) - t0 ))s" >&2
echo "$IMAGE"
