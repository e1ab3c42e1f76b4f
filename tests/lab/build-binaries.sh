#!/usr/bin/env bash
# Builds the lab's real control-plane binaries (etcd, kube-apiserver, kubeadm, kubectl,
# kube-controller-manager) from the upstream Go modules through the Go module proxy, at the
# pinned versions below, and caches them under $BOSUN_CACHE_DIR/lab/<versions>/bin.
# Rebuilds only what is missing. Prints the bin directory on stdout as its last line.
#
# Why a wrapper module: `go install pkg@version` refuses modules with replace directives, and
# k8s.io/kubernetes replaces each staging module with ./staging/...; replace lines only apply in
# the main module, so the wrapper carries one replace per staging module at its v0.Y.Z release.
set -euo pipefail

K8S_VERSION="${BOSUN_K8S_VERSION:-v1.34.4}"
# etcd: the release kubeadm v1.34 names for its etcd image (`kubeadm config images list`), so the
# real-node cluster's build (tests/cluster/build-go.sh) copies this binary instead of building
# etcd a second time on a new machine.
ETCD_VERSION="${BOSUN_ETCD_VERSION:-v3.6.5}"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
OUT="$CACHE/lab/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
K8S_BINS=(kube-apiserver kubeadm kubectl kube-controller-manager)
WHAT="lab build"
BINS=(etcd "${K8S_BINS[@]}")
NO_GO_HINT="Install Go 1.24 or newer (the lab builds etcd and Kubernetes from source), then run this again."
# shellcheck source=tests/lab/go-build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-common.sh"
mkdir -p "$OUT/src"

echo "lab build: building ${missing[*]} (k8s $K8S_VERSION, etcd $ETCD_VERSION); log: $LOG" >&2
needs_k8s=0
for b in "${missing[@]}"; do [ "$b" != etcd ] && needs_k8s=1; done

if [ $needs_k8s = 1 ]; then
  src="$OUT/src/kubernetes"; mkdir -p "$src"
  # -json reports errors on stdout: keep them in the log too.
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >"$src/download.json" 2>>"$LOG" \
    || { cat "$src/download.json" >>"$LOG"; fail "downloading k8s.io/kubernetes@$K8S_VERSION"; }
  upstream_mod=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$src/download.json")
  minor=$(echo "$K8S_VERSION" | sed -E 's/^v1\.([0-9]+)\.([0-9]+).*/0.\1.\2/')
  {
    echo "module bosun.dev/lab/kubernetes"
    echo
    grep -E '^go [0-9]' "$upstream_mod"
    grep -E '^godebug ' "$upstream_mod" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    grep -E '=> \./staging/' "$upstream_mod" | awk -v v="v$minor" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$src/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for b in "${K8S_BINS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
    echo ")"
  } >"$src/tools.go"
  (cd "$src" && go mod tidy -e) >>"$LOG" 2>&1 || fail "resolving the Kubernetes module graph"
  major=1; kminor=$(echo "$K8S_VERSION" | sed -E 's/^v1\.([0-9]+).*/\1/')
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$kminor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${missing[@]}"; do
    [ "$b" = etcd ] && continue
    echo "lab build: go build $b ..." >&2
    (cd "$src" && go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b") >>"$LOG" 2>&1 || fail "building $b"
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
fi

if [[ " ${missing[*]} " == *" etcd "* ]]; then
  src="$OUT/src/etcd"; mkdir -p "$src"
  go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >"$src/download.json" 2>>"$LOG" \
    || { cat "$src/download.json" >>"$LOG"; fail "downloading etcd $ETCD_VERSION"; }
  upstream_mod=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$src/download.json")
  {
    echo "module bosun.dev/lab/etcd"
    echo
    grep -E '^go [0-9]' "$upstream_mod"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo
    # the server module replaces its sibling etcd modules with ../; pin them to the same release
    echo "replace ("
    grep -E '=> \.\./' "$upstream_mod" | awk -v v="$ETCD_VERSION" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$src/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$src/tools.go"
  (cd "$src" && go mod tidy -e) >>"$LOG" 2>&1 || fail "resolving the etcd module graph"
  echo "lab build: go build etcd ..." >&2
  (cd "$src" && go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3) >>"$LOG" 2>&1 || fail "building etcd"
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi
finished
echo "$BIN"
