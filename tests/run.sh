#!/usr/bin/env bash
# Runs every Bosun test: unit tests, the plugin host's sandbox tests (which build the test
# plugins for wasm32-wasip2) and the end-to-end tests against the lab's real control plane
# (started, or reused, by the tests themselves through tests/lab).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/bosun/target}"

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

# The lab's etcd / kube-apiserver / kubeadm are built from the upstream Go modules once and
# cached under ~/.cache/bosun/lab; this is a no-op when they exist.
BOSUN_LAB_BIN="$(bash tests/lab/build-binaries.sh | tail -n 1)"
export BOSUN_LAB_BIN

# The end-to-end tests start the lab (or reuse a running one); stop it when this script exits,
# unless it was already running before, so that a test run leaves nothing running.
lab() { cargo run --quiet --locked -p bosun-lab --bin lab -- "$@"; }
if lab status >/dev/null 2>&1; then lab_was_running=1; else lab_was_running=0; fi
trap 'if [ "$lab_was_running" = 0 ]; then lab down || true; fi' EXIT

cargo test --workspace --locked --no-fail-fast "$@"
