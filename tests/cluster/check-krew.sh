#!/usr/bin/env bash
# kubectl-bosun installed the krew way, offline, on the running real-node cluster lab, as
# docs/install.md ("With krew") tells a user: deploy/krew/build.sh makes the archive (the
# static binary and the LICENSE) and the manifest with its sha256; krew (built from the Go
# module proxy, tests/lab/build-krew.sh) installs it with `kubectl krew install --manifest
# --archive` into a fresh KREW_ROOT, with no index and no network; then `kubectl bosun
# version`, found by kubectl on PATH as krew put it, shows the client at the workspace's
# version and the running controller at the same one. Prints a summary on stdout; its
# progress on stderr. Environment: as install-bosun.sh. Needs root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
die() { echo "check-krew: $*" >&2; exit 1; }
eval "$("$HERE/cluster.sh" env)"

out="$CACHE/cluster/krew"
archive=$(CARGO_TARGET_DIR="${BOSUN_IMAGES_TARGET_DIR:-$CACHE/target-images}" \
  "$ROOT/deploy/krew/build.sh" --out "$out" | tail -n 1) || die "deploy/krew/build.sh failed"
krew_bin=$(bash "$ROOT/tests/lab/build-krew.sh" | tail -n 1) || die "building krew (tests/lab/build-krew.sh)"

KREW_ROOT=$(mktemp -d)
trap 'rm -rf "$KREW_ROOT"' EXIT
export KREW_ROOT KREW_NO_UPGRADE_CHECK=1
# kubectl finds plugins on PATH: krew itself, then what krew installs.
export PATH="$KREW_ROOT/bin:$krew_bin:$PATH"
kubectl krew install --manifest="$out/bosun.yaml" --archive="$archive" </dev/null >&2 \
  || die "kubectl krew install --manifest=$out/bosun.yaml --archive=$archive failed"
# krew's receipt of the install (`kubectl krew list` would want an index, which needs network).
grep -q "^  name: bosun$" "$KREW_ROOT/receipts/bosun.yaml" 2>/dev/null \
  || die "krew wrote no receipt for bosun ($KREW_ROOT/receipts/bosun.yaml)"
store=$(echo "$KREW_ROOT"/store/bosun/v*)
[ -x "$store/kubectl-bosun" ] && [ -f "$store/LICENSE" ] \
  || die "krew's store $store lacks kubectl-bosun or the LICENSE"
[ "$(readlink -f "$(command -v kubectl-bosun)")" = "$(readlink -f "$store/kubectl-bosun")" ] \
  || die "kubectl-bosun on PATH is not krew's ($(command -v kubectl-bosun))"

versions=$(kubectl bosun version) || die "kubectl bosun version failed"
echo "$versions" >&2
client=$(sed -n 's/^Client Version: //p' <<<"$versions")
[ -n "$client" ] || die "kubectl bosun version printed no client version"
grep -qF "Controller Version: $client (Lease bosun-controller, held by " <<<"$versions" \
  || die "kubectl bosun version (krew's) does not show the controller at the client's version $client"
echo "krew: kubectl krew install --manifest --archive (offline) installed kubectl-bosun $client ($(stat -c %s "$archive") bytes archived); kubectl bosun version shows the controller at the same version"
