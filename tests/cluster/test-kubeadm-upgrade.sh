#!/usr/bin/env bash
# Proves the real-node cluster lab can carry a real minor upgrade, done by hand the way
# kubeadm's documentation describes it (no Bosun involved: this is the baseline the Bosun
# upgrade test builds on, and the reference for its timings):
#   1. `cluster.sh up --version FROM` (1 control plane, 1 worker), then the TO images loaded;
#   2. control plane: kubeadm TO from the lab's apt repository, `kubeadm upgrade apply TO`,
#      kubelet and kubectl TO, kubelet restarted through the node's systemd;
#   3. worker: drained, kubeadm TO, `kubeadm upgrade node`, kubelet TO, restarted, uncordoned;
#   4. checks: the API server and every kubelet at TO, the static Pods on TO images, every
#      Node Ready; then `down` and `check-clean`.
# Usage: test-kubeadm-upgrade.sh [FROM [TO]]   (default v1.33.13 v1.34.4; both built with
# tests/cluster/build.sh, see its header). Needs root. Prints each phase's wall time.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="$HERE/cluster.sh"
FROM="${1:-v1.33.13}"
TO="${2:-v1.34.4}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
CP="$NAME-cp1"
W="$NAME-w1"
fail() { echo "test-kubeadm-upgrade: FAIL: $*" >&2; "$C" down >&2 || true; exit 1; }
t=$(date +%s)
phase() { local now; now=$(date +%s); echo "test-kubeadm-upgrade: $1 in $((now - t))s"; t=$now; }
on() { local n="$1"; shift; podman exec -e DEBIAN_FRONTEND=noninteractive "$n" "$@"; }
deb="${TO#v}-1.1"
apt_to() { # apt_to <node> <package...>: those packages at TO from the lab repository
  local n="$1"; shift
  local pkgs=(); for p in "$@"; do pkgs+=("$p=$deb"); done
  on "$n" sh -c "apt-get update -q >/dev/null && apt-get install -y -q --allow-downgrades --allow-change-held-packages ${pkgs[*]}" \
    >>"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; fail "apt-get install ${pkgs[*]} on $n"; }
}
LOG="$(mktemp -d)/upgrade.log"
echo "test-kubeadm-upgrade: $FROM -> $TO; log: $LOG"

"$C" up --version "$FROM" --control-planes 1 --workers 1 >>"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; fail "cluster.sh up --version $FROM"; }
eval "$("$C" env)"
k() { kubectl "$@"; }
server_version() { k version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n1; }
[ "$(server_version)" = "$FROM" ] || fail "the API server is not at $FROM after up"
phase "up at $FROM"
"$C" load-images "$TO" >>"$LOG" 2>&1 || fail "cluster.sh load-images $TO"
phase "images of $TO loaded"

apt_to "$CP" kubeadm
# kubeadm's cluster health check runs a Job and gives it 15 s, which a loaded two-core
# machine can miss the first time (the Job's pod is the first to start from TO's pause
# image); a new attempt creates a new Job. Any other failure fails at once.
kubeadm_cp() { # kubeadm_cp <args...>: on the control plane, up to 3 tries on that timeout
  local try
  for try in 1 2 3; do
    if on "$CP" kubeadm "$@" >"$LOG.last" 2>&1; then cat "$LOG.last" >>"$LOG"; return 0; fi
    cat "$LOG.last" >>"$LOG"
    grep -q 'ERROR CreateJob.*did not complete' "$LOG.last" || return 1
    echo "test-kubeadm-upgrade: kubeadm $1: the health-check Job took over 15 s (try $try)"
    k -n kube-system describe pods -l job-name 2>&1 | sed -n '/^Status:/p; /^Events:/,$p' | tail -n 12 >>"$LOG"
  done
  return 1
}
kubeadm_cp upgrade plan "$TO" || { tail -n 30 "$LOG" >&2; fail "kubeadm upgrade plan $TO on $CP"; }
kubeadm_cp upgrade apply "$TO" -y || { tail -n 30 "$LOG" >&2; fail "kubeadm upgrade apply $TO on $CP"; }
phase "kubeadm upgrade apply on $CP"
k drain "$CP" --ignore-daemonsets --delete-emptydir-data --timeout=120s >>"$LOG" 2>&1 || fail "drain $CP"
apt_to "$CP" kubelet kubectl
on "$CP" systemctl daemon-reload && on "$CP" systemctl restart kubelet || fail "restart kubelet on $CP"
# The new kubelet recreates the static Pods, so the API server goes away for a while after
# the Node still reads Ready: wait until it has answered /readyz 5 times in a row.
api_steady() {
  local ok=0 deadline=$(( $(date +%s) + 240 ))
  while [ "$ok" -lt 5 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    if k get --raw /readyz >/dev/null 2>&1; then ok=$((ok + 1)); else ok=0; fi
    sleep 1
  done
}
sleep 5
api_steady || fail "the API server did not answer /readyz steadily within 240 s after the kubelet restart on $CP"
k wait --for=condition=Ready "node/$CP" --timeout=180s >/dev/null || fail "$CP not Ready after its kubelet restart"
k uncordon "$CP" >/dev/null
phase "kubelet on $CP"

k drain "$W" --ignore-daemonsets --delete-emptydir-data --timeout=120s >>"$LOG" 2>&1 || fail "drain $W"
apt_to "$W" kubeadm
on "$W" kubeadm upgrade node >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; fail "kubeadm upgrade node on $W"; }
apt_to "$W" kubelet kubectl
on "$W" systemctl daemon-reload && on "$W" systemctl restart kubelet || fail "restart kubelet on $W"
k wait --for=condition=Ready "node/$W" --timeout=180s >/dev/null || fail "$W not Ready after its kubelet restart"
k uncordon "$W" >/dev/null
phase "worker $W"

server=$(server_version)
[ "$server" = "$TO" ] || fail "the API server reports $server, expected $TO"
"$C" check-nodes "$TO" || fail "the nodes are not all Ready at $TO"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  img=$(k -n kube-system get pod "$c-$CP" -o jsonpath='{.spec.containers[0].image}')
  [ "${img##*:}" = "$TO" ] || fail "static Pod $c-$CP runs $img, expected tag $TO"
done
echo "server $server; static Pods on $TO images"
# shellcheck disable=SC2046
podman stats --no-stream --format '{{.Name}} {{.MemUsage}}' $(podman ps -q --filter "label=bosun.cluster=$NAME")
"$C" down >>"$LOG" 2>&1 || fail "cluster.sh down"
"$C" check-clean || exit 1
phase "down"
echo "test-kubeadm-upgrade: PASS ($FROM -> $TO)"
