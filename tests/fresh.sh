#!/usr/bin/env bash
# Proves the README's two commands on a brand-new machine, the way a newcomer would meet them:
#
#  1. clones HEAD into a new temporary directory;
#  2. gives the run a new, empty HOME, so every cache under it starts empty: ~/.cache/bosun
#     (the Go-built Kubernetes binaries, the lab's state), Go's build and module caches
#     (GOCACHE, GOMODCACHE, GOPATH), Cargo's registry (CARGO_HOME) and target directory;
#     only the toolchains themselves (rustup's, Go's) and the machine's packages are shared;
#  3. runs the two commands one after the other, each with its own empty Cargo target
#     directory and its own lab state directory, so neither passes because of what the other
#     left behind; the second reuses only what the first downloaded or built with Go;
#  4. prints each command's exit code and wall time, stops the labs it started and removes
#     the temporary directory (unless --keep).
#
#   bash tests/fresh.sh                 # demo first, then the tests (README order)
#   bash tests/fresh.sh --tests-first   # the other order
#   bash tests/fresh.sh --keep          # keep the temporary directory (logs, caches)
#   bash tests/fresh.sh --only tests    # just one of the two commands (tests or demo)
#   bash tests/fresh.sh --only ci       # CI's whole run instead: `bash .ci/run` (fmt, the suite,
#                                       # clippy, the real-node cluster stage), as root
#
# The lab listens on 127.0.0.1 ports BOSUN_LAB_PORT_BASE..+3 (default 26443 here, so a lab
# already running on the default 16443 is not disturbed). Expect about an hour on two cores
# cold: the Go build of etcd and Kubernetes, two cold Cargo builds, the whole test suite.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"

order=(demo tests)
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tests-first) order=(tests demo) ;;
    --keep) keep=1 ;;
    --only)
      case "${2:-}" in
        tests | demo | ci) order=("$2"); shift ;;
        *) echo "fresh.sh: --only takes 'tests', 'demo' or 'ci', got '${2:-}'" >&2; exit 2 ;;
      esac
      ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in git cargo rustup go; do
  command -v "$tool" >/dev/null || { echo "fresh.sh: $tool is not on PATH; install it first" >&2; exit 2; }
done

# Two cold Cargo target directories, the Go caches and the labs take about 20 GiB; CI's whole
# run adds the real-node builds (two Kubernetes releases, a node image, the images' static
# build) and four node containers with both releases' images: on 2026-12-05 a cold `--only ci`
# with 46 GiB free filled the disk 46 minutes in, importing the second release's images into
# the last node. A full disk shows up as linker bus errors, "database or disk is full" or
# "no space left on device" deep inside a build or the cluster stage.
need_gib=25
for name in "${order[@]}"; do [ "$name" = ci ] && need_gib=60; done
need_kib=$((need_gib * 1024 * 1024))
free_kib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print $4}')
if [ "${free_kib:-0}" -lt "$need_kib" ]; then
  echo "fresh.sh: only $((free_kib / 1024 / 1024)) GiB free under ${TMPDIR:-/tmp}; it needs about $need_gib GiB (set TMPDIR to a roomier disk, or free space: ~/.cache/bosun/target and old podman images are the largest)" >&2
  exit 2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/bosun-fresh.XXXXXX")"
echo "fresh.sh: working in $work"
git clone --quiet "$src" "$work/bosun"
echo "fresh.sh: cloned $(git -C "$work/bosun" rev-parse --short HEAD) ($(git -C "$work/bosun" log -1 --format=%s | cut -c1-70))"

# The toolchains stay where they are installed; everything they cache moves to the new HOME.
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_bin="$(dirname "$(command -v cargo)")"
go_bin="$(dirname "$(command -v go)")"
mkdir -p "$work/home"
run_env=(
  env -i
  HOME="$work/home"
  PATH="$cargo_bin:$go_bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  RUSTUP_HOME="$rustup_home"
  CARGO_HOME="$work/home/.cargo"
  TERM="${TERM:-dumb}"
  LANG=C.UTF-8
  BOSUN_LAB_PORT_BASE="${BOSUN_LAB_PORT_BASE:-26443}"
)
# Anything the machine's environment sets for the toolchains is kept (e.g. GOFLAGS).
for var in GOFLAGS GOTOOLCHAIN GOPROXY GOSUMDB RUSTUP_TOOLCHAIN; do
  [ -n "${!var:-}" ] && run_env+=("$var=${!var}")
done

declare -A rc secs
stop_lab() { # $1: the command's name (its lab state directory)
  local target="$work/target-$1"
  if [ -x "$target/debug/lab" ]; then
    "${run_env[@]}" BOSUN_LAB_DIR="$work/lab-$1" "$target/debug/lab" down >/dev/null 2>&1 || true
  fi
}
cleanup() {
  for name in "${order[@]}"; do stop_lab "$name"; done
  if [ "$keep" = 1 ]; then echo "fresh.sh: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

for name in "${order[@]}"; do
  case "$name" in
    demo) cmd=(bash tests/lab/demo.sh) ;;
    tests) cmd=(bash tests/run.sh) ;;
    ci) cmd=(bash .ci/run) ;;
  esac
  log="$work/$name.log"
  echo "fresh.sh: running '${cmd[*]}' (log: $log)"
  start=$(date +%s)
  set +e
  (cd "$work/bosun" && "${run_env[@]}" CARGO_TARGET_DIR="$work/target-$name" BOSUN_LAB_DIR="$work/lab-$name" \
    "${cmd[@]}" </dev/null >"$log" 2>&1)
  rc[$name]=$?
  set -e
  secs[$name]=$(($(date +%s) - start))
  stop_lab "$name"
  # About 10 GiB each; the next command builds its own. --keep keeps the last one.
  if [ "$keep" = 0 ] || [ "$name" != "${order[-1]}" ]; then rm -rf "$work/target-$name"; fi
  echo "fresh.sh: '${cmd[*]}' exited ${rc[$name]} after ${secs[$name]} s; its last lines:"
  tail -n 15 "$log" | sed 's/^/    /'
done

echo
echo "fresh.sh: summary ($(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB)"
status=0
for name in "${order[@]}"; do
  printf '  %-5s exit %s  %4d s (%d min %02d s)\n' "$name" "${rc[$name]}" "${secs[$name]}" \
    $((secs[$name] / 60)) $((secs[$name] % 60))
  [ "${rc[$name]}" = 0 ] || status=1
done
# (Only the logs of the commands that ran: a missing one made grep, and with pipefail this
# script, exit 2 after a successful run.)
logs=(); for name in "${order[@]}"; do logs+=("$work/$name.log"); done
{ grep -h -E '^test result:' "${logs[@]}" || true; } \
  | awk '{p += $4; f += $6} END {if (NR) printf "  tests: %d passed, %d failed (%d test binaries)\n", p, f, NR}'
exit "$status"
