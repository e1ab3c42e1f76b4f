#!/usr/bin/env bash
# Builds the two OCI tools the plugin-source tests drive for real, from the upstream Go modules
# through the Go module proxy at the pinned versions below, and caches them under
# $BOSUN_CACHE_DIR/registry/<versions>/bin:
#   crane  (github.com/google/go-containerregistry) - `crane registry serve`, a real OCI
#          distribution registry (in memory) for the loopback tests;
#   oras   (oras.land/oras) - the standard push tool for WASM artifacts.
# Rebuilds only what is missing; safe to run concurrently. Prints the bin directory on stdout
# as its last line. Exit status 3 means Go is not installed.
set -euo pipefail

CRANE_VERSION="${BOSUN_CRANE_VERSION:-v0.22.1}"
ORAS_VERSION="${BOSUN_ORAS_VERSION:-v1.3.6}"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
OUT="$CACHE/registry/crane-$CRANE_VERSION-oras-$ORAS_VERSION"
WHAT="registry tools build"
BINS=(crane oras)
NO_GO_HINT="Install Go 1.24 or newer, then run this again."
# shellcheck source=tests/lab/go-build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-common.sh"

# Neither module has replace directives, so `go install pkg@version` builds exactly the
# pinned release with its own go.sum. GOBIN points at a temporary directory so that a
# half-written binary is never taken for a finished one.
tmp="$OUT/tmp-bin"; rm -rf "$tmp"; mkdir -p "$tmp"
for b in "${missing[@]}"; do
  case "$b" in
    crane) pkg="github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" ;;
    oras) pkg="oras.land/oras/cmd/oras@$ORAS_VERSION" ;;
  esac
  echo "registry tools build: go install $pkg ..." >&2
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$pkg" >>"$LOG" 2>&1 || fail "building $pkg"
  mv "$tmp/$b" "$BIN/$b"
done
rm -rf "$tmp"
finished
echo "$BIN"
