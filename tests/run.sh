#!/usr/bin/env bash
# Runs every Bosun test: unit tests, the plugin host's sandbox tests (which build the test
# plugins for wasm32-wasip2) and the end-to-end tests against the lab's real control plane
# (started, or reused, by the tests themselves through tests/lab).
#
# Works on a brand-new machine: it installs the host tools the tests drive (as root), adds
# the wasm32-wasip2 target, builds the lab's Kubernetes binaries and Bosun's binaries, then
# tests. Arguments go to `cargo test` (e.g. `-p bosun-host`, `--test host`).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/bosun/target}"

# Host tools the tests drive for real: dpkg-deb/apt (apt backend test), and Debian's dnf,
# its versionlock plugin, rpm/rpmbuild and createrepo_c (dnf backend test, which builds an
# RPM repository and runs dnf chrooted into a Rocky node root). Installed once; a no-op after.
need=()
for pkg in dpkg apt dnf dnf-plugins-core rpm createrepo-c; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing test tools from Debian's packages: ${need[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
  else
    echo "warning: the package-backend tests need Debian packages that are missing: ${need[*]}" >&2
    echo "         install them as root (apt-get install ${need[*]}); those tests fail naming them otherwise" >&2
  fi
fi

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

# The lab's etcd / kube-apiserver / kubeadm are built from the upstream Go modules once and
# cached under ~/.cache/bosun/lab; this is a no-op when they exist.
BOSUN_LAB_BIN="$(bash tests/lab/build-binaries.sh | tail -n 1)"
export BOSUN_LAB_BIN

# helm, for the chart test, and Prometheus, for the reboot alert gate's test (each from the Go
# module proxy, pinned, cached: tests/lab/build-helm.sh, build-prometheus.sh): a few minutes of
# Go each on a new machine, so they build in the background, one after the other, beside the
# Cargo builds below; a test waits for its tool (the script's lock) if it is not done.
mkdir -p "$HOME/.cache/bosun"
{
  bash tests/lab/build-helm.sh >"$HOME/.cache/bosun/helm-build.log" 2>&1 || true
  bash tests/lab/build-prometheus.sh >"$HOME/.cache/bosun/prometheus-build.log" 2>&1 || true
} &
helm_build=$!

# The end-to-end tests start the lab (or reuse a running one); stop it when this script exits,
# unless it was already running before, so that a test run leaves nothing running.
lab() { cargo run --quiet --locked -p bosun-lab --bin lab -- "$@"; }
if lab status >/dev/null 2>&1; then lab_was_running=1; else lab_was_running=0; fi
# (And the helm build is waited for: nothing this script started outlives it.)
trap 'wait "$helm_build" || true; if [ "$lab_was_running" = 0 ]; then lab down || true; fi' EXIT

# The end-to-end tests run the controller, agent, CLI and lab binaries and refuse stale ones.
# `cargo test` alone builds only the binaries of crates that have integration tests; build
# every binary explicitly so the run never depends on what an earlier command left behind.
cargo build --workspace --locked --bins

cargo test --workspace --locked --no-fail-fast "$@"
