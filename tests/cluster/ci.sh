#!/usr/bin/env bash
# The real-node tests as CI runs them (.ci/run, after the README's test command): builds what
# the cluster lab needs (cached under ~/.cache/bosun/cluster; a no-op when it is there), then
# test-bosun-upgrade.sh: Bosun installed with Helm and kubectl-bosun with krew, a step policy
# that denies the upgrade, the upgrade Operation with its control plane's agent killed in the
# middle of `kubeadm upgrade apply` and Bosun itself upgraded (helm upgrade) between nodes, and
# a certificate renewal, on 3 control planes (stacked etcd,
# behind haproxy) and 1 worker, with the application and API clients and the restart checks.
#
# CI runs the minor upgrade v1.33.13 -> v1.34.4 (BOSUN_CI_FROM / BOSUN_CI_TO override it). A
# second minor wants its own etcd and CoreDNS (v1.33.13's kubeadm names etcd 3.5.24 and CoreDNS
# 1.12.0; v1.34.4's names 3.6.5 and 1.12.1), so FROM is built with those
# (BOSUN_CI_FROM_ETCD / BOSUN_CI_FROM_COREDNS). A patch FROM such as v1.34.3 wants TO's: pass
# both empty, and build-go.sh's defaults (v1.34's) are used.
# Needs root (privileged node containers, a bridge network, iptables).
#
#   ci.sh                    build (a no-op when cached), then test
#   ci.sh --build-only       just the builds (.ci/run starts them early, in the background)
#   ci.sh --packages-only    just the host packages the builds need (apt-get, as root)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FROM="${BOSUN_CI_FROM:-v1.33.13}"
FROM_ETCD="${BOSUN_CI_FROM_ETCD-v3.5.24}"
FROM_COREDNS="${BOSUN_CI_FROM_COREDNS-v1.12.0}"
TO="${BOSUN_CI_TO:-v1.34.4}"
case "${1:-}" in
  "" | --build-only | --packages-only) ;;
  *) echo "ci.sh: unknown argument '$1' (--build-only, --packages-only or nothing)" >&2; exit 2 ;;
esac
if [ "${1:-}" = --packages-only ]; then exec "$HERE/build.sh" --packages-only; fi
t0=$(date +%s)
# The target version last, so that it stays the default build (current.env) for cluster.sh.
from_env=(BOSUN_K8S_VERSION="$FROM")
[ -z "$FROM_ETCD" ] || from_env+=(BOSUN_CLUSTER_ETCD_VERSION="$FROM_ETCD")
[ -z "$FROM_COREDNS" ] || from_env+=(BOSUN_COREDNS_VERSION="$FROM_COREDNS")
env "${from_env[@]}" "$HERE/build.sh" >/dev/null
BOSUN_K8S_VERSION="$TO" "$HERE/build.sh" >/dev/null
echo "cluster ci: builds of $FROM and $TO ready in $(( $(date +%s) - t0 ))s"
# Bosun's images, from the recipe users build (deploy/images/build.sh); install-bosun.sh builds
# them again, which is a no-op for cargo once this ran.
t1=$(date +%s)
CARGO_TARGET_DIR="${BOSUN_IMAGES_TARGET_DIR:-${BOSUN_CACHE_DIR:-$HOME/.cache/bosun}/target-images}" \
  "$HERE/../../deploy/images/build.sh" --content-tag --save "${BOSUN_CACHE_DIR:-$HOME/.cache/bosun}/cluster/bosun-images" >/dev/null
echo "cluster ci: Bosun's images (deploy/images/build.sh) ready in $(( $(date +%s) - t1 ))s"
# kubectl-bosun's krew archive (deploy/krew/build.sh, the same target directory), and the
# tools the stage installs with: helm and krew, from the Go module proxy (cached).
t1=$(date +%s)
CARGO_TARGET_DIR="${BOSUN_IMAGES_TARGET_DIR:-${BOSUN_CACHE_DIR:-$HOME/.cache/bosun}/target-images}" \
  "$HERE/../../deploy/krew/build.sh" --out "${BOSUN_CACHE_DIR:-$HOME/.cache/bosun}/cluster/krew" >/dev/null
bash "$HERE/../lab/build-helm.sh" >/dev/null
bash "$HERE/../lab/build-krew.sh" >/dev/null
echo "cluster ci: the krew archive, helm and krew ready in $(( $(date +%s) - t1 ))s"
if [ "${1:-}" = --build-only ]; then exit 0; fi
# CI owns this machine's cluster named "bosun" (BOSUN_CLUSTER_NAME): one left by an earlier run (kept with
# BOSUN_KEEP_CLUSTER=1, or a session that ended mid-test) would make `cluster.sh up` refuse.
# Outside CI, cluster.sh up refuses and says so instead.
cluster="${BOSUN_CLUSTER_NAME:-bosun}"
if [ -n "$(podman ps -a --filter "label=bosun.cluster=$cluster" --format '{{.Names}}' 2>/dev/null)" ] \
  || podman network exists "bosun-cluster-$cluster" 2>/dev/null; then
  echo "cluster ci: removing the cluster '$cluster' an earlier run left"
  "$HERE/cluster.sh" down
fi
"$HERE/test-bosun-upgrade.sh" "$FROM" "$TO"
echo "cluster ci: done in $(( $(date +%s) - t0 ))s"
