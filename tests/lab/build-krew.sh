#!/usr/bin/env bash
# Builds krew (sigs.k8s.io/krew), kubectl's plugin manager, from the upstream Go module through
# the Go module proxy at the pinned version below, and caches it under
# $BOSUN_CACHE_DIR/tools/krew-<version>/bin: the real-node stage installs kubectl-bosun with it
# from deploy/krew/ (tests/cluster/check-krew.sh), offline, as docs/install.md tells users to.
# Rebuilds only what is missing; safe to run concurrently. Prints the bin directory on stdout
# as its last line. Exit status 3 means Go is not installed.
set -euo pipefail

KREW_VERSION="${BOSUN_KREW_VERSION:-v0.4.3}"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
OUT="$CACHE/tools/krew-$KREW_VERSION"
WHAT="krew build"
BINS=(kubectl-krew)
NO_GO_HINT="Install Go 1.24 or newer, then run this again."
# shellcheck source=tests/lab/go-build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-common.sh"

# krew's module has no replace directives, so `go install pkg@version` builds the pinned
# release with its own go.sum, into a temporary GOBIN (a half-written binary is never taken
# for a finished one). The tag is stamped as krew's release builds do. kubectl finds a plugin
# by its file name, so the binary is kubectl-krew.
tmp="$OUT/tmp-bin"; rm -rf "$tmp"; mkdir -p "$tmp"
pkg="sigs.k8s.io/krew/cmd/krew@$KREW_VERSION"
echo "krew build: go install $pkg ..." >&2
GOBIN="$tmp" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/krew/internal/version.gitTag=$KREW_VERSION" "$pkg" >>"$LOG" 2>&1 \
  || fail "building $pkg"
mv "$tmp/krew" "$BIN/kubectl-krew"
rm -rf "$tmp"
finished
echo "$BIN"
