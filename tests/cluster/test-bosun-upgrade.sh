#!/usr/bin/env bash
# A real Kubernetes upgrade carried out by Bosun on the real-node cluster lab, end to end:
#   1. `cluster.sh up --version FROM` (3 control planes with stacked etcd behind haproxy, and 1
#      worker; BOSUN_CLUSTER_CPS=1 for a quick run), TO's images loaded into the nodes (nothing
#      can be pulled here);
#   2. Bosun installed as a user does (install-bosun.sh: images, `helm install` of
#      deploy/helm/bosun with the trust roots, the first-party plugins signed and published
#      with the example grants); kubectl-bosun installed with krew from deploy/krew, offline
#      (check-krew.sh), shows the client's and the running controller's version;
#   2b. `bosun-agent self-test` in every agent Pod: the kernel boundary of granted commands
#      (Landlock, seccomp) holds as deployed; then the demo's Operation
#      (deploy/examples/custom.yaml, the hello plugin) succeeds on every real Debian node;
#   3. a workload of 2 replicas held by a PodDisruptionBudget (minAvailable 1), so each
#      drain waits for a replacement to be Ready elsewhere;
#   4. policy deny (BOSUN_TEST_DENY=1, the default): a step Policy freezes upgrades; the
#      upgrade Operation blocks PolicyDenied on the first node before any plugin step, and no
#      package or static Pod image changed on any node; the Policy is deleted and the node
#      retried (`kubectl bosun retry`);
#   5. the upgrade Operation FROM -> TO (packages kubeadm, kubelet, kubectl through the node's
#      real apt from the lab repository; `kubeadm upgrade apply` on the first control plane,
#      `kubeadm upgrade node` elsewhere; drain; the kubelet restarted through the node's
#      systemd; uncordon; health gates) runs to the end. Agent killed (BOSUN_TEST_KILL=1, the
#      default): 3 s (BOSUN_TEST_KILL_AFTER) into `kubeadm upgrade apply` the control plane's agent Pod is deleted;
#      the DaemonSet brings a new one, which runs the step again (the plugin declares it
#      idempotent: attempt 2), or the task blocks Interrupted and is retried once;
#      Bosun upgraded mid-Operation (BOSUN_TEST_SELF_UPGRADE=1, the default): once the first
#      control plane's task has Succeeded, `helm upgrade` to a rebuilt image with a new tag;
#      the controller and every agent roll, and after the Operation the NodeTasks are the same
#      objects (names and UIDs) and no step ran more than once (but the killed one);
#   5. checks: the Operation Succeeded; the API server and every kubelet at TO; the static
#      Pods and kube-proxy's DaemonSet on TO images; kubeadm/kubelet/kubectl packages at TO on every node; `kubeadm
#      upgrade plan` has nothing left to apply; the workload Running again; `kubectl bosun
#      status` shows every node's kubelet before -> after;
#   7. prints each node's wall time and Bosun's own share of it (see docs/benchmarks.md);
#   8. certificate renewal (BOSUN_TEST_RENEW=1, the default): a renewCertificates Operation
#      renews every certificate and restarts the control plane through the kubelet; the API
#      server then serves the new certificate (the serial `openssl s_client` reads equals the
#      file's, and differs from the old one) and `kubeadm certs check-expiration` agrees with
#      the file's expiry;
#   9. a reboot (BOSUN_TEST_REBOOT=1, the default, with BOSUN_TEST_VIA=lifecycle): the
#      ClusterLifecycle, set to `reboots: {when: Required}` with a blocking-pod selector,
#      generates one reboot Operation for the worker that needs one; a matching Pod on it holds
#      the reboot until it is deleted; then its node container restarts for real and its agent
#      finishes the step with the new boot; the application is measured meanwhile; then
#      `down` and `check-clean`.
# BOSUN_TEST_VIA=lifecycle (the default) asks for the upgrade and the renewal the declarative
# way (docs/lifecycle.md): after the install the test requires the ClusterLifecycle `cluster`
# the controller adopted from kubeadm-config (at FROM, autoRenew off, InSync) and no Operation
# started; then it sets `spec.kubernetesVersion: TO` and takes the Operation the controller
# generates as the upgrade, and bumps `spec.certificates.rotation` for the renewal; at the end
# the ClusterLifecycle must be InSync at TO. BOSUN_TEST_VIA=operation applies both Operations
# by hand instead.
# BOSUN_TEST_DENY=0 BOSUN_TEST_KILL=0 BOSUN_TEST_RENEW=0 is the plain upgrade whose timings
# docs/benchmarks.md reports.
# Usage: test-bosun-upgrade.sh [FROM [TO]]   (default v1.33.13 v1.34.4; both built with
# tests/cluster/build.sh, see its header). BOSUN_KEEP_CLUSTER=1 leaves the cluster up. Needs root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="$HERE/cluster.sh"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
FROM="${1:-v1.33.13}"
TO="${2:-v1.34.4}"
CPS="${BOSUN_CLUSTER_CPS:-3}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
OP="upgrade-${TO//./-}"
VIA="${BOSUN_TEST_VIA:-lifecycle}"
case "$VIA" in lifecycle|operation) ;; *) echo "BOSUN_TEST_VIA must be lifecycle or operation, not '$VIA'" >&2; exit 2 ;; esac
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
# kubectl-bosun as krew installs it, offline, from deploy/krew (the static binary's archive
# and the manifest with its digest), then `kubectl bosun version` against this cluster.
"$HERE/check-krew.sh" 2>>"$LOG" || fail "kubectl-bosun through krew (check-krew.sh; see $LOG)"
phase "kubectl-bosun installed with krew"
# The build Bosun is upgraded to mid-Operation: the same recipe again under a new tag (a
# rebuilt image with a new tag is what a user's `helm upgrade` brings), in every node.
SELF_UPGRADE="${BOSUN_TEST_SELF_UPGRADE:-1}"
if [ "$SELF_UPGRADE" = 1 ]; then
  tag_now=$(awk 'NR == 1 {print $2}' "$CACHE/cluster/bosun-images/images.list")
  tag_next="$tag_now-next"
  CARGO_TARGET_DIR="${BOSUN_IMAGES_TARGET_DIR:-$CACHE/target-images}" \
    "$ROOT/deploy/images/build.sh" --tag "$tag_next" --save "$CACHE/cluster/bosun-images-next" >>"$LOG" 2>&1 \
    || fail "building the next images (deploy/images/build.sh --tag $tag_next)"
  "$C" import "$CACHE/cluster/bosun-images-next" >>"$LOG" 2>&1 || fail "importing the next images into the nodes"
  helm_bin=$(bash "$ROOT/tests/lab/build-helm.sh" 2>>"$LOG" | tail -n 1) || fail "building helm"
  phase "the next images ($tag_next) in every node"
fi

# The kernel boundary of granted commands, checked inside each real agent Pod as deployed (no
# SYS_ADMIN, RuntimeDefault seccomp, chroot into /host): every probe of `bosun-agent
# self-test` (docs/security.md, "The kernel boundary of a granted command") must hold.
for pod in $(kubectl -n bosun-system get pods -l app.kubernetes.io/name=bosun-agent -o name); do
  if ! out=$(kubectl -n bosun-system exec "$pod" -- /usr/local/bin/bosun-agent self-test --host-root /host 2>&1); then
    echo "$out" >&2
    fail "the kernel boundary of granted commands did not hold in $pod"
  fi
  echo "self-test in $pod:"; echo "$out" | sed 's/^/  /'
done
phase "kernel boundary checked in every agent Pod"

# The demo's Operation on real Debian nodes (issue 39): deploy/examples/custom.yaml with the
# hello plugin and its example grants. /etc/os-release is a symlink to ../usr/lib/os-release
# there, which the /etc grant does not follow out; hello greets with the node's facts instead
# and warns, and every node succeeds.
kubectl apply -f "$HERE/../../deploy/examples/custom.yaml" >>"$LOG" 2>&1 || fail "applying deploy/examples/custom.yaml"
deadline=$(( $(date +%s) + 180 ))
until [ "$(kubectl get operation hello-everyone -o jsonpath='{.status.phase}' 2>/dev/null)" = Succeeded ]; do
  phase_now=$(kubectl get operation hello-everyone -o jsonpath='{.status.phase}' 2>/dev/null || true)
  case "$phase_now" in Blocked | Failed) kubectl-bosun status hello-everyone >&2 || true; fail "the demo's Operation hello-everyone is $phase_now on real nodes" ;; esac
  [ "$(date +%s)" -lt "$deadline" ] || { kubectl-bosun status hello-everyone >&2 || true; fail "hello-everyone did not succeed within 180 s"; }
  sleep 2
done
echo "demo Operation on real nodes: hello-everyone Succeeded:"
kubectl get nodetasks -l bosun.dev/operation=hello-everyone \
  -o jsonpath='{range .items[*]}{.spec.nodeName}: {.status.steps[?(@.name=="greet")].message}{"\n"}{end}' | sed 's/^/  /'
# Gone again (with its NodeTasks), so that what follows starts from an install that ran nothing.
kubectl delete operation hello-everyone --wait=true >>"$LOG" 2>&1 || fail "deleting hello-everyone"
phase "the demo's Operation on real nodes"

lc_field() { kubectl get clusterlifecycle cluster -o jsonpath="$1" 2>/dev/null || true; }
lc_in_sync() { [ "$(lc_field '{.status.conditions[?(@.type=="InSync")].status}')" = True ] \
  && [ "$(lc_field '{.status.observedGeneration}')" = "$(lc_field '{.metadata.generation}')" ]; }
# Waits for the Operation the ClusterLifecycle generates for $1 (upgrade, renewCertificates)
# and prints its name.
generated_op() {
  local name deadline=$(( $(date +%s) + 180 ))
  until name=$(kubectl get operations -l "bosun.dev/lifecycle=$1" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) \
    && [ -n "$name" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "no $1 Operation generated within 180 s; ClusterLifecycle: $(lc_field '{.status}')" >&2; return 1; }
    sleep 2
  done
  echo "$name"
}
if [ "$VIA" = lifecycle ]; then
  # Adoption on a real kubeadm cluster: the controller made the ClusterLifecycle from
  # kube-system/kubeadm-config; the agents' NodeReports make it InSync; nothing started.
  deadline=$(( $(date +%s) + 180 ))
  until lc_in_sync; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the adopted ClusterLifecycle is not InSync within 180 s: $(lc_field '{.spec} {.status}')"
    sleep 2
  done
  [ "$(lc_field '{.spec.kubernetesVersion}')" = "$FROM" ] || fail "adopted kubernetesVersion $(lc_field '{.spec.kubernetesVersion}'), expected $FROM"
  [ "$(lc_field '{.spec.certificates.autoRenew}')" != true ] || fail "adoption turned autoRenew on"
  [ "$(lc_field '{.status.versions.nodes}')" = "${#NODES[@]}" ] || fail "the ClusterLifecycle counts $(lc_field '{.status.versions.nodes}') nodes, the cluster has ${#NODES[@]}"
  [ -z "$(kubectl get operations -o name)" ] || fail "installing Bosun started an Operation: $(kubectl get operations -o name)"
  echo "adoption: ClusterLifecycle cluster at $FROM, InSync ($(lc_field '{.status.summary}')); no Operation started"
  # Each agent reads its real node's reboot need and boot (docs/reboots.md): none needs one
  # yet, and each boot identity reads as `<boot_id>/<ticks>`.
  for n in "${NODES[@]}"; do
    r=$(kubectl get nodereport "$n" -o jsonpath='{.spec.facts.reboot.required}')
    [ "$r" = false ] || fail "NodeReport $n: reboot.required '$r' on a node that needs no reboot"
    b=$(kubectl get nodereport "$n" -o jsonpath='{.spec.facts.bootId}')
    [[ "$b" =~ ^[0-9a-f-]{36}/[0-9]+$ ]] || fail "NodeReport $n: bootId '$b' does not read as <boot_id>/<ticks>"
  done
  [ "$(lc_field '{.status.reboots.nodesReported}')" = "${#NODES[@]}" ] \
    || fail "the ClusterLifecycle has $(lc_field '{.status.reboots.nodesReported}') nodes reporting their reboot need, not ${#NODES[@]}"
  # The last node (a worker) then needs one, the way Debian's kernel and libc packages say it
  # (their maintainer scripts touch /run/reboot-required and append to .pkgs). Its agent reads
  # it when its task of the upgrade finishes; checked after the upgrade.
  REBOOT_NODE="${NODES[-1]}"
  REBOOT_BOOT=$(kubectl get nodereport "$REBOOT_NODE" -o jsonpath='{.spec.facts.bootId}')
  podman exec "$REBOOT_NODE" sh -c 'echo "*** System restart required ***" >/run/reboot-required && echo libc6 >>/run/reboot-required.pkgs' \
    || fail "writing the reboot sentinel on $REBOOT_NODE"
  echo "reboots: no node needs one; every bootId reads; /run/reboot-required (libc6) written on $REBOOT_NODE"
  phase "adoption checked"
fi
"$C" load-images "$TO" >>"$LOG" 2>&1 || fail "cluster.sh load-images $TO"
phase "images of $TO loaded"

# The workload: 2 replicas spread over the nodes (the control planes too, so a drained node's
# pod has somewhere to go), a PodDisruptionBudget that lets only one go at a time, and a
# NodePort Service that haproxy balances over every node (cluster.sh), as a cloud load
# balancer would. It stops as a well-behaved application does: a preStop pause, so that its
# endpoint is gone from every node before it stops answering.
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
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: web}}}
      terminationGracePeriodSeconds: 15
      containers:
        - name: web
          image: localhost/bosun/busybox:lab
          imagePullPolicy: Never
          command: [sh, -c, "mkdir -p /www && echo ok >/www/index.html && exec httpd -f -p 8080 -h /www"]
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
          lifecycle: {preStop: {exec: {command: [sleep, "5"]}}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
YAML
kubectl rollout status deploy/web --timeout=120s >>"$LOG" 2>&1 || fail "the workload did not become Ready"

snapshot() { # package versions and control-plane image tags of every node, one line each
  local n c
  for n in "${NODES[@]}"; do
    echo "$n: $(podman exec "$n" dpkg-query -W -f='${Package}=${Version} ' kubeadm kubelet kubectl)"
    case "$n" in *-cp*) ;; *) continue ;; esac
    for c in kube-apiserver kube-controller-manager kube-scheduler; do
      echo "$n: $c $(podman exec "$n" sed -n 's/^ *image: //p' "/etc/kubernetes/manifests/$c.yaml")"
    done
  done
}
task_of() { kubectl get nodetasks -l "bosun.dev/operation=$OP,bosun.dev/node=$1" -o name 2>/dev/null; }
# Waits until Operation $1 Succeeded; fails, with the diagnostics of that Operation, when one
# of its NodeTasks blocks or after $2 seconds ($3 says what it is).
wait_succeeded() {
  local op="$1" secs="$2" what="$3" deadline=$(( $(date +%s) + $2 ))
  until [ "$(kubectl get operation "$op" -o jsonpath='{.status.phase}' 2>/dev/null)" = Succeeded ]; do
    if kubectl get nodetasks -l "bosun.dev/operation=$op" -o jsonpath='{.items[*].status.phase}' 2>/dev/null | grep -q Blocked; then
      OP=$op fail "$what blocked"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || OP=$op fail "$what did not finish within $secs s"
    sleep 3
  done
}
task_field() { kubectl get "$(task_of "$1")" -o jsonpath="$2" 2>/dev/null || true; }
before_state=$(snapshot)
# Every restart of a Bosun container so far, as "pod=count" for those with a count above 0.
# Bosun restarts the API server itself (kubeadm upgrade apply, the renewal), so its
# controller and agents must ride that out in-process (issue 32): any restart fails the test.
# The deliberate agent kill deletes its Pod (the DaemonSet makes a new one, at 0), so it does
# not count here.
bosun_restarts() {
  kubectl -n bosun-system get pods -o jsonpath='{range .items[*]}{.metadata.name}={range .status.containerStatuses[*]}{.restartCount}{" "}{end}{"\n"}{end}' \
    | awk -F= '{ n = 0; split($2, c, " "); for (i in c) n += c[i]; if (n > 0) print $1 "=" n }'
}
check_no_restarts() {
  local r
  r=$(bosun_restarts) || fail "reading the Bosun Pods' restart counts"
  [ -z "$r" ] || fail "Bosun containers restarted $1 (the API server's restarts must be ridden out in-process): $(echo $r)"
  echo "restarts $1: none in $(kubectl -n bosun-system get pods -o name | wc -l) Bosun Pods"
}
check_no_restarts "before the upgrade"
echo "$before_state" >>"$LOG"

if [ "${BOSUN_TEST_DENY:-1}" = 1 ]; then
  kubectl apply -f - >>"$LOG" 2>&1 <<'YAML' || fail "creating the freeze Policy"
apiVersion: bosun.dev/v1alpha1
kind: Policy
metadata:
  name: freeze-upgrades
spec:
  enforcement: Deny
  rego: |
    package bosun.step.freeze_upgrades

    deny contains "upgrades are frozen (test-bosun-upgrade.sh)" if input.operation.kind == "Upgrade"
YAML
fi

# etcd's own client against the stacked etcd members, with the control plane's health-check
# client certificate; and the checks after each control plane's task.
ETCD_CERTS=$(mktemp -d)
for f in ca.crt healthcheck-client.crt healthcheck-client.key; do
  podman exec "${NODES[0]}" cat "/etc/kubernetes/pki/etcd/$f" >"$ETCD_CERTS/$f" || fail "copying etcd's $f from ${NODES[0]}"
done
CP_NODES=(); for n in "${NODES[@]}"; do case "$n" in *-cp*) CP_NODES+=("$n") ;; esac; done
etcd_endpoints=$(for n in "${CP_NODES[@]}"; do
  echo "https://$(awk -v n="$n" '$1 == n {print $2}' "${BOSUN_CLUSTER_DIR:-$HOME/.cache/bosun/cluster-state/$NAME}/nodes.ips"):2379"; done | paste -sd,)
# etcdctl comes with the target version's build (tests/cluster/build-go.sh).
ETCDCTL="$(. "${BOSUN_CACHE_DIR:-$HOME/.cache/bosun}/cluster/versions/$TO.env" && echo "$BOSUN_CLUSTER_BIN")/etcdctl"
[ -x "$ETCDCTL" ] || fail "no etcdctl in the build of $TO ($ETCDCTL); run tests/cluster/build.sh with BOSUN_K8S_VERSION=$TO"
etcdctl_() { "$ETCDCTL" --cacert "$ETCD_CERTS/ca.crt" --cert "$ETCD_CERTS/healthcheck-client.crt" \
  --key "$ETCD_CERTS/healthcheck-client.key" --endpoints "$etcd_endpoints" --command-timeout 5s "$@"; }
etcd_whole() { # every member started and healthy, as many as control planes, one leader
  local members healthy leaders
  members=$(etcdctl_ member list 2>/dev/null | grep -c ', started, ') || return 1
  healthy=$(etcdctl_ endpoint health 2>&1 | grep -c 'is healthy') || return 1
  leaders=$(etcdctl_ endpoint status -w json 2>/dev/null | python3 -c 'import json, sys
print(sum(1 for e in json.load(sys.stdin) if e["Status"]["header"]["member_id"] == e["Status"]["leader"]))') || return 1
  [ "$members" = "${#CP_NODES[@]}" ] && [ "$healthy" = "${#CP_NODES[@]}" ] && [ "$leaders" = 1 ]
}
declare -A cp_checked=()
check_control_plane() { # after $1's task Succeeded
  local n="$1" c img deadline=$(( $(date +%s) + 60 ))
  until etcd_whole; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "after $n: etcd is not ${#CP_NODES[@]} healthy members with one leader: $(etcdctl_ member list 2>&1 | xargs) / $(etcdctl_ endpoint health 2>&1 | xargs)"
    sleep 2
  done
  [ "$(curl -sk -m 5 "https://$ENDPOINT/readyz")" = ok ] || fail "after $n: https://$ENDPOINT/readyz is not ok"
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    img=$(podman exec "$n" sed -n 's/^ *image: //p' "/etc/kubernetes/manifests/$c.yaml")
    [ "${img##*:}" = "$TO" ] || fail "after $n: its static Pod $c runs $img, expected tag $TO"
  done
  echo "after $n: etcd ${#CP_NODES[@]} members healthy (etcdctl), one leader; $ENDPOINT/readyz ok; static Pods at $TO"
}


# The etcd safety net (issue 35; docs/operations.md): what an administrator does on each
# control plane before the first upgrade with Bosun, etcd's own client and offline tool in
# /usr/local/bin (the build of the target version's etcd) and the snapshot directory.
ETCDUTL="$(dirname "$ETCDCTL")/etcdutl"
[ -x "$ETCDUTL" ] || fail "no etcdutl beside $ETCDCTL; run tests/cluster/build.sh with BOSUN_K8S_VERSION=$TO"
for n in "${CP_NODES[@]}"; do
  podman cp "$ETCDCTL" "$n:/usr/local/bin/etcdctl" && podman cp "$ETCDUTL" "$n:/usr/local/bin/etcdutl" \
    && podman exec "$n" install -d -m 0700 /var/lib/etcd-snapshots || fail "installing etcdctl and etcdutl on $n"
done
echo "etcd: etcdctl and etcdutl $("$ETCDCTL" version | sed -n 's/^etcdctl version: //p') in /usr/local/bin and /var/lib/etcd-snapshots on ${CP_NODES[*]}"
# The etcd gate's blocked case: one member stopped (its static Pod's manifest moved out) before
# the Operation, so the first control plane's health check must block, naming that member,
# with nothing on its node changed. Stopped before the probes start: its API server hangs
# until haproxy's check takes it out, and that outage is this test's doing, not Bosun's.
etcd_stopped=""
if [ "${BOSUN_TEST_ETCD_GATE:-1}" = 1 ] && [ "${#CP_NODES[@]}" -gt 1 ]; then
  etcd_stopped="${CP_NODES[$(( ${#CP_NODES[@]} - 1 ))]}"
  podman exec "$etcd_stopped" mv /etc/kubernetes/manifests/etcd.yaml /etc/kubernetes/etcd.yaml.stopped-by-test \
    || fail "stopping etcd on $etcd_stopped"
  deadline=$(( $(date +%s) + 120 ))
  # etcdctl exits 1 while a member is unhealthy: only its JSON counts here (pipefail).
  until { etcdctl_ endpoint health -w json 2>/dev/null || true; } | python3 -c 'import json, sys
sys.exit(0 if any(not e["health"] for e in json.load(sys.stdin)) else 1)'; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "etcd on $etcd_stopped still answers 120 s after its manifest was moved out"
    sleep 2
  done
  sleep 10  # haproxy's checks take that node's API server out
  echo "etcd gate: the etcd member on $etcd_stopped stopped (its manifest moved out)"
fi

# What users see during the Operation (issue 32): the application through its load balancer
# and the API through the control-plane endpoint, at fixed rates; each node's memory.
ENDPOINT=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}'); ENDPOINT=${ENDPOINT#https://}
APP_URL="http://${ENDPOINT%:*}:${BOSUN_CLUSTER_APP_PORT:-8080}/"
PROBES=$(mktemp -d)
probe_pids=()
tell_probes_to_stop() { touch "$PROBES/api.stop" "$PROBES/app.stop" "$PROBES/mem.stop" "$PROBES/health.stop" "$PROBES/reboot-app.stop"; }
stop_probes() { tell_probes_to_stop; wait "${probe_pids[@]}" 2>/dev/null || true; }
trap tell_probes_to_stop EXIT
# Started before the upgrade's first change to a node: here, or, with the etcd gate's blocked
# case, once the member the test stopped is back and the cluster has settled (that outage is
# the test's doing, not the upgrade's).
start_probes() {
  for _ in $(seq 1 30); do curl -sf -m 1 -o /dev/null "$APP_URL" && break; sleep 1; done
  curl -sf -m 1 -o /dev/null "$APP_URL" || fail "the workload does not answer at $APP_URL"
  "$HERE/probe.sh" api "$PROBES/api" "$ENDPOINT" & probe_pids+=($!)
  "$HERE/probe.sh" app "$PROBES/app" "$APP_URL" & probe_pids+=($!)
  "$HERE/probe.sh" mem "$PROBES/mem" "bosun.cluster=$NAME" & probe_pids+=($!)
  echo "probes: the API through $ENDPOINT every 1 s, the application at $APP_URL every 0.2 s, node memory every 5 s (in $PROBES)"
}
[ -n "$etcd_stopped" ] || start_probes

if [ "$VIA" = lifecycle ]; then
  t_op=$(date +%s)
  kubectl patch clusterlifecycle cluster --type merge -p "{\"spec\": {\"kubernetesVersion\": \"$TO\",
    \"operationDefaults\": {\"executionMode\": \"Auto\", \"rollout\": {\"maxUnavailable\": 1},
    \"healthGates\": {\"nodeReady\": true, \"apiServer\": true, \"settleSeconds\": 5}}}}" >>"$LOG" 2>&1 \
    || fail "setting the ClusterLifecycle's kubernetesVersion to $TO"
  OP=$(generated_op upgrade) || fail "no upgrade Operation generated for $TO"
  [ "$(kubectl get operation "$OP" -o jsonpath='{.spec.upgrade.kubernetesVersion}')" = "$TO" ] \
    || fail "the generated Operation $OP does not upgrade to $TO: $(kubectl get operation "$OP" -o jsonpath='{.spec}')"
  echo "lifecycle: kubernetesVersion $FROM -> $TO generated $OP ($(kubectl get operation "$OP" -o jsonpath='{.metadata.annotations.bosun\.dev/lifecycle-reason}'))"
else
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
fi

if [ "${BOSUN_TEST_DENY:-1}" = 1 ]; then
  cp1="${NODES[0]}"
  deadline=$(( $(date +%s) + 300 ))
  until [ "$(task_field "$cp1" '{.status.reason}')" = PolicyDenied ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the upgrade did not block PolicyDenied on $cp1 within 300 s (phase $(task_field "$cp1" '{.status.phase}'))"
    sleep 2
  done
  denied_step=$(task_field "$cp1" '{.status.currentStep}')
  denied_msg=$(task_field "$cp1" '{.status.message}')
  [[ "$denied_msg" == *"upgrades are frozen"* ]] || fail "the block on $cp1 does not give the policy's message: $denied_msg"
  after_deny=$(snapshot)
  [ "$after_deny" = "$before_state" ] || fail "the denied upgrade changed a node:
before: $before_state
after:  $after_deny"
  for n in "${NODES[@]:1}"; do
    [ -z "$(task_field "$n" '{.status.steps[?(@.phase=="Succeeded")].name}')" ] \
      || fail "a step ran on $n while $cp1 was blocked"
  done
  echo "policy deny: $cp1 blocked PolicyDenied at step $denied_step; packages and images unchanged on every node"
  kubectl delete policy freeze-upgrades >>"$LOG" 2>&1 || fail "deleting the freeze Policy"
  # The agents drop a deleted Policy as their watch sees it; retry once it has.
  sleep 5
  kubectl-bosun retry "$OP" "$cp1" >>"$LOG" 2>&1 || fail "kubectl bosun retry $OP $cp1"
  phase "policy deny, then retry"
fi

if [ -n "$etcd_stopped" ]; then
  cp1="${NODES[0]}"
  deadline=$(( $(date +%s) + 300 ))
  # Blocked at etcd-health for the gate's own reason (after the policy deny above, the retry
  # takes a moment to replace the PolicyDenied block).
  # The step must be Failed again too: right after the retry, the task can still read Blocked
  # while its step is already back at Pending with the retry's message (seen once, in a run
  # whose policy deny and retry took 49 s).
  until [ "$(task_field "$cp1" '{.status.phase}')" = Blocked ] && [ "$(task_field "$cp1" '{.status.currentStep}')" = etcd-health ] \
    && [ "$(task_field "$cp1" '{.status.reason}')" != PolicyDenied ] \
    && [ "$(task_field "$cp1" '{.status.steps[?(@.name=="etcd-health")].phase}')" = Failed ] \
    && [[ "$(task_field "$cp1" '{.status.steps[?(@.name=="etcd-health")].message}')" != *"denied by policy"* ]]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the etcd gate did not block $cp1 within 300 s with a member stopped (phase $(task_field "$cp1" '{.status.phase}'), step $(task_field "$cp1" '{.status.currentStep}'): $(task_field "$cp1" '{.status.message}'))"
    sleep 2
  done
  gate_msg=$(task_field "$cp1" '{.status.steps[?(@.name=="etcd-health")].message}')
  [[ "$gate_msg" == *"member $etcd_stopped ("*"is not healthy"* ]] \
    || fail "the etcd gate's message on $cp1 does not name $etcd_stopped and its fault: $gate_msg"
  [ "$(snapshot)" = "$before_state" ] || fail "the blocked etcd gate let something change on a node"
  [ -z "$(kubectl get node "$cp1" -o jsonpath='{.spec.unschedulable}')" ] || fail "$cp1 was cordoned though its etcd gate blocked"
  for n in "${NODES[@]:1}"; do
    [ -z "$(task_field "$n" '{.status.steps[?(@.phase=="Succeeded")].name}')" ] \
      || fail "a step ran on $n while $cp1 was blocked at its etcd gate"
  done
  echo "etcd gate: $cp1 Blocked at etcd-health ($(task_field "$cp1" '{.status.reason}')), not cordoned, packages and images unchanged: $gate_msg"
  podman exec "$etcd_stopped" mv /etc/kubernetes/etcd.yaml.stopped-by-test /etc/kubernetes/manifests/etcd.yaml \
    || fail "starting etcd on $etcd_stopped again"
  deadline=$(( $(date +%s) + 180 ))
  until etcd_whole; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "etcd on $etcd_stopped is not back 180 s after its manifest was restored"
    sleep 2
  done
  # As a person would before retrying: the cluster whole again, every Node Ready and the
  # application's two replicas behind its Service (with the member away, $etcd_stopped's
  # API server and kubelet lost their footing; a drain started before they are back can
  # take the one replica that answers).
  deadline=$(( $(date +%s) + 240 ))
  until [ -z "$(kubectl get nodes --no-headers 2>/dev/null | awk '$2 != "Ready"')" ] && [ "$(kubectl get nodes --no-headers 2>/dev/null | wc -l)" = "${#NODES[@]}" ] \
    && [ "$(kubectl get endpointslices -l kubernetes.io/service-name=web -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}x{end}' 2>/dev/null)" = xx ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the cluster has not settled 240 s after etcd on $etcd_stopped came back: $(kubectl get nodes --no-headers 2>&1 | xargs)"
    sleep 2
  done
  echo "etcd gate: etcd whole again, every Node Ready, both replicas of the application ready"
  start_probes
  kubectl-bosun retry "$OP" "$cp1" >>"$LOG" 2>&1 || fail "kubectl bosun retry $OP $cp1"
  deadline=$(( $(date +%s) + 60 ))
  while [ "$(task_field "$cp1" '{.status.phase}')" = Blocked ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$cp1 is still Blocked 60 s after the retry: $(task_field "$cp1" '{.status.message}')"
    sleep 1
  done
  phase "etcd gate blocked, member restored, then retry"
fi

killed=""
retried_interrupted=0
self_upgraded=""
denied_step="${denied_step:-}"
# Upgrades Bosun itself while the Operation runs: `helm upgrade` to the next images, as a
# user would, and what the checks after the Operation compare with.
self_upgrade() {
  tasks_before=$(kubectl get nodetasks -l "bosun.dev/operation=$OP" \
    -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort)
  pods_before=$(kubectl -n bosun-system get pods -o name | sort)
  local deadline=$(( $(date +%s) + 120 ))
  # The API server may be restarting (a control plane's upgrade): try again for up to 120 s.
  until "$helm_bin/helm" upgrade bosun "$ROOT/deploy/helm/bosun" -n bosun-system --reuse-values \
      --set image.controller.tag="$tag_next" --set image.agent.tag="$tag_next" >>"$LOG" 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "helm upgrade to $tag_next failed for 120 s (see $LOG)"
    sleep 3
  done
  self_upgraded=$(date +%s)
  echo "Bosun upgraded mid-Operation: helm upgrade to $tag_next after ${NODES[0]} Succeeded; tasks then: $(kubectl get nodetasks -l "bosun.dev/operation=$OP" -o jsonpath='{range .items[*]}{.spec.nodeName}={.status.phase} {end}')"
}
deadline=$(( t_op + ${BOSUN_UPGRADE_TIMEOUT:-1800} ))
while :; do
  phase_now=$(kubectl get operation "$OP" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [ "$phase_now" = Succeeded ] && break
  [ "$phase_now" = Failed ] && fail "the Operation Failed"
  if [ "${BOSUN_TEST_KILL:-1}" = 1 ] && [ -z "$killed" ]; then
    cp1="${NODES[0]}"
    started=$(task_field "$cp1" '{.status.steps[?(@.name=="kubeadm-upgrade")].startedAt}')
    if [ "$(task_field "$cp1" '{.status.currentStep}')" = kubeadm-upgrade ] && [ -n "$started" ] \
      && [ "$(task_field "$cp1" '{.status.steps[?(@.name=="kubeadm-upgrade")].phase}')" = Running ] \
      && [ $(( $(date +%s) - $(date -d "$started" +%s) )) -ge "${BOSUN_TEST_KILL_AFTER:-3}" ]; then
      # kubeadm restarts the API server during the apply, so the lookup or the
      # delete may meet a closed port: try again for up to 120 s.
      kill_deadline=$(( $(date +%s) + 120 ))
      until victim=$(kubectl -n bosun-system get pods -l app.kubernetes.io/name=bosun-agent \
          --field-selector "spec.nodeName=$cp1" -o jsonpath='{.items[0].metadata.name}' 2>>"$LOG") \
        && [ -n "$victim" ] \
        && kubectl -n bosun-system delete pod "$victim" --grace-period=1 --wait=false >>"$LOG" 2>&1; do
        [ "$(date +%s)" -lt "$kill_deadline" ] || fail "deleting the agent Pod on $cp1 (API server unreachable for 120 s; see $LOG)"
        still=$(task_field "$cp1" '{.status.steps[?(@.name=="kubeadm-upgrade")].phase}')
        [ -z "$still" ] || [ "$still" = Running ] \
          || fail "kubeadm-upgrade on $cp1 ended ($still) while the API server was away, before its agent could be killed"
        echo "agent kill: API server not answering, trying again" >>"$LOG"
        sleep 2
      done
      killed=$victim
      echo "agent killed: Pod $killed deleted $(( $(date +%s) - $(date -d "$started" +%s) )) s into kubeadm-upgrade on $cp1"
    fi
  fi
  for n in "${CP_NODES[@]}"; do
    [ -z "${cp_checked[$n]:-}" ] && [ "$(task_field "$n" '{.status.phase}')" = Succeeded ] || continue
    check_control_plane "$n"; cp_checked[$n]=1
  done
  if [ "$SELF_UPGRADE" = 1 ] && [ -z "$self_upgraded" ] && [ -n "${cp_checked[${NODES[0]}]:-}" ]; then
    self_upgrade
  fi
  for n in "${NODES[@]}"; do
    [ "$(task_field "$n" '{.status.phase}')" = Blocked ] || continue
    reason=$(task_field "$n" '{.status.reason}')
    if [ "$reason" = Interrupted ] && [ -n "$killed" ] && [ "$retried_interrupted" = 0 ]; then
      echo "agent killed: $n blocked Interrupted ($(task_field "$n" '{.status.message}')); retrying"
      kubectl-bosun retry "$OP" "$n" >>"$LOG" 2>&1 || fail "kubectl bosun retry $OP $n"
      retried_interrupted=1
    else
      fail "NodeTask of $n is Blocked ($reason): $(task_field "$n" '{.status.message}')"
    fi
  done
  [ "$(date +%s)" -lt "$deadline" ] || fail "the Operation did not end within ${BOSUN_UPGRADE_TIMEOUT:-1800}s (phase '$phase_now')"
  # Look every second until the kill, so that it lands near its threshold.
  if [ "${BOSUN_TEST_KILL:-1}" = 1 ] && [ -z "$killed" ]; then sleep 1; else sleep 3; fi
done
if [ -n "$killed" ]; then
  cp1="${NODES[0]}"
  attempts=$(task_field "$cp1" '{.status.steps[?(@.name=="kubeadm-upgrade")].attempts}')
  [ "${attempts:-0}" -ge 2 ] || fail "kubeadm-upgrade on $cp1 ran $attempts time(s) after its agent was killed mid-step; expected a second attempt"
  kubectl -n bosun-system get pod "$killed" >/dev/null 2>&1 && fail "the killed agent Pod $killed still exists"
  kubectl -n bosun-system rollout status ds/bosun-agent --timeout=60s >>"$LOG" 2>&1 || fail "the agent DaemonSet is not whole again"
  echo "agent killed: attempt $attempts of kubeadm-upgrade spent $(task_field "$cp1" '{.status.steps[?(@.name=="kubeadm-upgrade")].hostMilliseconds}') ms in host commands (about 0 when the first attempt had already brought the control plane to $TO)"
  echo "agent killed: kubeadm-upgrade on $cp1 finished at attempt $attempts (interrupted-and-retried: $retried_interrupted); the DaemonSet replaced $killed"
elif [ "${BOSUN_TEST_KILL:-1}" = 1 ]; then
  fail "the agent was never killed: kubeadm-upgrade on ${NODES[0]} never ran ${BOSUN_TEST_KILL_AFTER:-3} s"
fi
# The etcd safety net: the first control plane's snapshot, as its step recorded it, is on the
# node, whole (its sha256), and etcd's own tool reads the recorded revision and key count in
# it; it was finished before kubeadm started. Every control plane's health check passed before
# its node was cordoned.
cp1="${NODES[0]}"
snap() { task_field "$cp1" "{.status.steps[?(@.name==\"etcd-snapshot\")].$1}"; }
snap_path=$(snap outputs.path)
[ "$(snap phase)" = Succeeded ] && [ -n "$snap_path" ] || fail "no etcd snapshot recorded on $cp1: $(snap message)"
[ "$(podman exec "$cp1" sha256sum "$snap_path" | cut -d' ' -f1)" = "$(snap outputs.sha256)" ] \
  || fail "the snapshot $snap_path on $cp1 does not have the recorded sha256 $(snap outputs.sha256)"
snap_status=$(podman exec "$cp1" /usr/local/bin/etcdutl snapshot status "$snap_path" -w json) || fail "etcdutl cannot read $snap_path on $cp1"
python3 - "$snap_status" "$(snap outputs.revision)" "$(snap outputs.totalKeys)" <<'PY' || fail "etcdutl reads $snap_status in $snap_path, the step recorded revision $(snap outputs.revision), $(snap outputs.totalKeys) keys"
import json, sys
s = json.loads(sys.argv[1])
sys.exit(0 if str(s["revision"]) == sys.argv[2] and str(s["totalKey"]) == sys.argv[3] and s["totalKey"] > 0 else 1)
PY
kubeadm_started=$(task_field "$cp1" '{.status.steps[?(@.name=="kubeadm-upgrade")].startedAt}')
[ "$(date -d "$(snap finishedAt)" +%s)" -le "$(date -d "$kubeadm_started" +%s)" ] \
  || fail "the etcd snapshot on $cp1 finished at $(snap finishedAt), after kubeadm-upgrade started at $kubeadm_started"
for n in "${CP_NODES[@]}"; do
  h_phase=$(task_field "$n" '{.status.steps[?(@.name=="etcd-health")].phase}')
  h_end=$(task_field "$n" '{.status.steps[?(@.name=="etcd-health")].finishedAt}')
  c_start=$(task_field "$n" '{.status.steps[?(@.name=="cordon")].startedAt}')
  [ "$h_phase" = Succeeded ] && [ "$(date -d "$h_end" +%s)" -le "$(date -d "$c_start" +%s)" ] \
    || fail "the etcd health check on $n is $h_phase (ended $h_end, cordon started $c_start): $(task_field "$n" '{.status.steps[?(@.name=="etcd-health")].message}')"
  echo "etcd gate on $n: $(task_field "$n" '{.status.steps[?(@.name=="etcd-health")].message}')"
done
echo "etcd snapshot on $cp1: $(snap message) ($(( $(date -d "$(snap finishedAt)" +%s) - $(date -d "$(snap startedAt)" +%s) )) s, before kubeadm started at $kubeadm_started; etcdutl on the node agrees)"
op_s=$(( $(date +%s) - t_op ))
phase "upgrade Operation $OP Succeeded"
if [ "$SELF_UPGRADE" = 1 ]; then
  [ -n "$self_upgraded" ] || fail "the Operation ended before Bosun was upgraded mid-Operation"
  kubectl -n bosun-system rollout status deploy/bosun-controller --timeout=300s >>"$LOG" 2>&1 \
    || fail "the controller did not roll out at $tag_next"
  kubectl -n bosun-system rollout status ds/bosun-agent --timeout=600s >>"$LOG" 2>&1 \
    || fail "the agents did not roll out at $tag_next"
  # Every Bosun Pod is a new one, running the next images.
  pods_after=$(kubectl -n bosun-system get pods -o name | sort)
  kept=$(comm -12 <(echo "$pods_before") <(echo "$pods_after"))
  [ -z "$kept" ] || fail "Bosun Pods from before the helm upgrade still run: $(echo $kept)"
  images=$(kubectl -n bosun-system get pods -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}' | sort -u)
  [ "$images" = "$(printf 'localhost/bosun/bosun-agent:%s\nlocalhost/bosun/bosun-controller:%s' "$tag_next" "$tag_next")" ] \
    || fail "the Bosun Pods do not all run the next images ($tag_next): $(echo $images)"
  # No NodeTask lost or made again: the same names and UIDs as when the upgrade started, one
  # per node.
  tasks_after=$(kubectl get nodetasks -l "bosun.dev/operation=$OP" \
    -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort)
  [ "$tasks_after" = "$tasks_before" ] || fail "the NodeTasks changed across the helm upgrade:
before: $(echo $tasks_before)
after:  $(echo $tasks_after)"
  [ "$(wc -l <<<"$tasks_after")" = "${#NODES[@]}" ] || fail "$(wc -l <<<"$tasks_after") NodeTasks for ${#NODES[@]} nodes"
  # No step ran twice: every step of every node at attempt 1, but those the test itself made
  # run again: the step the policy denied (attempt 1 was the denial; retried by hand) and the
  # one whose agent it killed mid-step.
  expected="${denied_step:+${NODES[0]}:$denied_step} ${killed:+${NODES[0]}:kubeadm-upgrade}"
  twice=$(for n in "${NODES[@]}"; do
      task_field "$n" '{range .status.steps[*]}{.name}={.attempts}{"\n"}{end}' | sed "s/^/$n:/"
    done | awk -F= -v expected="$expected" 'BEGIN { split(expected, e, " "); for (i in e) ok[e[i]] = 1 } $2 != 1 && !($1 in ok)')
  [ -z "$twice" ] || fail "steps ran more than once across the helm upgrade: $(echo $twice)"
  echo "Bosun upgraded mid-Operation: controller and $(grep -c bosun-agent <<<"$pods_after") agents rolled to $tag_next in $(( $(date +%s) - self_upgraded ))s or less; $(wc -l <<<"$tasks_after") NodeTasks kept (same UIDs); every step ran once (but those the test made run again:${expected// /, })"
fi
check_no_restarts "during the upgrade"
for n in "${CP_NODES[@]}"; do [ -n "${cp_checked[$n]:-}" ] || check_control_plane "$n"; done
stop_probes
"$HERE/plan-order.sh" "$OP" "${NODES[0]}" || fail "the plan's order (above)"
"$HERE/probe.sh" mem-report "$PROBES/mem"
api_gap=10; [ "${#CP_NODES[@]}" -gt 1 ] || api_gap=100000  # one control plane: the API is down during its restart, by design
"$HERE/probe.sh" report "$PROBES/api" "$api_gap" 100 "API (read + write every 1 s through $ENDPOINT)" || fail "the API client's target (above)"
"$HERE/probe.sh" report "$PROBES/app" 5 1 "application (GET every 0.2 s through its load balancer)" || fail "the application client's target (above)"
read -r up_wall up_steps up_dead < <("$HERE/dead-time.sh" "$OP") || fail "dead-time.sh $OP"
echo "upgrade: wall ${up_wall}s, steps running ${up_steps}s, no step running ${up_dead}s"

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
# kubeadm's last phases (configuration upload, addons) ran: kube-proxy's DaemonSet is at TO
# and rolled out on every node.
proxy=$(kubectl -n kube-system get ds kube-proxy -o jsonpath='{.spec.template.spec.containers[0].image}')
[ "${proxy##*:}" = "$TO" ] || fail "kube-proxy's DaemonSet runs $proxy, expected tag $TO (kubeadm's addon phase did not run?)"
kubectl -n kube-system rollout status ds/kube-proxy --timeout=120s >>"$LOG" 2>&1 || fail "kube-proxy is not rolled out at $TO"
for n in "${NODES[@]}"; do
  pkgs=$(podman exec "$n" dpkg-query -W -f='${Package}=${Version} ' kubeadm kubelet kubectl)
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
echo "before:"; echo "$before_state"
echo "after:"; snapshot
if [ "$VIA" = lifecycle ]; then
  deadline=$(( $(date +%s) + 180 ))
  until lc_in_sync && [ "$(lc_field '{.status.versions.nodesAtDesired}')" = "${#NODES[@]}" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the ClusterLifecycle is not InSync at $TO within 180 s after $OP: $(lc_field '{.status}')"
    sleep 2
  done
  # What each agent reports of its real node: kubectl's version from the binary, and the
  # package versions from the node's dpkg database.
  for n in "${NODES[@]}"; do
    kv=$(kubectl get nodereport "$n" -o jsonpath='{.spec.facts.kubectlVersion}')
    [ "$kv" = "$TO" ] || fail "NodeReport $n: kubectlVersion '$kv', expected $TO"
    for p in kubeadm kubelet kubectl; do
      pv=$(kubectl get nodereport "$n" -o jsonpath="{.spec.facts.packages[?(@.name==\"$p\")].version}")
      [[ "$pv" == "${TO#v}-"* ]] || fail "NodeReport $n: package $p '$pv', expected ${TO#v}-*"
    done
  done
  echo "lifecycle: every NodeReport says kubectl $TO and packages kubeadm/kubelet/kubectl ${TO#v}"
  # The sentinel written before the upgrade: reported by that node's agent, counted and named
  # by the ClusterLifecycle (still InSync above: a reboot need is no drift), shown by
  # kubectl bosun status; nothing rebooted it, so its boot is the same.
  deadline=$(( $(date +%s) + 120 ))
  until [ "$(lc_field '{.status.reboots.required}')" = 1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the ClusterLifecycle does not count $REBOOT_NODE as needing a reboot within 120 s: $(lc_field '{.status.reboots}'); its report: $(kubectl get nodereport "$REBOOT_NODE" -o jsonpath='{.spec.facts.reboot}')"
    sleep 2
  done
  [ "$(lc_field '{.status.reboots.nodes[*]}')" = "$REBOOT_NODE" ] || fail "status.reboots names '$(lc_field '{.status.reboots.nodes[*]}')', not $REBOOT_NODE"
  reasons=$(kubectl get nodereport "$REBOOT_NODE" -o jsonpath='{.spec.facts.reboot.reasons[*]}')
  [ "$reasons" = "/run/reboot-required is present (asked for by libc6)" ] || fail "NodeReport $REBOOT_NODE: reboot reasons '$reasons'"
  [ "$(kubectl get nodereport "$REBOOT_NODE" -o jsonpath='{.spec.facts.bootId}')" = "$REBOOT_BOOT" ] \
    || fail "NodeReport $REBOOT_NODE: bootId changed without a reboot"
  lc_status=$(kubectl-bosun status)
  grep -qF "$REBOOT_NODE: /run/reboot-required is present (asked for by libc6)" <<<"$lc_status" \
    || fail "kubectl bosun status does not show $REBOOT_NODE's reboot need: $lc_status"
  echo "reboots: $(lc_field '{.status.summary}')"
  kubectl get clusterlifecycle cluster
  kubectl-bosun status | tee -a "$LOG" | head -n 14
  echo "lifecycle: InSync at $TO ($(lc_field '{.status.summary}'))"
fi

# Timings: each node's task wall time, and Bosun's share of it (see docs/benchmarks.md).
"$HERE/bosun-share.sh" "$OP" || fail "bosun-share.sh $OP"
echo "operation wall time: ${op_s}s"
# shellcheck disable=SC2046
podman stats --no-stream --format '{{.Name}} {{.MemUsage}}' $(podman ps -q --filter "label=bosun.cluster=$NAME")

if [ "${BOSUN_TEST_RENEW:-1}" = 1 ]; then
  cp1="${NODES[0]}"
  cp1_ip=$(awk -v n="$cp1" '$1 == n {print $2}' "${BOSUN_CLUSTER_DIR:-$HOME/.cache/bosun/cluster-state/$NAME}/nodes.ips")
  file_serial() { podman exec "$cp1" openssl x509 -noout -serial -in /etc/kubernetes/pki/apiserver.crt | cut -d= -f2; }
  served_serial() {
    openssl s_client -connect "$cp1_ip:6443" -servername kubernetes </dev/null 2>/dev/null \
      | openssl x509 -noout -serial | cut -d= -f2
  }
  old=$(file_serial)
  [ "$(served_serial)" = "$old" ] || fail "before renewal the API server does not serve apiserver.crt (serial $(served_serial), file $old)"
  # Where the renewal's health gates wait: each control plane's own /readyz and every
  # Node's Ready, once a second, kept beside the log (issue 32's renewal dead time).
  cp_pairs=(); for n in "${CP_NODES[@]}"; do
    cp_pairs+=("$n=$(awk -v n="$n" '$1 == n {print $2}' "${BOSUN_CLUSTER_DIR:-$HOME/.cache/bosun/cluster-state/$NAME}/nodes.ips")")
  done
  # (stop_probes left health.stop behind with the others' stop files)
  rm -f "$PROBES/health.stop"
  "$HERE/probe.sh" health "$PROBES/health" "${cp_pairs[@]}" & health_pid=$!
  if [ "$VIA" = lifecycle ]; then
    kubectl patch clusterlifecycle cluster --type merge -p '{"spec": {"certificates": {"rotation": 1}}}' >>"$LOG" 2>&1 \
      || fail "bumping the ClusterLifecycle's certificate rotation"
    ROP=$(generated_op renewCertificates) || fail "no renewCertificates Operation generated for rotation 1"
    echo "lifecycle: rotation 0 -> 1 generated $ROP"
  else
    ROP=renew-all
    kubectl apply -f - >>"$LOG" 2>&1 <<YAML || fail "creating the renewCertificates Operation"
apiVersion: bosun.dev/v1alpha1
kind: Operation
metadata:
  name: $ROP
spec:
  renewCertificates:
    certificates: [all]
YAML
  fi
  wait_succeeded "$ROP" 600 "the renewal"
  new=$(file_serial)
  [ "$new" != "$old" ] || fail "apiserver.crt has its old serial $old after the renewal"
  # The restarted API server serves the new certificate (give a slow restart a moment).
  for _ in $(seq 1 30); do [ "$(served_serial)" = "$new" ] && break; sleep 2; done
  [ "$(served_serial)" = "$new" ] || fail "the API server serves serial $(served_serial), the file has $new (old $old)"
  file_end=$(podman exec "$cp1" openssl x509 -noout -enddate -in /etc/kubernetes/pki/apiserver.crt | cut -d= -f2)
  kubeadm_end=$(podman exec "$cp1" kubeadm certs check-expiration 2>/dev/null | awk '$1 == "apiserver" {print $2, $3, $4, $5, $6}')
  [ "$(date -u -d "$file_end" '+%b %d, %Y %H:%M UTC')" = "$kubeadm_end" ] \
    || fail "kubeadm certs check-expiration says apiserver expires '$kubeadm_end', the file says '$file_end'"
  touch "$PROBES/health.stop"; wait "$health_pid" 2>/dev/null || true
  kubectl-bosun status "$ROP" | head -n 30
  check_no_restarts "during the renewal"
  # The renewal restarts each control plane; the time no step runs is measured against
  # issue 32's 30 s and reported, not asserted: a timed assertion fails on a loaded machine
  # for no fault of Bosun's (CI's run of stop 47 measured 35.0 s, the runs before it 16.3-24.0
  # s; docs/benchmarks.md, "API-server restarts", keeps the history and how to reproduce it).
  # Where the time went is printed beside the figure.
  read -r rn_wall rn_steps rn_dead < <("$HERE/dead-time.sh" "$ROP") || fail "dead-time.sh $ROP"
  rn_verdict=$(awk -v d="$rn_dead" 'BEGIN { print (d <= 30 ? "met" : "missed") }')
  echo "renewal: wall ${rn_wall}s, steps running ${rn_steps}s, no step running ${rn_dead}s (target at most 30 s: $rn_verdict)"
  # Where that time went, and what Bosun's processes said about stalled watches; the
  # controllers' logs and the tasks are kept beside the log for a closer look.
  "$HERE/dead-time.sh" --gaps "$ROP" | sed 's/^/renewal gap: /' || true
  keep="$(dirname "$LOG")"
  kubectl get nodetasks -l "bosun.dev/operation=$ROP" -o json >"$keep/renewal-tasks.json" 2>/dev/null || true
  "$HERE/probe.sh" health-report "$PROBES/health" >"$keep/renewal-health.txt" 2>&1 || true
  sed 's/^/renewal health: /' "$keep/renewal-health.txt" | head -n 40
  # The control plane's static Pods: a restart the kubelet made on its own (a failed liveness
  # probe) shows here, beside the renewal's planned ones.
  kubectl -n kube-system get pods -l tier=control-plane --request-timeout=10s -o custom-columns='NAME:.metadata.name,RESTARTS:.status.containerStatuses[0].restartCount,STARTED:.status.containerStatuses[0].state.running.startedAt,LAST-EXIT:.status.containerStatuses[0].lastState.terminated.finishedAt' 2>&1 \
    | sed 's/^/renewal static pods: /' || true
  for p in $(kubectl -n bosun-system get pods -o name 2>/dev/null); do
    kubectl -n bosun-system logs "$p" >"$keep/${p#pod/}.log" 2>&1 || true
  done
  # The controllers' own account of the gates (logged when what they wait for changes).
  grep -h '"health gates"' "$keep"/bosun-controller-*.log 2>/dev/null | cut -c1-400 | sed 's/^/renewal gates: /' | head -n 20 || true
  echo "renewal: watches opened again (controllers, agents): $(cat "$keep"/bosun-*.log 2>/dev/null | grep -c 'watching again on a new connection' || true); logs in $keep"
  echo "renewal: apiserver serial $old -> $new, served by the API server; expiry $kubeadm_end (kubeadm agrees)"
  if [ "$VIA" = lifecycle ]; then
    # Exactly one renewal for the bump, and the ClusterLifecycle in sync again.
    deadline=$(( $(date +%s) + 120 ))
    until lc_in_sync && [ "$(lc_field '{.status.certificates.handledRotation}')" = 1 ]; do
      [ "$(date +%s)" -lt "$deadline" ] || fail "the ClusterLifecycle is not InSync after the rotation: $(lc_field '{.status}')"
      sleep 2
    done
    n_renew=$(kubectl get operations -l bosun.dev/lifecycle=renewCertificates -o name | wc -l)
    [ "$n_renew" = 1 ] || fail "rotation 1 generated $n_renew renewal Operations"
    echo "lifecycle: one renewal for rotation 1; earliest expiry now $(lc_field '{.status.certificates.earliestExpiry}')"
  fi
  phase "certificate renewal"
fi

# A real reboot (BOSUN_TEST_REBOOT=1, the default; with the lifecycle's sentinel), the
# declarative way: the ClusterLifecycle is set to `reboots: {when: Required}` with a
# blocking-pod selector, and generates one reboot Operation for the node that needs one. A Pod
# matching the selector runs on that node first: the reboot waits (the node is not even
# cordoned) and says which Pod holds it, until the Pod is deleted. Then the node container
# really restarts (systemd, its PID 1, ends the container on reboot; podman's restart policy
# starts it again, as firmware would), its agent comes back with a new boot identity and
# finishes the step, the node is Ready and uncordoned, the tmpfs /run lost the sentinel, and
# the ClusterLifecycle counts no reboot need and generates nothing more. No other node gets a
# task. The application is measured through its load balancer meanwhile. After the renewal: a
# reboot restarts the node's Pods, Bosun's agent among them, which the checks of Bosun's
# restarts above would count.
if [ "${BOSUN_TEST_REBOOT:-1}" = 1 ] && [ -n "${REBOOT_NODE:-}" ]; then
  rn="$REBOOT_NODE"
  boot_before=$(kubectl get nodereport "$rn" -o jsonpath='{.spec.facts.bootId}')
  restarts_before=$(podman inspect "$rn" --format '{{.RestartCount}}')
  init_before=$(podman inspect "$rn" --format '{{.State.StartedAt}}')
  kubectl apply -f - >>"$LOG" 2>&1 <<YAML || fail "creating the blocking Pod on $rn"
apiVersion: v1
kind: Pod
metadata: {name: batch-job, namespace: default, labels: {bosun.dev/stage-blocks-reboot: "true"}}
spec:
  nodeName: $rn
  terminationGracePeriodSeconds: 1
  containers:
    - {name: job, image: localhost/bosun/busybox:lab, imagePullPolicy: Never, command: [sleep, "3600"]}
YAML
  kubectl wait pod/batch-job --for=condition=Ready --timeout=120s >>"$LOG" 2>&1 || fail "the blocking Pod is not Running on $rn"
  kubectl patch clusterlifecycle cluster --type=merge \
    -p '{"spec":{"reboots":{"when":"Required","blockingPodSelector":{"matchLabels":{"bosun.dev/stage-blocks-reboot":"true"}}}}}' \
    >>"$LOG" 2>&1 || fail "setting reboots.when: Required"
  RBOP=$(generated_op reboot) || fail "no reboot Operation generated"
  rb_task() { kubectl get nodetasks -l "bosun.dev/operation=$RBOP,bosun.dev/node=$rn" -o jsonpath="{.items[0]$1}" 2>/dev/null || true; }
  # (stop_probes left reboot-app.stop behind with the others' stop files)
  rm -f "$PROBES/reboot-app.stop"
  "$HERE/probe.sh" app "$PROBES/reboot-app" "$APP_URL" & rb_probe=$!
  [ "$(kubectl get operation "$RBOP" -o jsonpath='{.spec.reboot.nodes[*]}')" = "$rn" ] \
    || fail "the generated reboot $RBOP names nodes '$(kubectl get operation "$RBOP" -o jsonpath='{.spec.reboot.nodes[*]}')', not $rn"
  # Held by the Pod: the task waits, Pending, saying so; nothing is cordoned.
  deadline=$(( $(date +%s) + 120 ))
  until [ "$(rb_task '.status.conditions[?(@.type=="RebootGate")].reason')" = BlockingPod ]; do
    [ "$(date +%s)" -lt "$deadline" ] || OP=$RBOP fail "the blocking Pod does not hold $rn's reboot within 120 s"
    sleep 2
  done
  held_msg=$(rb_task '.status.message')
  case "$held_msg" in
    "pod default/batch-job on node $rn matches spec.reboot.blockingPodSelector"*) ;;
    *) fail "the held task says: $held_msg" ;;
  esac
  sleep 10
  [ "$(rb_task '.status.phase')" = Pending ] || fail "$rn's reboot task left Pending while the blocking Pod runs"
  [ "$(kubectl get node "$rn" -o jsonpath='{.spec.unschedulable}')" != true ] || fail "$rn was cordoned while the blocking Pod runs"
  kubectl get events --field-selector "involvedObject.name=$RBOP,reason=RebootHeld" -o name | grep -q . \
    || fail "no RebootHeld Event about $RBOP"
  echo "reboot: $RBOP generated for $rn, held: $held_msg"
  held_at=$(date +%s)
  kubectl delete pod batch-job --wait=true --timeout=60s >>"$LOG" 2>&1 || fail "deleting the blocking Pod"
  wait_succeeded "$RBOP" 900 "the reboot"
  touch "$PROBES/reboot-app.stop"; wait "$rb_probe" 2>/dev/null || true
  rb_started=$(date -d "$(kubectl get nodetasks -l "bosun.dev/operation=$RBOP" -o jsonpath='{.items[0].status.steps[0].startedAt}')" +%s)
  echo "reboot: the node's task started $(( rb_started - held_at )) s after the blocking Pod's deletion began"
  # The node container's init exited and podman started it again: once.
  restarts_after=$(podman inspect "$rn" --format '{{.RestartCount}}')
  init_after=$(podman inspect "$rn" --format '{{.State.StartedAt}}')
  [ "$restarts_after" = $(( restarts_before + 1 )) ] && [ "$init_after" != "$init_before" ] \
    || fail "$rn's container restarted $((restarts_after - restarts_before)) times (started $init_before, now $init_after); expected once"
  [ "$(kubectl get nodetasks -l "bosun.dev/operation=$RBOP" -o name | wc -l)" = 1 ] \
    || fail "the reboot Operation made $(kubectl get nodetasks -l "bosun.dev/operation=$RBOP" -o name | wc -l) NodeTasks; only $rn was selected"
  step() { kubectl get nodetasks -l "bosun.dev/operation=$RBOP" -o jsonpath="{.items[0].status.steps[?(@.name==\"reboot\")].$1}"; }
  [ "$(step attempts)" = 1 ] || fail "the reboot step ran $(step attempts) times"
  [ "$(step bootId)" = "$boot_before" ] || fail "the reboot step recorded boot $(step bootId), the NodeReport said $boot_before"
  case "$(step message)" in
    "the node is back with a new boot ($boot_before → "*) ;;
    *) fail "the reboot step says: $(step message)" ;;
  esac
  boot_after=$(step message | sed -n 's/.* → \(.*\))$/\1/p')
  [[ "$boot_after" =~ ^[0-9a-f-]{36}/[0-9]+$ ]] && [ "$boot_after" != "$boot_before" ] \
    || fail "the new boot '$boot_after' is not another <boot_id>/<ticks>"
  [ "$(kubectl get node "$rn" -o jsonpath='{.spec.unschedulable}')" != true ] || fail "$rn is still cordoned after its reboot"
  "$C" check-nodes "$TO" || fail "the nodes are not all Ready at $TO after the reboot"
  # The sentinel went with the tmpfs /run; the agent that came back reports so, and the boot.
  deadline=$(( $(date +%s) + 180 ))
  until [ "$(kubectl get nodereport "$rn" -o jsonpath='{.spec.facts.bootId}')" = "$boot_after" ] \
      && [ "$(kubectl get nodereport "$rn" -o jsonpath='{.spec.facts.reboot.required}')" = false ] \
      && [ "$(lc_field '{.status.reboots.required}')" = 0 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "180 s after the reboot: NodeReport $rn says bootId $(kubectl get nodereport "$rn" -o jsonpath='{.spec.facts.bootId}') and reboot $(kubectl get nodereport "$rn" -o jsonpath='{.spec.facts.reboot}'); the ClusterLifecycle counts $(lc_field '{.status.reboots.required}')"
    sleep 3
  done
  podman exec "$rn" test ! -e /run/reboot-required || fail "/run/reboot-required is still on $rn after its reboot"
  n_reboots=$(kubectl get operations -l bosun.dev/lifecycle=reboot -o name | wc -l)
  [ "$n_reboots" = 1 ] || fail "the ClusterLifecycle generated $n_reboots reboot Operations"
  for n in "${NODES[@]}"; do
    [ "$n" = "$rn" ] && continue
    [ "$(kubectl get node "$n" -o jsonpath='{.spec.unschedulable}')" != true ] || fail "$n, which needed no reboot, is cordoned"
  done
  kubectl rollout status deploy/web --timeout=180s >>"$LOG" 2>&1 || fail "the workload is not Ready again after the reboot"
  kubectl -n bosun-system rollout status ds/bosun-agent --timeout=180s >>"$LOG" 2>&1 || fail "the agents are not all Ready after the reboot"
  kubectl-bosun status "$RBOP" | head -n 20
  read -r rb_wall rb_steps rb_dead < <("$HERE/dead-time.sh" "$RBOP") || fail "dead-time.sh $RBOP"
  rb_step_s=$(( $(date -d "$(step finishedAt)" +%s) - $(date -d "$(step startedAt)" +%s) ))
  echo "reboot: $rn rebooted (container restarts $restarts_before -> $restarts_after), boot $boot_before -> $boot_after; reboot step ${rb_step_s}s; wall ${rb_wall}s, steps running ${rb_steps}s, no step running ${rb_dead}s"
  # Measured and reported; the targets are loose (a reboot takes a node's NodePort away until
  # haproxy's checks notice), the figure is in the log and docs/reboots.md.
  "$HERE/probe.sh" report "$PROBES/reboot-app" 30 10 "application during the reboot (GET every 0.2 s through its load balancer)" \
    || fail "the application client's target during the reboot (above)"
  phase "reboot of $rn"
fi

if [ "${BOSUN_KEEP_CLUSTER:-0}" != 1 ]; then
  "$C" down >>"$LOG" 2>&1 || fail "cluster.sh down"
  "$C" check-clean || exit 1
  phase "down"
fi
echo "test-bosun-upgrade: PASS ($FROM -> $TO)"
