# Sourced by build-binaries.sh, build-registry.sh, build-helm.sh and build-krew.sh: the part of a cached Go build that both
# share. The caller sets, before sourcing:
#   WHAT   - the name in messages ("lab build", "registry tools build");
#   OUT    - the cache directory of this set of pinned versions (BIN is $OUT/bin);
#   BINS   - the binaries that must end up in $BIN;
#   NO_GO_HINT - one sentence for when Go is missing.
# On return either every binary is present (it printed $BIN on stdout and exited 0), or the
# caller holds the build lock, `missing` lists what to build, $LOG is empty and the Go
# environment is set. Exit status 3 means Go is not installed.

BIN="$OUT/bin"
LOG="$OUT/build.log"

list_missing() {
  missing=()
  for b in "${BINS[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
}
list_missing
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi

if ! command -v go >/dev/null 2>&1; then
  echo "$WHAT: Go is not installed or not on PATH, and ${missing[*]} are not built yet in $BIN. $NO_GO_HINT" >&2
  exit 3
fi

mkdir -p "$BIN"
# One build at a time per version set (CI, `lab up` and parallel tests may all start it);
# whoever waited re-checks what is still missing.
exec 9>"$OUT/.build.lock"
if ! flock -n 9; then
  echo "$WHAT: another build of $OUT is running; waiting for it (log: $LOG)" >&2
  flock 9
fi
list_missing
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi

: >"$LOG"
started=$(date +%s)
echo "$WHAT: started $(date -u +%FT%TZ) for ${missing[*]}" >>"$LOG"
export CGO_ENABLED=0 GOFLAGS="-mod=mod" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

fail() { echo "$WHAT: $1 failed; the last lines of the build log ($LOG):" >&2; tail -n 25 "$LOG" >&2; exit 1; }
finished() { echo "$WHAT: finished $(date -u +%FT%TZ) after $(( $(date +%s) - started ))s" | tee -a "$LOG" >&2; }
