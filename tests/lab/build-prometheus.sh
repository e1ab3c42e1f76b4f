#!/usr/bin/env bash
# Builds the Prometheus server (github.com/prometheus/prometheus/cmd/prometheus) from the
# upstream Go module through the Go module proxy at the pinned version below, and caches it
# under $BOSUN_CACHE_DIR/tools/prometheus-<version>/bin: the reboot alert gate's lab test
# (tests/plugins/tests/e2e_upgrade.rs) runs it with a rule that fires. Rebuilds only what is
# missing; safe to run concurrently. Prints the bin directory on stdout as its last line.
# Exit status 3 means Go is not installed.
#
# Prometheus 3.x is published to the proxy as v0.3MM.P (v0.316.0 is Prometheus 3.16.0). Its
# module has no replace directives, so `go install pkg@version` builds exactly that release
# with its own go.sum. The web UI's assets are not embedded (no `builtinassets` tag): the
# HTTP API, which is all Bosun asks, works without them. A cold build took 3 min 56 s on the
# 2-core development machine (2026-12-05); warm, a re-link.
set -euo pipefail

PROMETHEUS_VERSION="${BOSUN_PROMETHEUS_VERSION:-v0.316.0}"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
OUT="$CACHE/tools/prometheus-$PROMETHEUS_VERSION"
WHAT="prometheus build"
BINS=(prometheus)
NO_GO_HINT="Install Go 1.26 or newer, then run this again."
# shellcheck source=tests/lab/go-build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-common.sh"

# v0.3MM.P → 3.MM.P, for the binary's own --version (stamped as Prometheus' releases do).
human="$PROMETHEUS_VERSION"
if [[ $PROMETHEUS_VERSION =~ ^v0\.3([0-9][0-9])\.([0-9]+)$ ]]; then
  human="3.$((10#${BASH_REMATCH[1]})).${BASH_REMATCH[2]}"
fi
# Into a temporary GOBIN, so that a half-written binary is never taken for a finished one.
tmp="$OUT/tmp-bin"; rm -rf "$tmp"; mkdir -p "$tmp"
pkg="github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
echo "prometheus build: go install $pkg ..." >&2
GOBIN="$tmp" go install -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=$human -X github.com/prometheus/common/version.Revision=$PROMETHEUS_VERSION" "$pkg" >>"$LOG" 2>&1 \
  || fail "building $pkg"
mv "$tmp/prometheus" "$BIN/prometheus"
rm -rf "$tmp"
finished
echo "$BIN"
