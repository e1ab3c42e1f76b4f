#!/usr/bin/env bash
# Installs Bosun on the running real-node cluster lab the way docs/install.md tells a user to,
# with images built here instead of pulled:
#   1. the workspace's binaries and the four first-party plugins (cargo, cached);
#   2. the bosun-controller and bosun-agent images, built by the command docs/install.md gives
#      users (deploy/images/build.sh: static musl release binaries, FROM scratch), imported
#      into every node's containerd;
#   3. a signing key (kept in the lab's state directory), and Bosun installed with Helm
#      (deploy/helm/bosun: deploy/namespace.yaml and the CRDs first, then `helm upgrade
#      --install` with those images and the key as the trust roots);
#   5. the plugins (the first-party ones and the demo's hello) signed and published with the
#      grants of deploy/examples/plugins/ and deploy/examples/plugin-hello.yaml;
#   6. waits until the controller Deployment and the agent DaemonSet are rolled out, and checks
#      the privileges their processes run with (check-bosun-processes.sh).
# Running it again re-does each step (a rebuilt binary is a new image tag and rolls the Pods).
# Environment: as cluster.sh (BOSUN_CLUSTER_NAME, BOSUN_CLUSTER_DIR, BOSUN_CACHE_DIR), and
# CARGO_TARGET_DIR (default ~/.cache/bosun/target, as tests/run.sh). Needs root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
DIR="${BOSUN_CLUSTER_DIR:-$CACHE/cluster-state/$NAME}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
say() { echo "install-bosun: $*" >&2; }
die() { echo "install-bosun: $*" >&2; exit 1; }
t0=$(date +%s)

[ -f "$DIR/kubeconfig" ] || die "cluster '$NAME' is not up (no $DIR/kubeconfig); run tests/cluster/cluster.sh up"
eval "$("$HERE/cluster.sh" env)"

cd "$ROOT"
say "building Bosun's binaries and plugins (cargo, cached in $CARGO_TARGET_DIR)"
cargo build --workspace --locked --bins --quiet
cargo build --locked --release --target wasm32-wasip2 --quiet \
  -p bosun-plugin-certs -p bosun-plugin-kubeadm-upgrade -p bosun-plugin-packages -p bosun-plugin-kubelet -p bosun-plugin-etcd -p bosun-plugin-reboot \
  -p bosun-plugin-hello
BOSUN="$CARGO_TARGET_DIR/debug/kubectl-bosun"

# The images users build (deploy/images/build.sh), tagged by their binaries' content so a
# rebuilt binary rolls the Pods. Their release build has a target directory of its own: .ci/run
# starts it in the background (tests/cluster/ci.sh --build-only) while the test suite's debug
# and plugin builds hold the shared one's locks.
images="$CACHE/cluster/bosun-images"
CARGO_TARGET_DIR="${BOSUN_IMAGES_TARGET_DIR:-$CACHE/target-images}" \
  "$ROOT/deploy/images/build.sh" --content-tag --save "$images" >/dev/null
"$HERE/cluster.sh" import "$images"
tag=$(awk 'NR == 1 {print $2}' "$images/images.list")

state="$DIR/bosun"
mkdir -p "$state/plugins"
if [ ! -f "$state/keys/bosun-signing.key" ]; then
  "$BOSUN" plugin keygen --out "$state/keys" >&2
fi
# Helm, built from the Go module proxy at its pinned version (cached).
helm_bin=$(bash "$ROOT/tests/lab/build-helm.sh" | tail -n 1) || die "building helm (tests/lab/build-helm.sh)"
# As docs/install.md ("With Helm") tells a user: the namespace with its Pod Security labels,
# the CRDs (Helm installs crds/ only on a first install and never upgrades them), then the
# chart, with the images built above and the signing key's public half as the trust roots.
kubectl apply -f "$ROOT/deploy/namespace.yaml" >/dev/null
kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
say "helm upgrade --install bosun deploy/helm/bosun (images localhost/bosun/*:$tag)"
"$helm_bin/helm" upgrade --install bosun "$ROOT/deploy/helm/bosun" -n bosun-system \
  --set image.controller.repository=localhost/bosun/bosun-controller \
  --set image.agent.repository=localhost/bosun/bosun-agent \
  --set image.controller.tag="$tag" --set image.agent.tag="$tag" \
  --set-file 'trustRoots.bosun-signing\.pub'="$state/keys/bosun-signing.pub" \
  >"$state/helm.log" 2>&1 || { cat "$state/helm.log" >&2; die "helm upgrade --install failed"; }

for p in certs kubeadm-upgrade packages kubelet etcd reboot hello; do
  wasm="$state/plugins/$p.wasm"
  cp "$CARGO_TARGET_DIR/wasm32-wasip2/release/bosun_plugin_${p//-/_}.wasm" "$wasm"
  # The grants of the example resource, as docs/plugins-first-party.md extracts them (the
  # demo's hello plugin has its example beside the Operations).
  example="$ROOT/deploy/examples/plugins/$p.yaml"
  [ "$p" != hello ] || example="$ROOT/deploy/examples/plugin-hello.yaml"
  sed -n '/^  grants:/,$p' "$example" | sed '1d; s/^    //' >"$state/plugins/$p-grants.yaml"
  "$BOSUN" plugin sign --key "$state/keys/bosun-signing.key" "$wasm" >/dev/null
  "$BOSUN" plugin publish --grants "$state/plugins/$p-grants.yaml" "$wasm" >&2
done

say "waiting for the controller and the agents to roll out"
kubectl -n bosun-system rollout status deploy/bosun-controller --timeout=180s >&2 \
  || { kubectl -n bosun-system get pods -o wide >&2; die "the controller Deployment did not roll out"; }
kubectl -n bosun-system rollout status ds/bosun-agent --timeout=180s >&2 \
  || { kubectl -n bosun-system get pods -o wide >&2; die "the agent DaemonSet did not roll out"; }
kubectl -n bosun-system get pods -o wide >&2
"$HERE/check-bosun-processes.sh" >&2
# One version: the controller running from the image reports the version and commit of this
# checkout, as the CLI built from it does (the Lease may still hold the previous replica's for
# up to a lease duration after a rollout).
client=$("$BOSUN" version --client | sed -n 's/^Client Version: //p')
for _ in $(seq 60); do
  versions=$("$BOSUN" version)
  grep -qF "Controller Version: $client (Lease bosun-controller, held by " <<<"$versions" && break
  sleep 1
done
echo "$versions" >&2
grep -qF "Controller Version: $client (Lease bosun-controller, held by " <<<"$versions" \
  || die "kubectl bosun version does not show the controller at the client's version $client"
say "Bosun installed in $(( $(date +%s) - t0 ))s"
