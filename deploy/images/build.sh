#!/usr/bin/env bash
# Builds Bosun's two images, bosun-controller and bosun-agent, from this workspace: static
# x86_64-unknown-linux-musl binaries (cargo build --profile ship --locked: release with fat LTO,
# Cargo.toml) in FROM-scratch images
# (deploy/images/*.Dockerfile). Nothing is pulled from a registry.
#
# Usage: deploy/images/build.sh [--push REGISTRY] [--tag TAG | --content-tag] [--save DIR]
#   --push REGISTRY  name the images REGISTRY/bosun-controller and REGISTRY/bosun-agent and
#                    push them there (log in first: `podman login REGISTRY`). Without it the
#                    images are named localhost/bosun/<name> and stay local.
#   --tag TAG        the images' tag. Default: the workspace's version (Cargo.toml).
#   --content-tag    tag <version>-<12 hex of the binaries' sha256> instead: a rebuilt binary
#                    gets a new tag, so `kubectl apply` of the new tag rolls the Pods (for
#                    development clusters; the real-node tests use it).
#   --save DIR       also write each image as an OCI archive, DIR/<name>.tar, and list them in
#                    DIR/images.list ("repository tag archive" per line).
#
# Needs: cargo and rustup (the musl target is added when missing), musl-gcc (Debian and
# Ubuntu: apt-get install musl-tools; ring's C parts are compiled with it), strip (binutils),
# a CA bundle at /etc/ssl/certs/ca-certificates.crt (ca-certificates), and podman or docker.
# Environment: CARGO_TARGET_DIR (where cargo builds; default ./target), SOURCE_DATE_EPOCH (the
# images' creation time; default the last commit's time), BOSUN_GIT_COMMIT (the commit
# `--version` prints, when there is no .git).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET=x86_64-unknown-linux-musl
say() { echo "images: $*" >&2; }
die() { echo "images: $*" >&2; exit 1; }

registry="" tag="" content_tag=false save=""
while [ $# -gt 0 ]; do
  case "$1" in
    --push) registry="${2:?--push needs a registry, e.g. --push registry.example.com/bosun}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a tag}"; shift 2 ;;
    --content-tag) content_tag=true; shift ;;
    --save) save="${2:?--save needs a directory}"; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--push REGISTRY, --tag TAG, --content-tag, --save DIR, --help)" ;;
  esac
done
[ -z "$tag" ] || ! $content_tag || die "--tag and --content-tag both name the tag; give one"

# What the build needs, each missing piece named with how to get it.
command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (https://rustup.rs)"
command -v musl-gcc >/dev/null \
  || die "musl-gcc not found: it compiles ring's C parts for $TARGET; install musl-tools (apt-get install musl-tools)"
command -v strip >/dev/null || die "strip not found: install binutils"
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || die "no CA bundle at $ca: install ca-certificates (the agent verifies https plugin sources against it)"
if command -v podman >/dev/null; then engine=podman
elif command -v docker >/dev/null; then engine=docker
else die "neither podman nor docker found: install one to build the images"; fi
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
  say "adding the Rust target $TARGET (rustup target add)"
  rustup target add "$TARGET" >&2
fi

cd "$ROOT"
# The workspace's version: [workspace.package] version in Cargo.toml, which every crate uses.
version=$(awk '/^\[/ {section = $0} section == "[workspace.package]" && $1 == "version" {gsub(/"/, "", $3); print $3; exit}' Cargo.toml)
[ -n "$version" ] || die "no [workspace.package] version in $ROOT/Cargo.toml"
revision="${BOSUN_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
# The images' creation time. Not exported: the cc crate reruns every C build script when
# SOURCE_DATE_EPOCH changes, and a new commit would rebuild ring and everything above it.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"

t0=$(date +%s)
say "building the static binaries (cargo build --profile ship --locked --target $TARGET)"
# No --remap-path-prefix of the checkout: RUSTFLAGS are part of every crate's fingerprint, so
# a flag naming the checkout's path would rebuild every dependency whenever the checkout moves
# (CI's clone and a developer's share the target directory). The binaries therefore carry the
# build's source paths in their panic locations.
cargo build --profile ship --locked --target "$TARGET" -p bosun-controller -p bosun-agent
t_build=$(( $(date +%s) - t0 ))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in bosun-controller bosun-agent; do
  ctx="$work/$name"
  mkdir -p "$ctx/etc/ssl/certs"
  strip -o "$ctx/$name" "$target_dir/$TARGET/ship/$name"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/etc/group"
  cp "$ca" "$ctx/etc/ssl/certs/ca-certificates.crt"
  chmod 0644 "$ctx/etc/passwd" "$ctx/etc/group" "$ctx/etc/ssl/certs/ca-certificates.crt"
  touch -d "@$epoch" "$ctx/$name" "$ctx/etc/passwd" "$ctx/etc/group" "$ctx/etc/ssl/certs/ca-certificates.crt"
done
if $content_tag; then
  tag="$version-$(cat "$work/bosun-controller/bosun-controller" "$work/bosun-agent/bosun-agent" | sha256sum | cut -c1-12)"
fi
tag="${tag:-$version}"
prefix="${registry:-localhost/bosun}"

[ -z "$save" ] || { mkdir -p "$save"; : >"$save/images.list.tmp"; }
for name in bosun-controller bosun-agent; do
  image="$prefix/$name:$tag"
  say "$engine build $image"
  extra=()
  [ "$engine" != podman ] || extra=(--timestamp "$epoch")
  "$engine" build --quiet "${extra[@]}" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    -f "$ROOT/deploy/images/${name#bosun-}.Dockerfile" -t "$image" "$work/$name" >/dev/null
  # The image runs: as its own user, on a read-only root, with no network, it prints the
  # version and commit it was built from.
  want="$name $version (commit $revision)"
  # (Low resource limits: a container may not raise them above the builder's own.)
  got=$("$engine" run --rm --read-only --network none --ulimit nofile=1024:1024 \
    --ulimit nproc=1024:1024 "$image" --version) \
    || die "$image does not run: \`$engine run --rm $image --version\` failed"
  [ "$got" = "$want" ] || die "$image --version printed '$got', expected '$want'"
  size=$("$engine" image inspect --format '{{.Size}}' "$image")
  say "$image: $(( size / 1024 / 1024 )) MiB ($size bytes)"
  if [ -n "$save" ]; then
    rm -f "$save/$name.tar"
    if [ "$engine" = podman ]; then
      podman save --quiet --format oci-archive -o "$save/$name.tar" "$image"
    else
      docker save -o "$save/$name.tar" "$image"
    fi
    echo "$prefix/$name $tag $name.tar" >>"$save/images.list.tmp"
  fi
  if [ -n "$registry" ]; then
    say "$engine push $image"
    "$engine" push "$image" >&2
  fi
done
[ -z "$save" ] || mv "$save/images.list.tmp" "$save/images.list"
say "built $prefix/bosun-controller:$tag and $prefix/bosun-agent:$tag (version $version, commit $revision) in $(( $(date +%s) - t0 ))s, ${t_build}s of it cargo"
echo "$tag"
