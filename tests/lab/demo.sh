#!/usr/bin/env bash
# The README's "main job", on the lab: brings up a real control plane (etcd, kube-apiserver,
# kube-controller-manager built from the upstream Go modules, PKI by kubeadm) with simulated
# kubeadm nodes, and shows it with the real kubectl. Works from a fresh clone: the first run
# builds the binaries (tens of minutes on 2 cores), later runs take seconds.
#
#   bash tests/lab/demo.sh                      # 4 nodes, 1 control plane
#   bash tests/lab/demo.sh --nodes 6 --control-planes 3
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/bosun/target}"

# Binaries: built once into ~/.cache/bosun/lab/<versions>/bin; a no-op when they exist.
BOSUN_LAB_BIN="$(bash tests/lab/build-binaries.sh | tail -n 1)"
export BOSUN_LAB_BIN

cargo build --quiet --locked -p bosun-lab --bin lab
lab="$CARGO_TARGET_DIR/debug/lab"

"$lab" up "$@" >/dev/null
eval "$("$lab" env)"

echo
echo "\$ kubectl get nodes -o wide"
"$BOSUN_LAB_BIN/kubectl" get nodes -o wide
echo
"$lab" status
cat <<EOT

The lab is running (it stays up until you stop it). Next:
  export KUBECONFIG=$KUBECONFIG
  export PATH=$BOSUN_LAB_BIN:\$PATH        # kubectl, kubeadm at the lab's version
  kubectl get --raw /version
  ls ${BOSUN_LAB_DIR:-$HOME/.cache/bosun/lab-state}/nodes/lab-cp-1/etc/kubernetes     # a node's host root
  cargo test -p bosun-e2e                  # end-to-end tests against this lab
  $lab down                                # stop it (add --purge to forget its state)
EOT
