#!/usr/bin/env bash
# Builds, as OCI image archives, every image `kubeadm config images list` names for the pinned
# Kubernetes version, from the Go-built binaries (nothing is pulled): kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy (with the node's iptables and conntrack
# and their libraries), etcd, coredns and pause (pause.c, static), plus
# localhost/bosun/busybox:lab (Debian's busybox-static) for test workloads. Each is a
# single-layer image made with umoci; `cluster.sh up` imports them into each node's containerd
# with `ctr -n k8s.io images import --base-name <repository>`.
# Usage: build-images.sh <go bin dir> <node image>. Prints the image directory as its last line.
set -euo pipefail

GOBIN_DIR="$1"
NODE_IMAGE="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=oci.sh
. "$HERE/oci.sh"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
key=$( { sha256sum "$GOBIN_DIR"/* "$HERE/pause.c" "$HERE/build-images.sh" "$HERE/oci.sh"; echo "$NODE_IMAGE"; } \
  | sha256sum | cut -c1-12)
OUT="$CACHE/cluster/images-$key"
mkdir -p "$OUT"
exec 8>"$OUT/.lock"
flock 8
if [ -f "$OUT/images.list" ]; then echo "$OUT"; exit 0; fi
LOG="$OUT/build.log"
: >"$LOG"
t0=$(date +%s)

# The list kubeadm itself wants, e.g. registry.k8s.io/kube-apiserver:v1.34.4.
version=$("$GOBIN_DIR/kubeadm" version -o short)
"$GOBIN_DIR/kubeadm" config images list --kubernetes-version "$version" >"$OUT/wanted.list" 2>>"$LOG" \
  || { echo "cluster images: kubeadm config images list failed; see $LOG" >&2; exit 1; }

# The etcd and CoreDNS binaries must be the versions the tags say (build-go.sh pins them for
# v1.34; another Kubernetes version may want others).
etcd_tag=$(sed -n 's|^registry.k8s.io/etcd:||p' "$OUT/wanted.list")
etcd_have=$("$GOBIN_DIR/etcd" --version | sed -n 's/^etcd Version: //p')
[ "${etcd_tag%-*}" = "$etcd_have" ] || { echo "cluster images: kubeadm $version wants etcd:$etcd_tag but $GOBIN_DIR/etcd is $etcd_have; build it with BOSUN_CLUSTER_ETCD_VERSION=v${etcd_tag%-*} tests/cluster/build-go.sh" >&2; exit 1; }
coredns_tag=$(sed -n 's|^registry.k8s.io/coredns/coredns:||p' "$OUT/wanted.list")
coredns_have=$("$GOBIN_DIR/coredns" -version | sed -n 's/^CoreDNS-/v/p')
[ "$coredns_tag" = "$coredns_have" ] || { echo "cluster images: kubeadm $version wants coredns:$coredns_tag but $GOBIN_DIR/coredns is $coredns_have; build it with BOSUN_COREDNS_VERSION=$coredns_tag tests/cluster/build-go.sh" >&2; exit 1; }

work="$OUT/work"; rm -rf "$work"; mkdir -p "$work"
# mk_image <repository:tag> <entrypoint> <dir whose content becomes the image's />
mk_image() {
  local ref="$1" entry="$2" content="$3"
  local repo="${ref%:*}" tag="${ref##*:}" name
  name=$(basename "$repo")
  oci_archive "$ref" "$content" "$OUT/$name.tar" "$LOG" --config.entrypoint "$entry"
  echo "$repo $tag $name.tar" >>"$OUT/images.list.tmp"
}
: >"$OUT/images.list.tmp"
while read -r ref; do
  repo="${ref%:*}"; name=$(basename "$repo")
  c="$work/$name-content"; mkdir -p "$c/usr/local/bin" "$c/tmp" "$c/etc"
  chmod 1777 "$c/tmp"
  echo 'root:x:0:0:root:/root:/sbin/nologin' >"$c/etc/passwd"
  echo 'nobody:x:65534:65534:nobody:/:/sbin/nologin' >>"$c/etc/passwd"
  case "$name" in
    kube-apiserver|kube-controller-manager|kube-scheduler|etcd)
      cp "$GOBIN_DIR/$name" "$c/usr/local/bin/"
      mk_image "$ref" "/usr/local/bin/$name" "$c" ;;
    kube-proxy)
      cp "$GOBIN_DIR/kube-proxy" "$c/usr/local/bin/"
      # iptables (nft backend, as on the node), conntrack and every library they load, copied
      # out of the node image so both sides use the same iptables.
      podman run --rm --network none --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
        --entrypoint /bin/sh -v "$c:/out" "$NODE_IMAGE" -c '
        set -e
        files="/usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi /usr/sbin/conntrack"
        for f in $files; do
          for l in $(ldd "$f" | awk "/=> \\// {print \$3} /^\t\// {print \$1}"); do mkdir -p "/out$(dirname "$l")"; cp -L "$l" "/out$l"; done
          mkdir -p "/out$(dirname "$f")"; cp "$f" "/out$f"
        done
        mkdir -p /out/usr/lib/x86_64-linux-gnu
        cp -a /usr/lib/x86_64-linux-gnu/xtables /out/usr/lib/x86_64-linux-gnu/
        for l in $(ldd /usr/lib/x86_64-linux-gnu/xtables/*.so | awk "/=> \\// {print \$3}" | sort -u); do
          [ -e "/out$l" ] || { mkdir -p "/out$(dirname "$l")"; cp -L "$l" "/out$l"; }
        done
        cd /out/usr/sbin
        for t in iptables ip6tables; do
          for s in "" -save -restore; do
            ln -sf xtables-nft-multi "$t$s"; ln -sf xtables-nft-multi "$t-nft$s"
            ln -sf xtables-legacy-multi "$t-legacy$s"
          done
        done
        mkdir -p /out/run /out/var/run /out/lib/modules' >>"$LOG" 2>&1 \
        || { echo "cluster images: copying iptables out of $NODE_IMAGE failed; see $LOG" >&2; exit 1; }
      mk_image "$ref" "/usr/local/bin/kube-proxy" "$c" ;;
    coredns)
      cp "$GOBIN_DIR/coredns" "$c/coredns"
      mk_image "$ref" /coredns "$c" ;;
    pause)
      gcc -static -O2 -o "$c/pause" "$HERE/pause.c" >>"$LOG" 2>&1 \
        || { echo "cluster images: compiling pause.c failed; see $LOG" >&2; exit 1; }
      strip "$c/pause"
      mk_image "$ref" /pause "$c" ;;
    *) echo "cluster images: kubeadm wants $ref, which this script cannot build; add it here." >&2; exit 1 ;;
  esac
  rm -rf "$c"
done <"$OUT/wanted.list"
# Not from kubeadm's list: a busybox image for test workloads (shell, httpd, nc, nslookup).
c="$work/busybox-content"; mkdir -p "$c/bin" "$c/tmp" "$c/etc"; chmod 1777 "$c/tmp"
cp /bin/busybox "$c/bin/busybox"
for t in sh httpd nc nslookup sleep cat echo ip hostname; do ln -s busybox "$c/bin/$t"; done
echo 'root:x:0:0:root:/root:/bin/sh' >"$c/etc/passwd"
mk_image "localhost/bosun/busybox:lab" /bin/sh "$c"
rm -rf "$work"
mv "$OUT/images.list.tmp" "$OUT/images.list"
echo "cluster images: built $(wc -l <"$OUT/images.list") images in $(( $(date +%s) - t0 ))s" | tee -a "$LOG" >&2
# Image directories of earlier builds (about 130 MB each; a new node image or binary makes a
# new one) go, except those a built version still names (build.sh's versions/*.env) and any
# touched in the last hour (another cluster's build may not have named its own yet).
for old in "$CACHE"/cluster/images-*; do
  [ -d "$old" ] && [ "$old" != "$OUT" ] || continue
  grep -qsx "BOSUN_CLUSTER_IMAGES=$old" "$CACHE"/cluster/versions/*.env "$CACHE"/cluster/current.env && continue
  [ -n "$(find "$old" -maxdepth 0 -mmin -60)" ] && continue
  rm -rf "$old"
done
echo "$OUT"
