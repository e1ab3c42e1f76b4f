#!/usr/bin/env bash
# Builds the bosun-controller and bosun-agent images for the real-node cluster lab, offline,
# from binaries this workspace built (no registry, no base image to pull): each image is one
# layer holding the stripped binary, the shared libraries `ldd` lists for it (glibc,
# libgcc_s, libm) and a passwd file, made with umoci like the Kubernetes images of
# build-images.sh. deploy/images/*.Dockerfile are the release recipes (static musl binaries on
# distroless); these lab images carry the same binaries' code, dynamically linked.
#
# The tag is a digest of the binaries, so a rebuilt binary is a new tag and `kubectl apply`
# rolls the Pods (the image pull policy of a non-latest tag is IfNotPresent: the imported
# image is used, nothing is pulled).
# Usage: build-bosun-images.sh <dir with bosun-controller and bosun-agent>. Prints the image
# directory (images.list: repository tag archive) as its last line.
set -euo pipefail

BIN="${1:?usage: build-bosun-images.sh <directory holding bosun-controller and bosun-agent>}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=oci.sh
. "$HERE/oci.sh"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
for b in bosun-controller bosun-agent; do
  [ -x "$BIN/$b" ] || { echo "bosun images: no $BIN/$b; build it with cargo build --locked --bins" >&2; exit 1; }
done
key=$( { sha256sum "$BIN/bosun-controller" "$BIN/bosun-agent" "$HERE/build-bosun-images.sh" "$HERE/oci.sh"; } \
  | sha256sum | cut -c1-12)
OUT="$CACHE/cluster/bosun-images-$key"
mkdir -p "$OUT"
exec 8>"$OUT/.lock"
flock 8
if [ -f "$OUT/images.list" ]; then echo "$OUT"; exit 0; fi
# Only the newest build is kept: older ones are a few hundred MB each and useless once the
# binaries changed.
find "$CACHE/cluster" -maxdepth 1 -name 'bosun-images-*' ! -path "$OUT" -exec rm -rf {} +
LOG="$OUT/build.log"
: >"$LOG"
t0=$(date +%s)
work="$OUT/work"; rm -rf "$work"; mkdir -p "$work"

# mk_image <name> <binary> <uid:gid>
mk_image() {
  local name="$1" binary="$2" user="$3"
  local c="$work/$name-content"
  local repo="localhost/bosun/$name" tag="lab-$key"
  mkdir -p "$c/usr/local/bin" "$c/tmp" "$c/etc"
  chmod 1777 "$c/tmp"
  strip -o "$c/usr/local/bin/$name" "$binary"
  local lib
  for lib in $(ldd "$binary" | awk '/=> \// {print $3} /^\t\// {print $1}'); do
    mkdir -p "$c$(dirname "$lib")"
    cp -L "$lib" "$c$lib"
  done
  # The dynamic loader at the path the binary names (/lib64 is a symlink on the host).
  [ -e "$c/lib64/ld-linux-x86-64.so.2" ] || { mkdir -p "$c/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$c/lib64/"; }
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$c/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$c/etc/group"
  oci_archive "$repo:$tag" "$c" "$OUT/$name.tar" "$LOG" \
    --config.entrypoint "/usr/local/bin/$name" --config.user "$user"
  rm -rf "$c"
  echo "$repo $tag $name.tar" >>"$OUT/images.list.tmp"
}
: >"$OUT/images.list.tmp"
mk_image bosun-controller "$BIN/bosun-controller" 65532:65532
mk_image bosun-agent "$BIN/bosun-agent" 0:0
rm -rf "$work"
mv "$OUT/images.list.tmp" "$OUT/images.list"
echo "bosun images: built $(wc -l <"$OUT/images.list") images in $(( $(date +%s) - t0 ))s ($(du -sh "$OUT" | cut -f1))" | tee -a "$LOG" >&2
echo "$OUT"
