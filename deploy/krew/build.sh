#!/usr/bin/env bash
# Builds kubectl-bosun for krew: the static x86_64-unknown-linux-musl binary (cargo build
# --profile ship --locked, as deploy/images/build.sh builds the images' binaries), an archive
# kubectl-bosun_v<version>_linux_amd64.tar.gz holding it and the LICENSE, and bosun.yaml, the
# manifest deploy/krew/bosun.yaml with that archive's sha256.
#
# Usage: deploy/krew/build.sh --out DIR
# Then, offline (docs/install.md, "With krew"):
#   kubectl krew install --manifest=DIR/bosun.yaml --archive=DIR/kubectl-bosun_v<version>_linux_amd64.tar.gz
#
# Needs: cargo and rustup (the musl target is added when missing), musl-gcc (musl-tools),
# strip (binutils). Environment: CARGO_TARGET_DIR (default ./target), BOSUN_GIT_COMMIT (the
# commit `--version` prints, when there is no .git).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET=x86_64-unknown-linux-musl
say() { echo "krew: $*" >&2; }
die() { echo "krew: $*" >&2; exit 1; }

out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--out DIR, --help)" ;;
  esac
done
[ -n "$out" ] || die "--out DIR is required (where the archive and the manifest go)"

command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (https://rustup.rs)"
command -v musl-gcc >/dev/null \
  || die "musl-gcc not found: it compiles ring's C parts for $TARGET; install musl-tools (apt-get install musl-tools)"
command -v strip >/dev/null || die "strip not found: install binutils"
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
  say "adding the Rust target $TARGET (rustup target add)"
  rustup target add "$TARGET" >&2
fi

cd "$ROOT"
version=$(awk '/^\[/ {section = $0} section == "[workspace.package]" && $1 == "version" {gsub(/"/, "", $3); print $3; exit}' Cargo.toml)
[ -n "$version" ] || die "no [workspace.package] version in $ROOT/Cargo.toml"
grep -q "^  version: v$version\$" deploy/krew/bosun.yaml \
  || die "deploy/krew/bosun.yaml does not carry the workspace's version v$version"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"

t0=$(date +%s)
say "building the static kubectl-bosun (cargo build --profile ship --locked --target $TARGET)"
cargo build --profile ship --locked --target "$TARGET" -p kubectl-bosun

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
strip -o "$work/kubectl-bosun" "$target_dir/$TARGET/ship/kubectl-bosun"
cp LICENSE "$work/LICENSE"
chmod 0755 "$work/kubectl-bosun"; chmod 0644 "$work/LICENSE"
touch -d "@$epoch" "$work/kubectl-bosun" "$work/LICENSE"
# It runs, and says which version it is.
got=$("$work/kubectl-bosun" --version) || die "the built kubectl-bosun does not run"
[[ "$got" == "kubectl-bosun $version (commit "* ]] || die "kubectl-bosun --version printed '$got'"

mkdir -p "$out"
archive="kubectl-bosun_v${version}_linux_amd64.tar.gz"
# The same bytes for the same binary: sorted names, fixed owner and times, no gzip timestamp.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$work" \
  -cf - kubectl-bosun LICENSE | gzip -9n >"$out/$archive.tmp"
mv "$out/$archive.tmp" "$out/$archive"
sum=$(sha256sum "$out/$archive" | cut -d' ' -f1)
sed "s/\"0\{64\}\"/\"$sum\"/" deploy/krew/bosun.yaml >"$out/bosun.yaml"
grep -q "$sum" "$out/bosun.yaml" || die "could not write the sha256 into $out/bosun.yaml"
say "$out/$archive ($(stat -c %s "$out/$archive") bytes, sha256 $sum) and $out/bosun.yaml, in $(( $(date +%s) - t0 ))s"
echo "$out/$archive"
