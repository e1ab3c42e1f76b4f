#!/usr/bin/env bash
# The README's "main job": a real Bosun Operation, end to end, on the lab.
#
#  1. brings up the lab: a real control plane (etcd, kube-apiserver, kube-controller-manager
#     built from the upstream Go modules, PKI by kubeadm) with simulated kubeadm nodes;
#  2. installs Bosun's CRDs;
#  3. builds the `hello` plugin for wasm32-wasip2, makes a signing key, signs the plugin and
#     publishes it with `kubectl-bosun plugin publish` (ConfigMap + Plugin with its grants);
#  4. starts bosun-controller and one bosun-agent per node (as processes; logs to files);
#  5. applies deploy/examples/custom.yaml and follows it with `kubectl-bosun status --watch`
#     until it finishes;
#  6. stops the processes it started and leaves the lab running.
#
# Works from a fresh clone: the first run builds the Kubernetes binaries (tens of minutes on
# 2 cores) and the Rust workspace; later runs take about a minute.
#
#   bash tests/lab/demo.sh                      # 4 nodes, 1 control plane
#   bash tests/lab/demo.sh --nodes 6 --control-planes 3
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/bosun/target}"
LAB_DIR="${BOSUN_LAB_DIR:-$HOME/.cache/bosun/lab-state}"
DEMO="$LAB_DIR/demo"
OPERATION=hello-everyone

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Kubernetes binaries (built once into ~/.cache/bosun/lab)"
BOSUN_LAB_BIN="$(bash tests/lab/build-binaries.sh | tail -n 1)"
export BOSUN_LAB_BIN
KUBECTL="$BOSUN_LAB_BIN/kubectl"

step "Bosun binaries and the hello plugin"
# No `--bin`: it would select that binary in every package named, and build only `lab`.
cargo build --quiet --locked -p bosun-lab -p bosun-controller -p bosun-agent -p kubectl-bosun
B="$CARGO_TARGET_DIR/debug"
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
PLUGIN_TARGET="$CARGO_TARGET_DIR/cli-test-plugins"   # shared with the tests
CARGO_TARGET_DIR="$PLUGIN_TARGET" cargo build --quiet --locked --release --target wasm32-wasip2 -p bosun-plugin-hello

step "Lab up"
"$B/lab" up "$@" >/dev/null
eval "$("$B/lab" env)"
"$KUBECTL" get nodes -o wide

step "CRDs"
"$KUBECTL" apply --server-side -f deploy/crds/ >/dev/null
"$KUBECTL" wait --for condition=Established --timeout=60s \
  crd/operations.bosun.dev crd/nodetasks.bosun.dev crd/plugins.bosun.dev crd/policies.bosun.dev

step "Sign and publish the hello plugin"
mkdir -p "$DEMO/keys" "$DEMO/logs"
cp "$PLUGIN_TARGET/wasm32-wasip2/release/bosun_plugin_hello.wasm" "$DEMO/hello.wasm"
[ -f "$DEMO/keys/demo.key" ] || "$B/kubectl-bosun" plugin keygen --out "$DEMO/keys" --stem demo
"$B/kubectl-bosun" plugin sign --key "$DEMO/keys/demo.key" --name hello --version 0.1.0 "$DEMO/hello.wasm"
cat >"$DEMO/hello-grants.yaml" <<'EOF'
# hello reads /etc/os-release and runs `uname -r`: nothing else is reachable.
filesystem:
  - path: /etc
    access: ReadOnly
exec:
  - command: /usr/bin/uname
    args: [["-r"]]
EOF
"$B/kubectl-bosun" plugin publish "$DEMO/hello.wasm" --name hello --version 0.1.0 \
  --namespace bosun-system --grants "$DEMO/hello-grants.yaml"

# Granted commands run chrooted into the node's host root: give each root `uname` and the
# libraries it loads.
mapfile -t NODES < <("$KUBECTL" get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
for n in "${NODES[@]}"; do
  for f in /usr/bin/uname $(ldd /usr/bin/uname | grep -o '/[^ ]*'); do
    mkdir -p "$LAB_DIR/nodes/$n$(dirname "$f")" && cp -f "$f" "$LAB_DIR/nodes/$n$f"
  done
done

step "Start bosun-controller and one bosun-agent per node"
PIDS=()
stop_processes() {
  if [ "${#PIDS[@]}" -gt 0 ]; then
    kill "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
    PIDS=()
  fi
}
trap stop_processes EXIT
trap 'exit 130' INT TERM
BOSUN_LOG=info,kube=warn "$B/bosun-controller" --resync-seconds 5 >"$DEMO/logs/controller.log" 2>&1 &
PIDS+=($!)
for n in "${NODES[@]}"; do
  BOSUN_LOG=info,kube=warn "$B/bosun-agent" --node-name "$n" --host-root "$LAB_DIR/nodes/$n" \
    --trust-root "$DEMO/keys/demo.pub" --plugin-dir "$DEMO/plugins-$n" >"$DEMO/logs/agent-$n.log" 2>&1 &
  PIDS+=($!)
done
echo "controller and ${#NODES[@]} agents running; logs in $DEMO/logs"

step "Apply deploy/examples/custom.yaml"
# A finished Operation never runs again: remove the previous demo's (and, waiting for the
# garbage collector, its NodeTasks) so this run starts fresh.
"$KUBECTL" delete operation "$OPERATION" --ignore-not-found --cascade=foreground --wait=true --timeout=120s
# Bosun runs one Operation per node at a time, and a Blocked, Running or approval-waiting
# task keeps its node until a person resolves it. Another Operation left that way in this
# lab (this controller's, i.e. without a bosun.dev/instance label) would make the demo wait
# for ever: say so and stop, rather than delete anybody's Operation.
HELD="$("$KUBECTL" get nodetasks -l '!bosun.dev/instance' -o jsonpath='{range .items[*]}{.status.phase}{" "}{.spec.nodeName}{" "}{.metadata.labels.bosun\.dev/operation}{"\n"}{end}' \
  | awk '$1 == "Blocked" || $1 == "Running" || $1 == "AwaitingApproval" { print "  " $2 " is held by Operation " $3 " (" $1 ")" }' | sort -u)"
if [ -n "$HELD" ]; then
  cat >&2 <<EOT

Other Operations in this lab still hold nodes the demo needs:
$HELD
Resolve each one (kubectl bosun status NAME, then kubectl bosun skip|retry NAME NODE),
delete it (kubectl delete operation NAME), or start from a clean lab:
  $B/lab down --purge && bash tests/lab/demo.sh
(with: export KUBECONFIG=$KUBECONFIG PATH=$BOSUN_LAB_BIN:$B:\$PATH)
EOT
  exit 1
fi
"$KUBECTL" apply -f deploy/examples/custom.yaml

step "kubectl bosun status $OPERATION --watch   (until it finishes; Ctrl-C stops watching)"
"$B/kubectl-bosun" status "$OPERATION" --watch
PHASE="$("$KUBECTL" get operation "$OPERATION" -o jsonpath='{.status.phase}')"

cat <<EOT

Operation $OPERATION: $PHASE.
  kubectl bosun logs $OPERATION lab-worker-1      # a node's step logs, as its agent reported them
      ($B/kubectl-bosun logs $OPERATION lab-worker-1)
  Process logs: $DEMO/logs/ (controller.log, agent-<node>.log)

The controller and agents are stopped now; the lab keeps running. Next:
  export KUBECONFIG=$KUBECONFIG
  export PATH=$BOSUN_LAB_BIN:$B:\$PATH    # kubectl at the lab's version, kubectl-bosun (kubectl bosun ...)
  kubectl get operations,nodetasks
  kubectl bosun status $OPERATION
  $B/lab down                                # stop the lab (add --purge to forget its state)
EOT
[ "$PHASE" = Succeeded ]
