#!/usr/bin/env bash
# Checks, from a finished Operation's NodeTask timestamps, the order the planner promises for an
# upgrade: the first control plane alone first, then the other control planes one at a time,
# then the workers; a node's task spans its first step's start to its last step's end. Prints
# the order. Control-plane nodes are those whose name contains "-cp" (cluster.sh's naming).
# Usage: plan-order.sh OPERATION FIRST_CONTROL_PLANE   (KUBECONFIG of the cluster)
set -euo pipefail
op="${1:?usage: plan-order.sh OPERATION FIRST_CONTROL_PLANE}"
first="${2:?usage: plan-order.sh OPERATION FIRST_CONTROL_PLANE}"
kubectl get nodetasks -l "bosun.dev/operation=$op" -o json | python3 -c '
import json, sys
from datetime import datetime
first = sys.argv[1]
def t(s): return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
spans = []
for task in json.load(sys.stdin)["items"]:
    steps = [s for s in task.get("status", {}).get("steps", []) if s.get("startedAt") and s.get("finishedAt")]
    if not steps:
        sys.exit("plan-order: " + task["spec"]["nodeName"] + " ran no step")
    spans.append((min(t(s["startedAt"]) for s in steps), max(t(s["finishedAt"]) for s in steps), task["spec"]["nodeName"]))
spans.sort()
print("plan order: " + " -> ".join(f"{n} ({e - s:.0f} s)" for s, e, n in spans))
if spans[0][2] != first:
    sys.exit(f"plan-order: {spans[0][2]} started first, not the first control plane {first}")
cps = [x for x in spans if "-cp" in x[2]]
workers = [x for x in spans if "-cp" not in x[2]]
for a, b in zip(cps, cps[1:]):
    if b[0] < a[1]:
        sys.exit(f"plan-order: control plane {b[2]} started before {a[2]} finished: two control planes at once")
if workers and cps and min(w[0] for w in workers) < max(c[1] for c in cps):
    sys.exit("plan-order: a worker started before the last control plane finished")
' "$first"
