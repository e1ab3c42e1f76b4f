#!/usr/bin/env bash
# Builds every Go binary the real-node cluster lab needs, from the upstream Go modules through the
# Go module proxy at the pinned versions below, and caches them under
# $BOSUN_CACHE_DIR/cluster/k8s-<version>/bin:
#   kubelet kube-scheduler kube-proxy kube-apiserver kube-controller-manager kubeadm kubectl
#       (k8s.io/kubernetes, through the same wrapper module as tests/lab/build-binaries.sh);
#   etcd     (go.etcd.io/etcd/server/v3, at the tag kubeadm's image list names for this version);
#   etcdctl  (go.etcd.io/etcd/etcdctl/v3, the same version, etcd 3.6 and later: the tests' etcd
#            checks);
#   etcdutl  (go.etcd.io/etcd/etcdutl/v3, likewise: what the control planes get for the upgrade's
#            etcd snapshot step, which verifies its snapshot with it);
#   crictl   (sigs.k8s.io/cri-tools; the github.com path is refused by the proxy);
#   coredns  (github.com/coredns/coredns, at the tag kubeadm's image list names).
# Binaries the simulated lab already built at the same Kubernetes version and with the same flags
# are copied from its cache instead of relinked, and so is its etcd when it is the same release. Rebuilds only what is missing; safe to run
# concurrently. Prints the bin directory on stdout as its last line. Exit status 3: no Go.
set -euo pipefail

K8S_VERSION="${BOSUN_K8S_VERSION:-v1.34.4}"
# The versions `kubeadm config images list --kubernetes-version v1.34.4` names.
ETCD_VERSION="${BOSUN_CLUSTER_ETCD_VERSION:-v3.6.5}"
COREDNS_VERSION="${BOSUN_COREDNS_VERSION:-v1.12.1}"
CRICTL_VERSION="${BOSUN_CRICTL_VERSION:-v1.34.0}"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
OUT="$CACHE/cluster/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-coredns-$COREDNS_VERSION-crictl-$CRICTL_VERSION"
K8S_BINS=(kubelet kube-scheduler kube-proxy kube-apiserver kube-controller-manager kubeadm kubectl)
WHAT="cluster build"
BINS=("${K8S_BINS[@]}" etcd crictl coredns)
# etcdctl for the tests' etcd checks, built with the etcd of the versions the tests upgrade to:
# the module proxy serves etcdctl v3.6 but not v3.5.24 (403), so an etcd 3.5 build has none.
# etcdutl beside it: what an administrator installs on control planes for the upgrade's etcd
# snapshot step (etcdctl takes the snapshot, etcdutl verifies it; docs/operations.md).
case "$ETCD_VERSION" in v3.5.*) ;; *) BINS+=(etcdctl etcdutl) ;; esac
NO_GO_HINT="Install Go 1.24 or newer (the cluster lab builds Kubernetes, etcd, crictl and CoreDNS from source), then run this again."
# shellcheck source=tests/lab/go-build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lab/go-build-common.sh"
mkdir -p "$OUT/src"

# Reuse the simulated lab's control-plane binaries of the same Kubernetes version.
for lab_bin in "$CACHE"/lab/k8s-"$K8S_VERSION"-etcd-*/bin; do
  [ -d "$lab_bin" ] || continue
  for b in kube-apiserver kube-controller-manager kubeadm kubectl; do
    if [ ! -x "$BIN/$b" ] && [ -x "$lab_bin/$b" ]; then
      cp "$lab_bin/$b" "$BIN/$b.tmp" && mv "$BIN/$b.tmp" "$BIN/$b"
      echo "cluster build: $b copied from $lab_bin" >>"$LOG"
    fi
  done
done
# And its etcd, when the lab built the release this Kubernetes version's kubeadm names (same flags).
for lab_etcd in "$CACHE"/lab/k8s-*-etcd-"$ETCD_VERSION"/bin/etcd; do
  if [ ! -x "$BIN/etcd" ] && [ -x "$lab_etcd" ]; then
    cp "$lab_etcd" "$BIN/etcd.tmp" && mv "$BIN/etcd.tmp" "$BIN/etcd"
    echo "cluster build: etcd copied from $lab_etcd" >>"$LOG"
  fi
done
list_missing
if [ ${#missing[@]} -eq 0 ]; then finished; echo "$BIN"; exit 0; fi

echo "cluster build: building ${missing[*]}; log: $LOG" >&2
needs_k8s=0
for b in "${missing[@]}"; do
  for k in "${K8S_BINS[@]}"; do [ "$b" = "$k" ] && needs_k8s=1; done
done

# A wrapper module requiring $1@$2 that pins every sibling module the upstream go.mod replaces
# with a relative path ($3: the regex of those lines) to version $4; $5: the packages to import.
wrapper_module() {
  local dir="$1" mod="$2" ver="$3" rel="$4" pin="$5"; shift 5
  mkdir -p "$dir"
  go mod download -json "$mod@$ver" >"$dir/download.json" 2>>"$LOG" \
    || { cat "$dir/download.json" >>"$LOG"; fail "downloading $mod@$ver"; }
  local upstream_mod
  upstream_mod=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$dir/download.json")
  {
    echo "module bosun.dev/cluster/$(basename "$dir")"
    echo
    grep -E '^go [0-9]' "$upstream_mod"
    grep -E '^godebug ' "$upstream_mod" || true
    echo
    echo "require $mod $ver"
    echo
    echo "replace ("
    # etcd 3.5's client/v2 module is versioned v2.3MM.P for etcd v3.MM.P (v3.5.24: v2.305.24).
    grep -E "=> $rel" "$upstream_mod" | awk -v v="$pin" '{
      ver = v
      if ($1 ~ /\/v2$/ && v ~ /^v3\.[0-9]+\.[0-9]+$/) { split(substr(v, 2), p, "."); ver = sprintf("v2.3%02d.%s", p[2], p[3]) }
      print "\t" $1 " => " $1 " " ver
    }'
    echo ")"
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$dir/tools.go"
  (cd "$dir" && go mod tidy -e) >>"$LOG" 2>&1 || fail "resolving the module graph of $mod@$ver"
}

if [ $needs_k8s = 1 ]; then
  src="$OUT/src/kubernetes"
  pkgs=(); for b in "${K8S_BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  staging=$(echo "$K8S_VERSION" | sed -E 's/^v1\.([0-9]+)\.([0-9]+).*/v0.\1.\2/')
  wrapper_module "$src" k8s.io/kubernetes "$K8S_VERSION" '\./staging/' "$staging" "${pkgs[@]}"
  kminor=$(echo "$K8S_VERSION" | sed -E 's/^v1\.([0-9]+).*/\1/')
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kminor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${missing[@]}"; do
    case " ${K8S_BINS[*]} " in *" $b "*) ;; *) continue ;; esac
    echo "cluster build: go build $b ..." >&2
    t0=$(date +%s)
    (cd "$src" && go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b") >>"$LOG" 2>&1 || fail "building $b"
    mv "$BIN/$b.tmp" "$BIN/$b"
    echo "cluster build: $b took $(( $(date +%s) - t0 ))s" >>"$LOG"
  done
fi

for b in "${missing[@]}"; do
  t0=$(date +%s)
  case "$b" in
    etcd)
      src="$OUT/src/etcd"
      wrapper_module "$src" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" '\.\./' "$ETCD_VERSION" go.etcd.io/etcd/server/v3
      echo "cluster build: go build etcd $ETCD_VERSION ..." >&2
      (cd "$src" && go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3) >>"$LOG" 2>&1 || fail "building etcd"
      mv "$BIN/etcd.tmp" "$BIN/etcd" ;;
    etcdctl|etcdutl)
      # etcd's own client (the test's checks of a stacked etcd cluster; the upgrade's etcd
      # steps) and its offline tool (`snapshot status` verifies a snapshot, `snapshot restore`
      # restores it): go.etcd.io/etcd/<name>/v3, each in a wrapper module of its own.
      src="$OUT/src/$b"
      wrapper_module "$src" "go.etcd.io/etcd/$b/v3" "$ETCD_VERSION" '\.\./' "$ETCD_VERSION" "go.etcd.io/etcd/$b/v3"
      echo "cluster build: go build $b $ETCD_VERSION ..." >&2
      (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$BIN/$b.tmp" "go.etcd.io/etcd/$b/v3") >>"$LOG" 2>&1 || fail "building $b"
      mv "$BIN/$b.tmp" "$BIN/$b" ;;
    crictl|coredns)
      # crictl's version is set at link time, as its Makefile does (else it says "unknown").
      if [ "$b" = crictl ]; then
        pkg="sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
        ld="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
      else
        pkg="github.com/coredns/coredns@$COREDNS_VERSION"; ld="-s -w"
      fi
      tmp="$OUT/tmp-bin-$b"; rm -rf "$tmp"; mkdir -p "$tmp"
      echo "cluster build: go install $pkg ..." >&2
      GOBIN="$tmp" go install -trimpath -ldflags "$ld" "$pkg" >>"$LOG" 2>&1 || fail "building $pkg"
      mv "$tmp/$b" "$BIN/$b"; rm -rf "$tmp" ;;
    *) continue ;;
  esac
  echo "cluster build: $b took $(( $(date +%s) - t0 ))s" >>"$LOG"
done
finished
echo "$BIN"
