#!/usr/bin/env bash
# What the container runtime really gave Bosun's running processes, read from the kernel in
# every node of the running real-node cluster (/proc/<pid>/status and mounts), against what
# docs/security.md promises:
#   - the controller (2 replicas): user 65532, no capability, no_new_privs, a seccomp filter,
#     a read-only root file system;
#   - the agent (one per node): root, exactly the nine capabilities deploy/agent/daemonset.yaml
#     adds (CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID, KILL, SETGID, SETUID,
#     SYS_CHROOT: CapEff 0x400ff), no_new_privs, a seccomp filter, a read-only root.
# Prints one line per process and fails on any difference. Environment: as cluster.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
DIR="${BOSUN_CLUSTER_DIR:-$CACHE/cluster-state/$NAME}"
[ -f "$DIR/nodes.list" ] || { echo "check-bosun-processes: cluster '$NAME' is not up" >&2; exit 1; }

# Run inside a node: "<comm> <effective uid> <CapEff> <NoNewPrivs> <Seccomp> <root mount options>"
# for each bosun process (comm is cut to 15 characters: bosun-controlle). Only the first
# process of each container's tree counts: an agent's compile-plugin child is its own.
probe='
for d in /proc/[0-9]*; do
  c=$(cat "$d/comm" 2>/dev/null) || continue
  case "$c" in bosun-agent|bosun-controlle) ;; *) continue ;; esac
  ppid=$(awk "/^PPid:/ {print \$2}" "$d/status")
  [ "$(cat /proc/$ppid/comm 2>/dev/null)" != "$c" ] || continue
  uid=$(awk "/^Uid:/ {print \$3}" "$d/status")
  cap=$(awk "/^CapEff:/ {print \$2}" "$d/status")
  nnp=$(awk "/^NoNewPrivs:/ {print \$2}" "$d/status")
  sec=$(awk "/^Seccomp:/ {print \$2}" "$d/status")
  root=$(awk "\$2 == \"/\" {split(\$4, o, \",\"); r = o[1]} END {print r}" "$d/mounts")
  echo "$c $uid $cap $nnp $sec $root"
done'

agents=0 controllers=0 bad=0
while read -r node; do
  while read -r comm uid cap nnp sec root; do
    case "$comm" in
      bosun-agent) want="0 00000000000400ff 1 2 ro"; agents=$((agents + 1)) ;;
      *) want="65532 0000000000000000 1 2 ro"; controllers=$((controllers + 1)) ;;
    esac
    got="$uid $cap $nnp $sec $root"
    if [ "$got" = "$want" ]; then
      echo "check-bosun-processes: $node: $comm: uid $uid, CapEff $cap, NoNewPrivs $nnp, Seccomp $sec, root $root: as documented"
    else
      echo "check-bosun-processes: $node: $comm: got 'uid CapEff NoNewPrivs Seccomp root' = '$got', docs/security.md says '$want'" >&2
      bad=$((bad + 1))
    fi
  done < <(podman exec -i "$node" sh -s <<<"$probe")
done <"$DIR/nodes.list"
nodes=$(wc -l <"$DIR/nodes.list")
[ "$agents" -eq "$nodes" ] || { echo "check-bosun-processes: $agents agent processes on $nodes nodes" >&2; bad=$((bad + 1)); }
[ "$controllers" -ge 1 ] || { echo "check-bosun-processes: no controller process found" >&2; bad=$((bad + 1)); }
[ "$bad" -eq 0 ] || exit 1
echo "check-bosun-processes: $agents agents and $controllers controllers run with the documented privileges"
