#!/usr/bin/env bash
# Builds everything the real-node cluster lab needs, cached under
# ${BOSUN_CACHE_DIR:-~/.cache/bosun}/cluster/:
#   1. host packages (podman, runc, debootstrap, umoci, CNI plugins, iptables, ...) with apt-get
#      when missing (root only);
#   2. the Go binaries (build-go.sh): Kubernetes, etcd, crictl, CoreDNS at pinned versions;
#   3. kubeadm/kubelet/kubectl/cri-tools .debs and a flat apt repository (build-debs.sh);
#   4. the node image (build-node.sh): Debian minbase + systemd + containerd + runc + the .debs;
#   5. the control-plane/addon images kubeadm wants (build-images.sh), as OCI archives.
# Each step rebuilds only what is missing. Writes the results to
# $BOSUN_CACHE_DIR/cluster/current.env (sourced by cluster.sh) and to versions/<version>.env,
# and prints them (`build.sh --packages-only`: step 1 alone). Another Kubernetes version: BOSUN_K8S_VERSION, with the etcd and CoreDNS
# versions its kubeadm names (build-images.sh says which when they differ), e.g.
#   BOSUN_K8S_VERSION=v1.33.13 BOSUN_CLUSTER_ETCD_VERSION=v3.5.24 BOSUN_COREDNS_VERSION=v1.12.0 build.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
t0=$(date +%s)

need=()
for pair in podman:podman runc:runc debootstrap:debootstrap umoci:umoci \
            /usr/lib/cni/bridge:containernetworking-plugins iptables:iptables \
            openssl:openssl gcc:gcc /bin/busybox:busybox-static dpkg-deb:dpkg dpkg-scanpackages:dpkg-dev flock:util-linux \
            haproxy:haproxy curl:curl python3:python3 \
            musl-gcc:musl-tools strip:binutils /etc/ssl/certs/ca-certificates.crt:ca-certificates; do
  tool="${pair%%:*}"; pkg="${pair#*:}"
  if [ "${tool#/}" != "$tool" ]; then [ -e "$tool" ] || need+=("$pkg")
  else command -v "$tool" >/dev/null 2>&1 || need+=("$pkg"); fi
done
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "cluster build: missing host packages ${need[*]}; the cluster lab runs as root (privileged node containers). Run this as root, or: apt-get install ${need[*]}" >&2
    exit 1
  fi
  echo "cluster build: apt-get install ${need[*]}" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi
# --packages-only: stop here (.ci/run installs them before it starts the builds in the
# background, so that no two apt-get runs wait for each other's lock).
if [ "${1:-}" = --packages-only ]; then exit 0; fi

gobin=$("$HERE/build-go.sh" | tail -n1)
repo=$("$HERE/build-debs.sh" "$gobin" | tail -n1)
node_image=$("$HERE/build-node.sh" "$gobin" "$repo" | tail -n1)
images=$("$HERE/build-images.sh" "$gobin" "$node_image" | tail -n1)
version=$("$gobin/kubeadm" version -o short)
mkdir -p "$CACHE/cluster"
cat >"$CACHE/cluster/current.env.tmp" <<ENV
BOSUN_CLUSTER_VERSION=$version
BOSUN_CLUSTER_BIN=$gobin
BOSUN_CLUSTER_NODE_IMAGE=$node_image
BOSUN_CLUSTER_IMAGES=$images
BOSUN_CLUSTER_APT=$repo
ENV
# Every version built keeps its own file (cluster.sh up --version, load-images); the last
# build is the default.
mkdir -p "$CACHE/cluster/versions"
cp "$CACHE/cluster/current.env.tmp" "$CACHE/cluster/versions/$version.env"
mv "$CACHE/cluster/current.env.tmp" "$CACHE/cluster/current.env"
echo "cluster build: done in $(( $(date +%s) - t0 ))s" >&2
cat "$CACHE/cluster/current.env"
