#!/usr/bin/env bash
# The dead time of a finished Operation: its wall time (creation to the last step's end) less
# the time at least one of its steps was running (the union of every step's startedAt ..
# finishedAt over all its NodeTasks). What is left is time no step ran: picking tasks up,
# health gates settling between nodes, and any time lost to a controller or agent that was
# not working (a crash-loop while the API server restarted, a long retry backoff).
# Prints "wall steps dead" in seconds (one decimal). With a second argument, fails when the
# dead time exceeds it.
# With --gaps first, prints instead where the dead time went: each stretch of at least 1 s
# with no step running, as "GAP_SECONDS after NODE/STEP ended, before NODE/STEP started"
# (the stretch before the first step is measured from the Operation's creation).
# Usage: dead-time.sh [--gaps] OPERATION [MAX_DEAD_SECONDS]   (KUBECONFIG of the cluster)
set -euo pipefail
gaps=0
if [ "${1:-}" = --gaps ]; then gaps=1; shift; fi
op="${1:?usage: dead-time.sh [--gaps] OPERATION [MAX_DEAD_SECONDS]}"
max="${2:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kubectl get operation "$op" -o json >"$tmp/op.json"
kubectl get nodetasks -l "bosun.dev/operation=$op" -o json >"$tmp/tasks.json"
python3 - "$tmp/op.json" "$tmp/tasks.json" "$max" "$gaps" <<'PY'
import json, sys
from datetime import datetime

def t(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

op = json.load(open(sys.argv[1]))
tasks = json.load(open(sys.argv[2]))["items"]
limit = float(sys.argv[3]) if sys.argv[3] else None
named = sorted(
    (t(s["startedAt"]), t(s["finishedAt"]), task["spec"]["nodeName"] + "/" + s["name"])
    for task in tasks
    for s in task.get("status", {}).get("steps", [])
    if s.get("startedAt") and s.get("finishedAt")
)
spans = [(start, end) for start, end, _ in named]
if not spans:
    sys.exit(f"dead-time: Operation {op['metadata']['name']} has no finished step")
if sys.argv[4] == "1":
    last_end, last_name = t(op["metadata"]["creationTimestamp"]), "the Operation's creation"
    for start, end, name in named:
        if start - last_end >= 1.0:
            print(f"{start - last_end:.1f} after {last_name} ended, before {name} started")
        if end > last_end:
            last_end, last_name = end, name
    sys.exit(0)
busy, cur_start, cur_end = 0.0, None, None
for start, end in spans:
    if cur_end is None or start > cur_end:
        if cur_end is not None:
            busy += cur_end - cur_start
        cur_start, cur_end = start, end
    else:
        cur_end = max(cur_end, end)
busy += cur_end - cur_start
wall = max(e for _, e in spans) - t(op["metadata"]["creationTimestamp"])
dead = wall - busy
print(f"{wall:.1f} {busy:.1f} {dead:.1f}")
if limit is not None and dead > limit:
    sys.exit(f"dead-time: Operation {op['metadata']['name']}: {dead:.1f} s with no step running (wall {wall:.1f} s, steps {busy:.1f} s), more than {limit:.0f} s")
PY
