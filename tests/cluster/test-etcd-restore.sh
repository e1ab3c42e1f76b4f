#!/usr/bin/env bash
# The etcd restore of docs/operations.md ("Restoring a snapshot"), run on the real-node cluster:
#   1. etcdctl and etcdutl on every control plane (as the etcd plugin needs them);
#   2. a ConfigMap `restore-before`, then a snapshot on the first control plane, verified with
#      etcdutl (its revision printed);
#   3. a ConfigMap `restore-after`, written after the snapshot;
#   4. on every control plane: etcd's and the API server's static Pods stopped (manifests moved
#      out), the snapshot restored into a fresh /var/lib/etcd with etcdutl (each member its own
#      name and peer URL, one --initial-cluster naming all, the revision bumped and marked
#      compacted so that watchers relist), the Pods started again;
#   5. checks: etcd has every member healthy with one leader, the API server answers, and serves
#      the snapshot's state: `restore-before` is there, `restore-after` is gone.
# Every command a person would type is printed with its output (docs/operations.md shows a run).
#
#   test-etcd-restore.sh           on a cluster that is up (cluster.sh up; any number of control
#                                  planes; BOSUN_CLUSTER_NAME etc. as for cluster.sh)
#   test-etcd-restore.sh --up      brings one up first (BOSUN_CLUSTER_CPS control planes, default
#                                  1, and no worker) and takes it down afterwards
# Needs root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="$HERE/cluster.sh"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
DIR="${BOSUN_CLUSTER_DIR:-$CACHE/cluster-state/$NAME}"
UP=0; [ "${1:-}" != --up ] || UP=1
t0=$(date +%s)
fail() { echo "test-etcd-restore: FAIL: $*" >&2; [ "$UP" = 0 ] || "$C" down >&2 || true; exit 1; }
say() { echo "test-etcd-restore: $*"; }
# Runs a command on a node, printing it as a person types it and its output.
on() { local n="$1"; shift; echo "[$n]# $*"; podman exec "$n" sh -c "$*" 2>&1 | sed 's/^/    /'; return "${PIPESTATUS[0]}"; }

if [ "$UP" = 1 ]; then
  "$C" up --control-planes "${BOSUN_CLUSTER_CPS:-1}" --workers 0 >/dev/null || fail "cluster.sh up"
fi
eval "$("$C" env)"
mapfile -t NODES <"$DIR/nodes.list"
CPS=(); for n in "${NODES[@]}"; do case "$n" in *-cp*) CPS+=("$n") ;; esac; done
[ "${#CPS[@]}" -gt 0 ] || fail "no control plane in $DIR/nodes.list"
ip_of() { awk -v n="$1" '$1 == n {print $2}' "$DIR/nodes.ips"; }
BIN="$BOSUN_CLUSTER_BIN"
# The etcd tools of the newest build that has them (an etcd 3.5 build has none; v3.6 tools
# read and restore 3.5 snapshots).
for b in "$BIN" "$CACHE"/cluster/k8s-*/bin; do
  [ -x "$b/etcdctl" ] && [ -x "$b/etcdutl" ] && { TOOLS="$b"; break; }
done
[ -n "${TOOLS:-}" ] || fail "no etcdctl and etcdutl in any cluster build; run BOSUN_K8S_VERSION=v1.34.4 tests/cluster/build.sh"
say "control planes: ${CPS[*]}; etcd tools from $TOOLS"

for n in "${CPS[@]}"; do
  podman cp "$TOOLS/etcdctl" "$n:/usr/local/bin/etcdctl" && podman cp "$TOOLS/etcdutl" "$n:/usr/local/bin/etcdutl" \
    && podman exec "$n" install -d -m 0700 /var/lib/etcd-snapshots || fail "installing the etcd tools on $n"
done
ETCDCTL="etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/kubernetes/pki/etcd/ca.crt --cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt --key=/etc/kubernetes/pki/etcd/healthcheck-client.key"
cp1="${CPS[0]}"
SNAP=/var/lib/etcd-snapshots/etcd-restore-test.db

kubectl -n default delete configmap restore-before restore-after --ignore-not-found >/dev/null
kubectl -n default create configmap restore-before --from-literal=written=before-the-snapshot >/dev/null || fail "creating restore-before"
echo "# kubectl -n default create configmap restore-before"
on "$cp1" "$ETCDCTL snapshot save $SNAP >/dev/null 2>&1 && etcdutl snapshot status $SNAP -w table" || fail "the snapshot on $cp1"
snap_rev=$(podman exec "$cp1" etcdutl snapshot status "$SNAP" -w json | python3 -c 'import json, sys; print(json.load(sys.stdin)["revision"])')
kubectl -n default create configmap restore-after --from-literal=written=after-the-snapshot >/dev/null || fail "creating restore-after"
echo "# kubectl -n default create configmap restore-after"
after_rv=$(kubectl -n default get configmap restore-after -o jsonpath='{.metadata.resourceVersion}')
say "snapshot at revision $snap_rev; restore-after written at resourceVersion $after_rv"

# The snapshot file on every member.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
podman cp "$cp1:$SNAP" "$tmp/snap.db"
for n in "${CPS[@]:1}"; do podman cp "$tmp/snap.db" "$n:$SNAP" || fail "copying the snapshot to $n"; done

t_stop=$(date +%s)
for n in "${CPS[@]}"; do
  on "$n" "mkdir -p /etc/kubernetes/stopped && mv /etc/kubernetes/manifests/etcd.yaml /etc/kubernetes/manifests/kube-apiserver.yaml /etc/kubernetes/stopped/" \
    || fail "stopping etcd and the API server on $n"
done
for n in "${CPS[@]}"; do
  deadline=$(( $(date +%s) + 180 ))
  until [ -z "$(podman exec "$n" crictl ps -q --name '^(etcd|kube-apiserver)$' 2>/dev/null)" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "etcd or the API server still runs on $n 180 s after its manifest was moved out"
    sleep 2
  done
  echo "[$n]# crictl ps --name '^(etcd|kube-apiserver)\$'   (none left after $(( $(date +%s) - t_stop )) s)"
done
cluster=$(for n in "${CPS[@]}"; do echo "$n=https://$(ip_of "$n"):2380"; done | paste -sd,)
for n in "${CPS[@]}"; do
  on "$n" "mv /var/lib/etcd /var/lib/etcd.before-restore && etcdutl snapshot restore $SNAP --data-dir /var/lib/etcd --name $n --initial-advertise-peer-urls https://$(ip_of "$n"):2380 --initial-cluster $cluster --initial-cluster-token bosun-restored --bump-revision 1000000000 --mark-compacted >/tmp/etcd-restore.log 2>&1 || { cat /tmp/etcd-restore.log; exit 1; }; ls /var/lib/etcd/member" \
    || fail "etcdutl snapshot restore on $n"
done
for n in "${CPS[@]}"; do
  on "$n" "mv /etc/kubernetes/stopped/etcd.yaml /etc/kubernetes/stopped/kube-apiserver.yaml /etc/kubernetes/manifests/" \
    || fail "starting etcd and the API server on $n"
done
deadline=$(( $(date +%s) + 300 ))
until [ "$(kubectl get --raw /readyz 2>/dev/null)" = ok ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the API server is not ready 300 s after the restore"
  sleep 3
done
say "API server ready $(( $(date +%s) - t_stop )) s after etcd was stopped"

on "$cp1" "$ETCDCTL member list -w table && $ETCDCTL endpoint status --cluster -w table && $ETCDCTL endpoint health --cluster" \
  || fail "etcd is not whole after the restore"
members=$(podman exec "$cp1" sh -c "$ETCDCTL member list -w json" | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["members"]))')
[ "$members" = "${#CPS[@]}" ] || fail "etcd has $members members after the restore, expected ${#CPS[@]}"
echo "# kubectl -n default get configmap restore-before restore-after"
kubectl -n default get configmap restore-before restore-after 2>&1 | sed 's/^/    /' || true
[ "$(kubectl -n default get configmap restore-before -o jsonpath='{.data.written}')" = before-the-snapshot ] \
  || fail "restore-before is not served after the restore"
if kubectl -n default get configmap restore-after >/dev/null 2>&1; then
  fail "restore-after, written after the snapshot, is still served after the restore"
fi
kubectl -n default delete configmap restore-before >/dev/null
say "PASS: ${#CPS[@]} control plane(s) restored from the snapshot at revision $snap_rev in $(( $(date +%s) - t_stop )) s; restore-before served, restore-after gone (total $(( $(date +%s) - t0 )) s)"
if [ "$UP" = 1 ]; then "$C" down >/dev/null || fail "cluster.sh down"; fi
