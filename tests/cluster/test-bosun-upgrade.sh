#!/usr/bin/env bash
# A real Kubernetes upgrade carried out by Bosun on the real-node cluster lab, end to end:
#   1. `cluster.sh up --version FROM` (1 control plane and 1 worker; BOSUN_CLUSTER_CPS=2 for
#      two control planes), TO's images loaded into the nodes (nothing can be pulled here);
#   2. Bosun installed as a user does (install-bosun.sh: images, `kubectl apply -k deploy/`,
#      trust roots, the first-party plugins signed and published with the example grants);
#   3. a workload of 2 replicas held by a PodDisruptionBudget (minAvailable 1), so each
#      drain waits for a replacement to be Ready elsewhere;
#   4. `kubectl apply` of an upgrade Operation FROM -> TO (packages kubeadm, kubelet, kubectl
#      through the node's real apt from the lab repository; `kubeadm upgrade apply` on the
#      first control plane, `kubeadm upgrade node` elsewhere; drain; the kubelet restarted
#      through the node's systemd; uncordon; health gates), then waits for it to end;
#   5. checks: the Operation Succeeded; the API server and every kubelet at TO; the static
#      Pods on TO images; kubeadm/kubelet/kubectl packages at TO on every node; `kubeadm
#      upgrade plan` has nothing left to apply; the workload Running again; `kubectl bosun
#      status` shows every node's kubelet before -> after;
#   6. prints each node's wall time and Bosun's own share of it (see docs/benchmarks.md), then
#      `down` and `check-clean`.
# Usage: test-bosun-upgrade.sh [FROM [TO]]   (default v1.33.13 v1.34.4; both built with
# tests/cluster/build.sh, see its header). BOSUN_KEEP_CLUSTER=1 leaves the cluster up. Needs root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="$HERE/cluster.sh"
FROM="${1:-v1.33.13}"
TO="${2:-v1.34.4}"
CPS="${BOSUN_CLUSTER_CPS:-1}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
OP="upgrade-${TO//./-}"
LOG="$(mktemp -d)/bosun-upgrade.log"
t=$(date +%s)
phase() { local now; now=$(date +%s); echo "test-bosun-upgrade: $1 in $((now - t))s"; t=$now; }
diagnose() {
  {
    echo "--- kubectl bosun status $OP"; kubectl-bosun status "$OP" || true
    echo "--- pods"; kubectl get pods -A -o wide || true
    echo "--- agent logs (last 40 lines each)"
    for p in $(kubectl -n bosun-system get pods -l app.kubernetes.io/name=bosun-agent -o name 2>/dev/null); do
      echo "$p:"; kubectl -n bosun-system logs "$p" --tail=40 || true
    done
    echo "--- controller log (last 40 lines)"
    kubectl -n bosun-system logs deploy/bosun-controller --tail=40 || true
  } >>"$LOG" 2>&1
}
fail() {
  echo "test-bosun-upgrade: FAIL: $*" >&2
  diagnose
  echo "test-bosun-upgrade: diagnostics in $LOG" >&2
  [ "${BOSUN_KEEP_CLUSTER:-0}" = 1 ] || "$C" down >&2 || true
  exit 1
}
echo "test-bosun-upgrade: $FROM -> $TO ($CPS control plane(s), 1 worker); log: $LOG"

"$C" up --version "$FROM" --control-planes "$CPS" --workers 1 >>"$LOG" 2>&1 \
  || { tail -n 20 "$LOG" >&2; fail "cluster.sh up --version $FROM"; }
eval "$("$C" env)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/bosun/target}"
kubectl-bosun() { "$CARGO_TARGET_DIR/debug/kubectl-bosun" "$@"; }
server_version() { kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n1; }
[ "$(server_version)" = "$FROM" ] || fail "the API server is not at $FROM after up"
mapfile -t NODES <"${BOSUN_CLUSTER_DIR:-$HOME/.cache/bosun/cluster-state/$NAME}/nodes.list"
phase "up at $FROM"
"$HERE/install-bosun.sh" >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; fail "install-bosun.sh"; }
phase "Bosun installed"
"$C" load-images "$TO" >>"$LOG" 2>&1 || fail "cluster.sh load-images $TO"
phase "images of $TO loaded"

# The workload: 2 replicas that may run anywhere (the control plane too, so a drained worker's
# pods have somewhere to go), and a PodDisruptionBudget that lets only one go at a time.
kubectl apply -f - >>"$LOG" 2>&1 <<'YAML' || fail "creating the workload"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: localhost/bosun/busybox:lab
          imagePullPolicy: Never
          command: [httpd, -f, -p, "8080"]
          readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 2}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
YAML
kubectl rollout status deploy/web --timeout=120s >>"$LOG" 2>&1 || fail "the workload did not become Ready"

before_pkgs=""
for n in "${NODES[@]}"; do
  before_pkgs+="$n: $(podman exec "$n" dpkg-query -W -f='${Package}=${Version} ' kubeadm kubelet kubectl)"$'\n'
done

kubectl apply -f - >>"$LOG" 2>&1 <<YAML || fail "creating the upgrade Operation"
apiVersion: bosun.dev/v1alpha1
kind: Operation
metadata:
  name: $OP
spec:
  upgrade:
    kubernetesVersion: $TO
    packages: [kubeadm, kubelet, kubectl]
  rollout:
    maxUnavailable: 1
  healthGates:
    nodeReady: true
    apiServer: true
    settleSeconds: 5
  drain:
    timeoutSeconds: 600
YAML
t_op=$(date +%s)
phase_now=""
deadline=$(( t_op + ${BOSUN_UPGRADE_TIMEOUT:-1800} ))
while :; do
  phase_now=$(kubectl get operation "$OP" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  case "$phase_now" in
    Succeeded) break ;;
    Failed|Blocked) fail "the Operation is $phase_now" ;;
  esac
  # A Blocked node task shows as the Operation's condition before its phase: check the tasks.
  if kubectl get nodetasks -l "bosun.dev/operation=$OP" -o jsonpath='{.items[*].status.phase}' 2>/dev/null | grep -q Blocked; then
    fail "a NodeTask of $OP is Blocked"
  fi
  [ "$(date +%s)" -lt "$deadline" ] || fail "the Operation did not end within ${BOSUN_UPGRADE_TIMEOUT:-1800}s (phase '$phase_now')"
  sleep 5
done
op_s=$(( $(date +%s) - t_op ))
phase "upgrade Operation $OP Succeeded"

# Checks, from the cluster's own point of view.
server=$(server_version)
[ "$server" = "$TO" ] || fail "the API server reports $server, expected $TO"
"$C" check-nodes "$TO" || fail "the nodes are not all Ready at $TO"
for n in "${NODES[@]}"; do
  case "$n" in *-cp*) ;; *) continue ;; esac
  for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
    img=$(kubectl -n kube-system get pod "$c-$n" -o jsonpath='{.spec.containers[0].image}')
    case "$c" in
      etcd) [ -n "$img" ] || fail "no etcd static Pod on $n" ;;
      *) [ "${img##*:}" = "$TO" ] || fail "static Pod $c-$n runs $img, expected tag $TO" ;;
    esac
  done
done
after_pkgs=""
for n in "${NODES[@]}"; do
  pkgs=$(podman exec "$n" dpkg-query -W -f='${Package}=${Version} ' kubeadm kubelet kubectl)
  after_pkgs+="$n: $pkgs"$'\n'
  for p in kubeadm kubelet kubectl; do
    [[ " $pkgs" == *" $p=${TO#v}-"* ]] || fail "$n: package $p is not at ${TO#v} ($pkgs)"
  done
done
plan=$(podman exec "${NODES[0]}" kubeadm upgrade plan 2>&1) || true
echo "$plan" >>"$LOG"
if grep -q "kubeadm upgrade apply v" <<<"$plan"; then
  fail "kubeadm upgrade plan still proposes an upgrade: $(grep 'kubeadm upgrade apply v' <<<"$plan")"
fi
kubectl rollout status deploy/web --timeout=120s >>"$LOG" 2>&1 || fail "the workload is not Ready again"
[ "$(kubectl get deploy web -o jsonpath='{.status.readyReplicas}')" = 2 ] || fail "the workload has not 2 Ready replicas"
status=$(kubectl-bosun status "$OP")
echo "$status"
for n in "${NODES[@]}"; do
  grep -q "$n .*Succeeded" <<<"$status" || fail "kubectl bosun status does not show $n Succeeded"
done
grep -q "kubelet $FROM → $TO" <<<"$status" || fail "kubectl bosun status does not show the kubelet before → after"
[ "$(grep -c "kubelet $FROM → $TO" <<<"$status")" = "${#NODES[@]}" ] \
  || fail "kubectl bosun status shows the kubelet before → after for $(grep -c "kubelet $FROM → $TO" <<<"$status") of ${#NODES[@]} nodes"
echo "packages before:"; printf '%s' "$before_pkgs"
echo "packages after:"; printf '%s' "$after_pkgs"

# Timings: each node's task wall time, and Bosun's share of it (see docs/benchmarks.md).
"$HERE/bosun-share.sh" "$OP" || fail "bosun-share.sh $OP"
echo "operation wall time: ${op_s}s"
# shellcheck disable=SC2046
podman stats --no-stream --format '{{.Name}} {{.MemUsage}}' $(podman ps -q --filter "label=bosun.cluster=$NAME")
if [ "${BOSUN_KEEP_CLUSTER:-0}" != 1 ]; then
  "$C" down >>"$LOG" 2>&1 || fail "cluster.sh down"
  "$C" check-clean || exit 1
  phase "down"
fi
echo "test-bosun-upgrade: PASS ($FROM -> $TO)"
