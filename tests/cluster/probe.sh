#!/usr/bin/env bash
# Clients that measure what users of the cluster see while Bosun works on it. Each runs at a
# fixed rate until its stop file exists or it has sent its maximum count, and writes one line
# per probe: "<epoch seconds> <1 good | 0 bad>".
#
#   probe.sh api  OUT ENDPOINT        every 1 s: a read and a small write (a ConfigMap
#                                     bosun-probe in default) through the control-plane
#                                     endpoint, each cut at 2 s; at most 3,600 probes
#   probe.sh app  OUT URL             every 0.2 s: GET URL, good when it answers 200 within
#                                     1 s; at most 18,000 requests
#   probe.sh mem  OUT LABEL           every 5 s: each node container's memory (podman stats,
#                                     containers labelled LABEL); at most 1,440 samples
#   probe.sh mem-report OUT           each node's peak
#   probe.sh health OUT NODE=IP...    every 1 s: each control plane's own API server's
#                                     /readyz (https://IP:6443, anonymous, cut at 1 s) and
#                                     every Node's Ready status through the endpoint; one
#                                     line per sample: "<epoch> <node>:<ok|no> ...
#                                     ready:<node>=<True|False|Unknown>,..."; at most 1,800
#   probe.sh health-report OUT        each change in those, with its time: where a rollout's
#                                     health gates waited
#   probe.sh report OUT MAX_GAP MAX_FAILED_PERCENT WHAT
#                                     prints sent, failed and the longest time without a good
#                                     answer; fails when a target is missed
#
# Stop a client with `touch OUT.stop`. Only addresses of the test's own cluster are probed.
set -euo pipefail
mode="${1:?usage: probe.sh api|app|report ...}"
out="${2:?usage: probe.sh $mode OUT ...}"
tick() { # sleeps until the next multiple of $1 milliseconds since $2 (date +%s%N)
  local now p rem
  now=$(date +%s%N); p=$(( $1 * 1000000 )); rem=$(( p - (now - $2) % p ))
  sleep "$(printf '%d.%09d' $(( rem / 1000000000 )) $(( rem % 1000000000 )))"
}
case "$mode" in
  api)
    endpoint="${3:?usage: probe.sh api OUT ENDPOINT}"
    start=$(date +%s%N); i=0
    kubectl -s "https://$endpoint" create configmap bosun-probe -n default --from-literal=n=0 \
      --request-timeout=5s >/dev/null 2>&1 || true
    while [ ! -e "$out.stop" ] && [ "$i" -lt 3600 ]; do
      ts=$(date +%s.%N); ok=1
      kubectl -s "https://$endpoint" get configmap bosun-probe -n default -o name --request-timeout=2s >/dev/null 2>&1 || ok=0
      kubectl -s "https://$endpoint" patch configmap bosun-probe -n default --type merge \
        -p "{\"data\":{\"n\":\"$i\"}}" --request-timeout=2s >/dev/null 2>&1 || ok=0
      echo "$ts $ok" >>"$out"
      i=$((i + 1)); tick 1000 "$start"
    done ;;
  app)
    url="${3:?usage: probe.sh app OUT URL}"
    start=$(date +%s%N); i=0
    while [ ! -e "$out.stop" ] && [ "$i" -lt 18000 ]; do
      ts=$(date +%s.%N)
      code=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "$url" 2>/dev/null || true)
      if [ "$code" = 200 ]; then echo "$ts 1" >>"$out"; else echo "$ts 0" >>"$out"; fi
      i=$((i + 1)); tick 200 "$start"
    done ;;
  mem)
    label="${3:?usage: probe.sh mem OUT LABEL}"
    start=$(date +%s%N); i=0
    while [ ! -e "$out.stop" ] && [ "$i" -lt 1440 ]; do
      ts=$(date +%s)
      # shellcheck disable=SC2046
      podman stats --no-stream --format '{{.Name}} {{.MemUsage}}' $(podman ps -q --filter "label=$label") 2>/dev/null \
        | awk -v ts="$ts" '{ print ts, $1, $2 }' >>"$out" || true
      i=$((i + 1)); tick 5000 "$start"
    done ;;
  health)
    shift 2
    start=$(date +%s%N); i=0
    while [ ! -e "$out.stop" ] && [ "$i" -lt 1800 ]; do
      line="$(date +%s)"
      for pair in "$@"; do
        r=$(curl -sk -m 1 "https://${pair#*=}:6443/readyz" 2>/dev/null || true)
        if [ "$r" = ok ]; then line+=" ${pair%%=*}:ok"; else line+=" ${pair%%=*}:no"; fi
      done
      ready=$(kubectl get nodes --request-timeout=1s \
        -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status},{end}' 2>/dev/null || echo unreadable)
      echo "$line ready:$ready" >>"$out"
      i=$((i + 1)); tick 1000 "$start"
    done ;;
  health-report)
    python3 - "$out" <<'PY'
import datetime, sys
last = None
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) < 2:
        continue
    ts, state = int(parts[0]), " ".join(parts[1:])
    if state != last:
        at = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%H:%M:%S")
        print(f"{at} {state}")
        last = state
PY
    ;;
  mem-report)
    python3 - "$out" <<'PY'
import re, sys
units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
peak = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) != 3:
        continue
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", parts[2])
    if not m or m.group(2) not in units:
        continue
    b = float(m.group(1)) * units[m.group(2)]
    peak[parts[1]] = max(peak.get(parts[1], 0), b)
print("node memory peak (podman stats every 5 s, page cache included): " + ", ".join(f"{n} {b / 1e9:.2f} GB" for n, b in sorted(peak.items())) + f"; all nodes {sum(peak.values()) / 1e9:.2f} GB")
PY
    ;;
  report)
    max_gap="${3:?}"; max_pct="${4:?}"; what="${5:?}"
    python3 - "$out" "$max_gap" "$max_pct" "$what" <<'PY'
import sys
path, max_gap, max_pct, what = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rows = [l.split() for l in open(path) if len(l.split()) == 2]
if not rows:
    sys.exit(f"{what}: no probe was recorded in {path}")
t = [(float(a), b == "1") for a, b in rows]
sent, failed = len(t), sum(1 for _, ok in t if not ok)
# The longest time without a good answer: from the last good answer (or the first probe)
# to the next good one (or the last probe).
gap, last_good, worst_at = 0.0, t[0][0], t[0][0]
for ts, ok in t:
    if ok:
        if ts - last_good > gap:
            gap, worst_at = ts - last_good, last_good
        last_good = ts
if t[-1][0] - last_good > gap:
    gap, worst_at = t[-1][0] - last_good, last_good
pct = 100.0 * failed / sent
import datetime
at = datetime.datetime.fromtimestamp(worst_at, datetime.timezone.utc).strftime("%H:%M:%S")
print(f"{what}: {sent} sent over {t[-1][0] - t[0][0]:.0f} s, {failed} failed ({pct:.2f} %), longest without a good answer {gap:.1f} s (from {at} UTC)")
missed = []
if gap > max_gap:
    missed.append(f"a gap of {gap:.1f} s (target: at most {max_gap:.0f} s)")
if pct > max_pct:
    missed.append(f"{pct:.2f} % failed (target: at most {max_pct} %)")
if missed:
    sys.exit(f"{what}: missed its target: " + "; ".join(missed))
PY
    ;;
  *) echo "probe.sh: unknown mode '$mode' (api, app, mem, health or a report)" >&2; exit 2 ;;
esac
