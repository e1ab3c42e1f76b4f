#!/usr/bin/env bash
# Where the time of a finished Operation went, per node and in total, from its NodeTasks'
# statuses: each step's startedAt/finishedAt and, for agent steps, hostMilliseconds (the time
# its plugin waited for granted host commands and service actions: kubeadm, apt, systemd).
#
#   node time     = first step started .. last step finished, per NodeTask
#   outside Bosun = hostMilliseconds of the agent steps (kubeadm, apt, the kubelet restart)
#                   + the controller's waiting steps (drain, wait-*: evictions and the PDB,
#                   the Node turning Ready, the API server answering)
#                   + the kubelet plugin's `settleSeconds` (default 5): after the restart the
#                   plugin requires kubelet.service to stay running that long, a wait the
#                   step's parameters set, like the health gates' settleSeconds below. Only
#                   the settle is counted, not the polls until the unit first runs.
#   Bosun's share = node time - outside Bosun: picking the step up, verifying and compiling
#                   the plugin, preflight, policies, running the wasm, status writes, cordon
#                   and uncordon, and the gaps between steps.
# The Operation line adds the gaps between nodes (the Operation's creation to its last step),
# less each node's settleSeconds (its health gates holding it after its last step).
# Usage: bosun-share.sh OPERATION   (KUBECONFIG of the cluster; kubectl on PATH)
set -euo pipefail
op="${1:?usage: bosun-share.sh OPERATION}"
kubectl get operation "$op" -o json >/tmp/bosun-share-op.$$.json
kubectl get nodetasks -l "bosun.dev/operation=$op" -o json >/tmp/bosun-share-tasks.$$.json
trap 'rm -f /tmp/bosun-share-op.$$.json /tmp/bosun-share-tasks.$$.json' EXIT
python3 - /tmp/bosun-share-op.$$.json /tmp/bosun-share-tasks.$$.json <<'PY'
import json, sys
from datetime import datetime

def t(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

op = json.load(open(sys.argv[1]))
tasks = json.load(open(sys.argv[2]))["items"]
WAITS = ("drain", "wait-")
total_outside = 0.0
last_end = 0.0
print(f"{'node':<14} {'node time':>10} {'host cmds':>10} {'waits':>10} {'Bosun':>8} {'share':>7}")
for task in sorted(tasks, key=lambda x: min(t(s["startedAt"]) for s in x["status"]["steps"] if s.get("startedAt"))):
    steps = [s for s in task["status"].get("steps", []) if s.get("startedAt") and s.get("finishedAt")]
    start = min(t(s["startedAt"]) for s in steps)
    end = max(t(s["finishedAt"]) for s in steps)
    last_end = max(last_end, end)
    host = sum(s.get("hostMilliseconds", 0) for s in steps) / 1000
    waits = sum(t(s["finishedAt"]) - t(s["startedAt"]) for s in steps
                if s["name"].startswith(WAITS) and "hostMilliseconds" not in s)
    specs = {x["name"]: x for x in task["spec"].get("steps", [])}
    def kubelet_settle(s):
        # The restart's settle, bounded by what the step spent outside host calls.
        spec = specs.get(s["name"], {})
        if spec.get("plugin") != "kubelet" or spec.get("action") != "restart" or s.get("phase") != "Succeeded":
            return 0.0
        want = float((spec.get("params") or {}).get("settleSeconds", 5))
        spent = t(s["finishedAt"]) - t(s["startedAt"]) - s.get("hostMilliseconds", 0) / 1000
        return max(0.0, min(want, spent))
    waits += sum(kubelet_settle(s) for s in steps)
    wall = end - start
    bosun = wall - host - waits
    total_outside += host + waits
    print(f"{task['spec']['nodeName']:<14} {wall:>9.1f}s {host:>9.1f}s {waits:>9.1f}s {bosun:>7.1f}s {100 * bosun / wall:>6.1f}%")
    for s in steps:
        d = t(s["finishedAt"]) - t(s["startedAt"])
        h = s.get("hostMilliseconds")
        side = f"host {h / 1000:.1f}s" if h is not None else ("k8s wait" if s["name"].startswith(WAITS) else "controller")
        if kubelet_settle(s):
            side += f" + settle {kubelet_settle(s):.1f}s"
        print(f"    {s['name']:<18} {d:>8.2f}s  {side}")
op_wall = last_end - t(op["metadata"]["creationTimestamp"])
# Each node's health gates hold its task settleSeconds after its last step (a wait the user
# asked for, not Bosun's work); the last node's settling ends after its last step.
settle = float(op["spec"].get("healthGates", {}).get("settleSeconds", 0)) * max(len(tasks) - 1, 0)
total_outside += settle
bosun = op_wall - total_outside
print(f"{'Operation':<14} {op_wall:>9.1f}s {'':>10} {'':>10} {bosun:>7.1f}s {100 * bosun / op_wall:>6.1f}%  (creation, 1 s resolution, to the last step)")
PY
