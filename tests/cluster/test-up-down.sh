#!/usr/bin/env bash
# End-to-end check of the real-node cluster lab: `up` with M control planes and N workers, then
#   - every Node Ready with its kubelet at the built version, CoreDNS available;
#   - a pod on the last node reaches an HTTP server pod on the first node (cross-node pod
#     traffic over the per-node pod CIDRs) and resolves kubernetes.default through CoreDNS's
#     Service (kube-proxy's iptables rules);
#   - the nodes' apt sees only the lab repository and installs kubectl from it;
#   - `down` removes everything and `check-clean` finds nothing of the lab on the host.
# Usage: test-up-down.sh [--control-planes M] [--workers N]  (default 1 and 1). Needs root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="$HERE/cluster.sh"
fail() { echo "test-up-down: FAIL: $*" >&2; "$C" down >&2 || true; exit 1; }

t0=$(date +%s)
"$C" up "$@" >/dev/null || fail "cluster.sh up $* failed"
eval "$("$C" env)"
k() { kubectl "$@"; }

want=$(kubeadm version -o short 2>/dev/null || "$BOSUN_CLUSTER_BIN/kubeadm" version -o short)
nodes=$("$C" check-nodes "$want") || fail "the nodes are not all Ready at $want"
echo "$nodes"
first=$(echo "$nodes" | head -n1 | cut -d' ' -f1)
last=$(echo "$nodes" | tail -n1 | cut -d' ' -f1)

cat <<YAML | k apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  nodeName: $first
  tolerations: [{operator: Exists}]
  containers:
  - name: web
    image: localhost/bosun/busybox:lab
    imagePullPolicy: Never
    command: [sh, -c, 'echo hello-from-$first > /tmp/index.html && exec httpd -f -p 8080 -h /tmp']
YAML
k wait --for=condition=Ready pod/web --timeout=120s >/dev/null \
  || { k describe pod web | tail -n 15 >&2; fail "pod web on $first did not become Ready"; }
ip=$(k get pod web -o jsonpath='{.status.podIP}')
cat <<YAML | k apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  nodeName: $last
  tolerations: [{operator: Exists}]
  restartPolicy: Never
  containers:
  - name: client
    image: localhost/bosun/busybox:lab
    imagePullPolicy: Never
    # busybox's nc, not wget: Debian's static busybox wget crashes in glibc without NSS files.
    command: [sh, -c, 'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 10 $ip 8080 && nslookup kubernetes.default.svc.cluster.local']
YAML
k wait --for=jsonpath='{.status.phase}'=Succeeded pod/client --timeout=120s >/dev/null \
  || { k describe pod client | tail -n 15 >&2; k logs client >&2 || true; fail "pod client on $last could not reach $ip:8080 on $first or resolve kubernetes.default"; }
out=$(k logs client)
echo "$out"
echo "$out" | grep -qx "hello-from-$first" || fail "client on $last got '$out' from $ip, expected hello-from-$first"
svc=$(k get svc kubernetes -o jsonpath='{.spec.clusterIP}')
echo "$out" | grep -q "Address: $svc" || fail "nslookup did not return the kubernetes Service address $svc"
# The nodes' apt sees only the lab repository, and installs kubeadm's packages from it.
subnet="${BOSUN_CLUSTER_SUBNET:-10.231.0.0/24}"
repo_url="http://${subnet%.*}.1:${BOSUN_CLUSTER_APT_PORT:-80}"
repo_re="${repo_url//./\\.}"
apt_out=$(podman exec -e DEBIAN_FRONTEND=noninteractive "$last" sh -c 'apt-get update && apt-cache policy kubeadm kubelet kubectl cri-tools && apt-get install -y --reinstall kubectl' 2>&1) \
  || { echo "$apt_out" >&2; fail "apt on $last could not use the lab repository"; }
echo "$apt_out" | grep -E '^(Get|Hit|Ign|Err):' | grep -v "$repo_re" \
  && fail "apt on $last reached a source other than the lab repository"
deb_ver="${want#v}-1.1"
[ "$(echo "$apt_out" | grep -A2 '^kubeadm:' | grep -c "$deb_ver")" = 2 ] \
  || { echo "$apt_out" >&2; fail "apt-cache policy kubeadm on $last: expected installed and candidate $deb_ver"; }
echo "$apt_out" | grep -q "^Get:[0-9]* $repo_re \./ kubectl $deb_ver " \
  || { echo "$apt_out" >&2; fail "kubectl $deb_ver was not downloaded from the lab repository on $last"; }
echo "apt on $last: kubeadm/kubelet/kubectl/cri-tools from $repo_url at $deb_ver"

# shellcheck disable=SC2046
podman stats --no-stream --format '{{.Name}} {{.MemUsage}}' \
  $(podman ps -q --filter "label=bosun.cluster=${BOSUN_CLUSTER_NAME:-bosun}")
up_s=$(( $(date +%s) - t0 ))

"$C" down || fail "cluster.sh down failed"
"$C" check-clean || exit 1
echo "test-up-down: PASS ($* up+checks ${up_s}s)"
