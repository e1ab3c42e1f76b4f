#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v4) from the upstream Go module through the Go module proxy at the
# pinned version below, and caches it under $BOSUN_CACHE_DIR/tools/helm-<version>/bin: the
# chart test (tests/e2e/tests/install.rs) lints and renders deploy/helm/bosun with it.
# Rebuilds only what is missing; safe to run concurrently. Prints the bin directory on stdout
# as its last line. Exit status 3 means Go is not installed.
set -euo pipefail

HELM_VERSION="${BOSUN_HELM_VERSION:-v4.3.2}"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
OUT="$CACHE/tools/helm-$HELM_VERSION"
WHAT="helm build"
BINS=(helm)
NO_GO_HINT="Install Go 1.24 or newer, then run this again."
# shellcheck source=tests/lab/go-build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-common.sh"

# No replace directives in helm's module, so `go install pkg@version` builds exactly the
# pinned release with its own go.sum, into a temporary GOBIN so that a half-written binary is
# never taken for a finished one. The version is stamped as helm's own release builds do.
tmp="$OUT/tmp-bin"; rm -rf "$tmp"; mkdir -p "$tmp"
pkg="helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
echo "helm build: go install $pkg ..." >&2
GOBIN="$tmp" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "$pkg" >>"$LOG" 2>&1 \
  || fail "building $pkg"
mv "$tmp/helm" "$BIN/helm"
rm -rf "$tmp"
finished
echo "$BIN"
