#!/usr/bin/env bash
# Packages the Go-built kubeadm, kubelet, kubectl and crictl as Debian packages laid out like the
# upstream ones (pkgs.k8s.io: kubelet's unit in /usr/lib/systemd/system, kubeadm's drop-in
# beside it), with dpkg-deb, and adds them to a flat apt repository under
# $BOSUN_CACHE_DIR/cluster/apt (pool/*.deb, Packages, Packages.gz, Release). Builds of other
# Kubernetes versions (BOSUN_K8S_VERSION) add their packages to the same repository, so a node
# can upgrade between them with apt. `cluster.sh up` serves the repository on the lab bridge.
# Usage: build-debs.sh <go bin dir>. Writes set-<version>.list (this version's .debs) and prints
# the repository directory as its last line.
set -euo pipefail

GOBIN_DIR="${1:?usage: build-debs.sh <directory of build-go.sh binaries>}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
REPO="$CACHE/cluster/apt"
mkdir -p "$REPO/pool"
exec 8>"$REPO/.lock"
flock 8

k8s=$("$GOBIN_DIR/kubeadm" version -o short)
crictl=$("$GOBIN_DIR/crictl" --version | awk '{print $NF}')
case "$crictl" in v[0-9]*) ;; *) echo "cluster debs: $GOBIN_DIR/crictl reports version '$crictl'; rebuild it with tests/cluster/build-go.sh (it sets the version at link time)" >&2; exit 1 ;; esac
# The upstream revision scheme (e.g. 1.34.4-1.1), so that version pins look like real ones.
k8s_deb="${k8s#v}-1.1"
crictl_deb="${crictl#v}-1.1"

# deb <package> <version> <depends> <description> <file:destination:mode>...
deb() {
  local pkg="$1" ver="$2" depends="$3" desc="$4"; shift 4
  local out="$REPO/pool/${pkg}_${ver}_amd64.deb"
  echo "pool/$(basename "$out")" >>"$REPO/set-$k8s.list.tmp"
  local stamp="$REPO/pool/.${pkg}_${ver}.sha256"
  local want
  # The inputs' contents only, not their paths: cri-tools is the same package for every
  # Kubernetes version, built from each version's own (identical) crictl.
  want=$(for spec in "$@"; do sha256sum <"${spec%%:*}"; done | sha256sum | cut -c1-64)
  if [ -f "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  local root; root=$(mktemp -d)
  chmod 0755 "$root"
  mkdir -p "$root/DEBIAN"
  local spec src rest dst mode
  for spec in "$@"; do
    src="${spec%%:*}"; rest="${spec#*:}"; dst="${rest%%:*}"; mode="${rest##*:}"
    install -D -m "$mode" "$src" "$root$dst"
  done
  {
    echo "Package: $pkg"
    echo "Version: $ver"
    echo "Architecture: amd64"
    echo "Maintainer: Bosun cluster lab <lab@bosun.invalid>"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
    [ -z "$depends" ] || echo "Depends: $depends"
    echo "Section: admin"
    echo "Priority: optional"
    echo "Description: $desc"
    echo " Built by tests/cluster/build-debs.sh from the upstream sources; not an official package."
  } >"$root/DEBIAN/control"
  # Byte-for-byte the same package from the same inputs (fixed mtimes and archive dates): a
  # rebuilt .deb must not change the node image's key (build-node.sh hashes the .debs) and
  # so make every other version's cached node image look stale.
  find "$root" -exec touch -h -d @1 {} +
  SOURCE_DATE_EPOCH=1 dpkg-deb --root-owner-group -Zgzip --build "$root" "$out.tmp" >/dev/null
  mv "$out.tmp" "$out"
  echo "$want" >"$stamp"
  rm -rf "$root"
  echo "cluster debs: built $(basename "$out")" >&2
}

: >"$REPO/set-$k8s.list.tmp"
deb kubelet "$k8s_deb" "iptables, iproute2, mount, ethtool, socat, conntrack, containernetworking-plugins" \
  "Kubernetes node agent ($k8s)" \
  "$GOBIN_DIR/kubelet:/usr/bin/kubelet:0755" "$HERE/deb/kubelet.service:/usr/lib/systemd/system/kubelet.service:0644"
deb kubectl "$k8s_deb" "" "Kubernetes command-line client ($k8s)" "$GOBIN_DIR/kubectl:/usr/bin/kubectl:0755"
deb cri-tools "$crictl_deb" "" "CLI for CRI runtimes: crictl ($crictl)" "$GOBIN_DIR/crictl:/usr/bin/crictl:0755"
deb kubeadm "$k8s_deb" "cri-tools (>= 1.30.0), kubelet, kubectl" "Kubernetes cluster bootstrapping tool ($k8s)" \
  "$GOBIN_DIR/kubeadm:/usr/bin/kubeadm:0755" \
  "$HERE/deb/10-kubeadm.conf:/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf:0644"

# The packages of this version, for build-node.sh to install in the node image.
mv "$REPO/set-$k8s.list.tmp" "$REPO/set-$k8s.list"

# The flat repository's indexes: `deb [trusted=yes] http://<host>:<port>/ ./`.
(cd "$REPO" && dpkg-scanpackages --multiversion pool /dev/null 2>/dev/null >Packages.tmp) \
  || { echo "cluster debs: dpkg-scanpackages failed in $REPO" >&2; exit 1; }
mv "$REPO/Packages.tmp" "$REPO/Packages"
gzip -9nc "$REPO/Packages" >"$REPO/Packages.gz"
{
  echo "Origin: bosun-cluster-lab"
  echo "Label: bosun-cluster-lab"
  echo "Suite: lab"
  echo "Codename: lab"
  echo "Date: $(LC_ALL=C date -u '+%a, %d %b %Y %H:%M:%S UTC')"
  echo "Architectures: amd64"
  echo "Description: kubeadm, kubelet, kubectl and cri-tools built locally for the Bosun cluster lab"
  echo "SHA256:"
  for f in Packages Packages.gz; do
    echo " $(sha256sum "$REPO/$f" | cut -d' ' -f1) $(stat -c %s "$REPO/$f") $f"
  done
} >"$REPO/Release"
echo "$REPO"
