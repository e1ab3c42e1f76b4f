# Sourced by build-images.sh: packs a directory into a single-layer
# OCI image archive with umoci (no daemon, no registry, no base image).
#
# oci_archive <repository:tag> <content dir> <archive.tar> <log> [umoci config options...]
#   The content directory becomes the image's /; the options go to `umoci config` (e.g.
#   --config.entrypoint /usr/local/bin/x --config.user 65532:65532). The archive is an OCI
#   layout, what `ctr images import` takes. umoci's output goes to the log.
oci_archive() {
  local ref="$1" content="$2" archive="$3" log="$4"
  shift 4
  local tag="${ref##*:}" scratch
  scratch=$(mktemp -d "$(dirname "$archive")/.oci.XXXXXX")
  local layout="$scratch/layout" bundle="$scratch/bundle"
  umoci init --layout "$layout" >>"$log" 2>&1
  umoci new --image "$layout:$tag" >>"$log" 2>&1
  umoci unpack --image "$layout:$tag" "$bundle" >>"$log" 2>&1
  cp -a "$content/." "$bundle/rootfs/"
  umoci repack --image "$layout:$tag" "$bundle" >>"$log" 2>&1
  umoci config --image "$layout:$tag" "$@" --architecture amd64 --os linux >>"$log" 2>&1
  umoci gc --layout "$layout" >>"$log" 2>&1
  tar -C "$layout" -cf "$archive" .
  rm -rf "$scratch"
}
