#!/usr/bin/env bash
# The real-node cluster lab: kubeadm clusters whose nodes are privileged podman containers with
# systemd as PID 1, containerd + runc and a real kubelet, on a bridge network the lab creates.
#
#   cluster.sh up [--control-planes M] [--workers N]   build (cached), create, init, join, CNI
#   cluster.sh up --version vX.Y.Z ...                 the same from that version's build
#   cluster.sh load-images vX.Y.Z                      that version's images into every node
#   cluster.sh import DIR                              the images of DIR/images.list into every node
#   cluster.sh check-nodes vX.Y.Z                      every Node Ready with its kubelet at that version
#   cluster.sh status                                  containers, nodes and pods
#   cluster.sh env                                     `export KUBECONFIG=...` for the host
#   cluster.sh down                                    remove everything `up` made, then check
#   cluster.sh check-clean                             fail if anything of the lab is left
#
# Environment: BOSUN_CLUSTER_NAME (default bosun; names containers, network and bridge),
# BOSUN_CLUSTER_DIR (state, default ~/.cache/bosun/cluster-state/<name>),
# BOSUN_CLUSTER_SUBNET (node network, a /24, default 10.231.0.0/24),
# BOSUN_CLUSTER_POD_SUBNET (default 10.244.0.0/16), BOSUN_CLUSTER_APT_PORT (the lab apt
# repository on the bridge's gateway address, default 80, the port of a real mirror, which the
# packages example grants apt-get; a port of its own needs it in that tcpConnect),
# BOSUN_CLUSTER_LB_PORT (the control-plane endpoint, default 6443), BOSUN_CLUSTER_APP_PORT (the
# load balancer in front of NodePort 30080, default 8080), BOSUN_CACHE_DIR. Needs root.
#
# The control-plane endpoint is haproxy (Debian's package) on the host, on the bridge's gateway
# address, in front of every control plane's API server, each health-checked on /readyz: it
# keeps answering while any one control plane is down, as the load balancer in front of a
# production kubeadm cluster does. It runs on the host, like the lab's apt repository, rather
# than in a container of its own: no image to build, and it is outside every node, so no node
# going down takes it along. The same haproxy also balances NodePort 30080 over every node (the
# test workload's Service), as a cloud load balancer in front of a NodePort Service would.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${BOSUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bosun}"
NAME="${BOSUN_CLUSTER_NAME:-bosun}"
DIR="${BOSUN_CLUSTER_DIR:-$CACHE/cluster-state/$NAME}"
SUBNET="${BOSUN_CLUSTER_SUBNET:-10.231.0.0/24}"
POD_SUBNET="${BOSUN_CLUSTER_POD_SUBNET:-10.244.0.0/16}"
SERVICE_SUBNET="10.96.0.0/12"
APT_PORT="${BOSUN_CLUSTER_APT_PORT:-80}"
LB_PORT="${BOSUN_CLUSTER_LB_PORT:-6443}"
APP_PORT="${BOSUN_CLUSTER_APP_PORT:-8080}"
APP_NODEPORT=30080
NET="bosun-cluster-$NAME"
LABEL="bosun.cluster=$NAME"
PREFIX="${SUBNET%.*}"                          # 10.231.0
GATEWAY="$PREFIX.1"
ENDPOINT="$GATEWAY:$LB_PORT"                   # the control-plane endpoint (haproxy)

say() { echo "cluster: $*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" = 0 ] || die "the cluster lab needs root (privileged node containers, a bridge network, iptables); found uid $(id -u). Run it as root."
case "$SUBNET" in *.0/24) ;; *) die "BOSUN_CLUSTER_SUBNET must be a /24 ending in .0 (found $SUBNET)" ;; esac

kubectl_() { "$BOSUN_CLUSTER_BIN/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }
node_exec() { local n="$1"; shift; podman exec "$n" "$@"; }
node_shared_root() { [ "$(podman exec "$1" findmnt -n -o PROPAGATION /)" = shared ]; }
node_put() { # node_put <node> <host file> <path in node>
  podman exec -i "$1" sh -c "mkdir -p \"\$(dirname '$3')\" && cat >'$3'" <"$2"
}
lab_containers() { podman ps -a --filter "label=$LABEL" --format '{{.Names}}'; }

load_build() { # load_build [version]: that version's build, else the last one built
  local env="$CACHE/cluster/current.env"
  if [ -n "${1:-}" ]; then
    env="$CACHE/cluster/versions/$1.env"
    [ -f "$env" ] || die "no cluster build of Kubernetes $1 ($env); build it with BOSUN_K8S_VERSION=$1 tests/cluster/build.sh (see its header for the etcd and CoreDNS versions)"
  fi
  [ -f "$env" ] || die "no cluster build found ($env); run tests/cluster/build.sh"
  # shellcheck disable=SC1090
  source "$env"
  export BOSUN_CLUSTER_VERSION BOSUN_CLUSTER_BIN BOSUN_CLUSTER_NODE_IMAGE BOSUN_CLUSTER_IMAGES
  export BOSUN_CLUSTER_APT
}

# (A function, so each try asks again: `wait_for … test -n "$(kubectl …)"` asked once.)
has_pod_cidr() { [ -n "$(kubectl_ get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null)" ]; }

wait_for() { # wait_for <seconds> <what> <command...>
  local limit="$1" what="$2"; shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what"
    sleep 1
  done
}

cmd_up() {
  local cps=1 workers=1 version=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --control-planes) cps="$2"; shift 2 ;;
      --workers) workers="$2"; shift 2 ;;
      --version) version="$2"; shift 2 ;;
      *) die "unknown argument '$1'; expected --control-planes M, --workers N or --version vX.Y.Z" ;;
    esac
  done
  [[ "$cps" =~ ^[1-9]$ ]] || die "--control-planes must be 1..9 (found '$cps')"
  [[ "$workers" =~ ^[0-9]$ ]] || die "--workers must be 0..9 (found '$workers')"
  [ -z "$(lab_containers)" ] || die "cluster '$NAME' is already up ($(lab_containers | xargs)); run 'cluster.sh down' first"
  podman network exists "$NET" && die "network $NET exists from an earlier run; run 'cluster.sh down' first"

  local t0; t0=$(now)
  if [ -z "$version" ]; then "$HERE/build.sh" >/dev/null; fi
  load_build "$version"
  local tb; tb=$(now)
  rm -rf "$DIR"; mkdir -p "$DIR/nodes"
  cat /proc/sys/net/ipv4/ip_forward >"$DIR/host-ip_forward"
  echo "$cps $workers" >"$DIR/shape"
  echo "$BOSUN_CLUSTER_VERSION" >"$DIR/version"

  podman network create --label "$LABEL" --subnet "$SUBNET" --gateway "$GATEWAY" \
    --disable-dns "$NET" >/dev/null
  say "network $NET ($SUBNET, bridge $(podman network inspect --format '{{.NetworkInterface}}' "$NET"))"

  local nodes=() ips=() i
  for i in $(seq 1 "$cps"); do nodes+=("$NAME-cp$i"); ips+=("$PREFIX.$((10 + i))"); done
  for i in $(seq 1 "$workers"); do nodes+=("$NAME-w$i"); ips+=("$PREFIX.$((20 + i))"); done
  printf '%s\n' "${nodes[@]}" >"$DIR/nodes.list"
  for i in "${!nodes[@]}"; do
    local n="${nodes[$i]}"
    mkdir -p "$DIR/nodes/$n/containerd"
    # --restart=always: systemd as the container's init ends the container when the node
    # reboots (a reboot Operation, docs/reboots.md); podman then starts it again, as a
    # machine's firmware would. `podman stop` (cluster.sh down) does not restart it.
    podman run -d --name "$n" --hostname "$n" --label "$LABEL" --runtime runc --restart=always \
      --network "$NET" --ip "${ips[$i]}" \
      --privileged --cgroupns=private --systemd=false \
      --tmpfs /run --tmpfs /run/lock --tmpfs /tmp -e container=podman \
      --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
      --stop-signal SIGRTMIN+3 --stop-timeout 20 \
      -v "$DIR/nodes/$n/containerd:/var/lib/containerd" \
      -v "$BOSUN_CLUSTER_IMAGES:/opt/bosun/images:ro" \
      "$BOSUN_CLUSTER_NODE_IMAGE" >/dev/null
    echo "$n ${ips[$i]}" >>"$DIR/nodes.ips"
  done
  # containerd's sandbox (pause) image: the one this version's kubeadm names, which is among
  # the images imported below (the node image's config names v1.34's).
  local pause; pause=$(awk '$1 ~ /\/pause$/ {print $1 ":" $2}' "$BOSUN_CLUSTER_IMAGES/images.list")
  [ -n "$pause" ] || die "no pause image in $BOSUN_CLUSTER_IMAGES/images.list"
  for n in "${nodes[@]}"; do
    wait_for 90 "containerd in $n" node_exec "$n" ctr -n k8s.io version
    # / is a shared mount, as systemd makes it on a real host (the node image's
    # bosun-shared-root.service does it at every boot; without it the kubelet refuses the
    # agent's host-root volume, mountPropagation HostToContainer).
    wait_for 30 "/ shared in $n" node_shared_root "$n"
    if ! node_exec "$n" grep -q "sandbox_image = \"$pause\"" /etc/containerd/config.toml; then
      node_exec "$n" sed -i "s|^\( *sandbox_image = \).*|\1\"$pause\"|" /etc/containerd/config.toml
      node_exec "$n" systemctl restart containerd
      wait_for 90 "containerd in $n" node_exec "$n" ctr -n k8s.io version
    fi
    while read -r repo tag file; do
      node_exec "$n" ctr -n k8s.io images import --base-name "$repo" "/opt/bosun/images/$file" >/dev/null \
        || die "importing $repo:$tag into $n failed"
    done <"$BOSUN_CLUSTER_IMAGES/images.list"
  done
  # The lab's apt repository (build-debs.sh), served from the host on the bridge's gateway
  # address only, and the nodes' apt pointed at it.
  setsid /bin/busybox httpd -f -p "$GATEWAY:$APT_PORT" -h "$BOSUN_CLUSTER_APT" \
    </dev/null >"$DIR/apt-httpd.log" 2>&1 &
  echo $! >"$DIR/apt-httpd.pid"
  wait_for 10 "the apt repository on $GATEWAY:$APT_PORT" apt_serving
  echo "deb [trusted=yes] http://$GATEWAY:$APT_PORT/ ./" >"$DIR/bosun-cluster-lab.list"
  for n in "${nodes[@]}"; do
    node_put "$n" "$DIR/bosun-cluster-lab.list" /etc/apt/sources.list.d/bosun-cluster-lab.list
  done
  # The control-plane endpoint and the application's load balancer (see the header).
  command -v haproxy >/dev/null || die "haproxy is missing (the control-plane endpoint); apt-get install haproxy, or run tests/cluster/build.sh --packages-only as root"
  {
    cat <<CFG
global
  maxconn 4096
defaults
  mode tcp
  timeout connect 3s
  timeout client 15m
  timeout server 15m
  timeout tunnel 1h
  # A connection refused by a server that is going down is tried on another one.
  retries 2
  option redispatch
frontend kube-apiserver
  bind $ENDPOINT
  default_backend control-planes
backend control-planes
  # Down after two failed /readyz (every 0.5 s, each cut at 1.5 s): an API server whose local
  # etcd member restarts hangs its requests, and every client sent there waits its timeout,
  # so it must go quickly; but down at the first failure, a loaded machine's slow check took
  # all three out at once (clients then saw "tls handshake eof").
  option httpchk GET /readyz
  http-check expect status 200
  timeout check 1500ms
  default-server check check-ssl verify none inter 500ms fall 2 rise 2
CFG
    for i in "${!nodes[@]}"; do
      [[ "${nodes[$i]}" == *-cp* ]] && echo "  server ${nodes[$i]} ${ips[$i]}:6443"
    done
    cat <<CFG
frontend app
  bind $GATEWAY:$APP_PORT
  default_backend app-nodes
backend app-nodes
  default-server check inter 1s fall 2 rise 2
CFG
    for i in "${!nodes[@]}"; do echo "  server ${nodes[$i]} ${ips[$i]}:$APP_NODEPORT"; done
  } >"$DIR/haproxy.cfg"
  haproxy -c -q -f "$DIR/haproxy.cfg" || die "haproxy refuses $DIR/haproxy.cfg"
  setsid haproxy -db -f "$DIR/haproxy.cfg" </dev/null >"$DIR/haproxy.log" 2>&1 &
  echo $! >"$DIR/haproxy.pid"
  wait_for 10 "the control-plane endpoint $ENDPOINT" lb_serving
  local tn; tn=$(now)
  say "nodes started and images imported in $(since "$tb")s"

  local cp1="${nodes[0]}" cp1_ip="${ips[0]}"
  local token cert_key=""
  token="$(openssl rand -hex 3).$(openssl rand -hex 8)"
  [ "$cps" -gt 1 ] && cert_key=$(openssl rand -hex 32)
  {
    cat <<YAML
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: "$token"
  ttl: 24h0m0s
localAPIEndpoint:
  advertiseAddress: $cp1_ip
  bindPort: 6443
nodeRegistration:
  criSocket: unix:///run/containerd/containerd.sock
  imagePullPolicy: Never
  ignorePreflightErrors: [SystemVerification]
YAML
    [ -n "$cert_key" ] && echo "certificateKey: \"$cert_key\""
    cat <<YAML
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $BOSUN_CLUSTER_VERSION
clusterName: $NAME
controlPlaneEndpoint: "$ENDPOINT"
networking:
  podSubnet: $POD_SUBNET
  serviceSubnet: $SERVICE_SUBNET
apiServer:
  certSANs: ["$GATEWAY", "$cp1_ip", "127.0.0.1"]
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# The nodes share the host's disk with everything else on it: the default thresholds
# (nodefs.available<10%) put a node under DiskPressure, and evict its pods, as soon as the host
# disk is 90% full. Images cannot be pulled again here (they are imported), so image garbage
# collection must never remove them either. The same choice as kind's nodes.
evictionHard:
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
conntrack:
  maxPerCore: 0
YAML
  } >"$DIR/kubeadm-init.yaml"
  node_put "$cp1" "$DIR/kubeadm-init.yaml" /etc/kubernetes/bosun-kubeadm.yaml
  say "kubeadm init on $cp1 ($cp1_ip)"
  local ti; ti=$(now)
  local upload=(); [ -n "$cert_key" ] && upload=(--upload-certs)
  node_exec "$cp1" kubeadm init --config /etc/kubernetes/bosun-kubeadm.yaml "${upload[@]}" \
    >"$DIR/kubeadm-init.log" 2>&1 \
    || { tail -n 30 "$DIR/kubeadm-init.log" >&2; die "kubeadm init on $cp1 failed; full log: $DIR/kubeadm-init.log"; }
  local init_s; init_s=$(since "$ti")
  node_exec "$cp1" cat /etc/kubernetes/admin.conf >"$DIR/kubeconfig"
  chmod 600 "$DIR/kubeconfig"

  # The discovery hash of the cluster CA, as `kubeadm token create --print-join-command` prints.
  local ca_hash
  ca_hash="sha256:$(node_exec "$cp1" cat /etc/kubernetes/pki/ca.crt | openssl x509 -pubkey -noout \
    | openssl pkey -pubin -outform der | sha256sum | cut -d' ' -f1)"
  local tj; tj=$(now)
  for i in "${!nodes[@]}"; do
    [ "$i" = 0 ] && continue
    local n="${nodes[$i]}" ip="${ips[$i]}"
    {
      cat <<YAML
apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: "$ENDPOINT"
    token: "$token"
    caCertHashes: ["$ca_hash"]
nodeRegistration:
  criSocket: unix:///run/containerd/containerd.sock
  imagePullPolicy: Never
  ignorePreflightErrors: [SystemVerification]
YAML
      if [[ "$n" == *-cp* ]]; then
        cat <<YAML
controlPlane:
  localAPIEndpoint:
    advertiseAddress: $ip
    bindPort: 6443
  certificateKey: "$cert_key"
YAML
      fi
    } >"$DIR/kubeadm-join-$n.yaml"
    node_put "$n" "$DIR/kubeadm-join-$n.yaml" /etc/kubernetes/bosun-kubeadm.yaml
    say "kubeadm join on $n ($ip)"
    node_exec "$n" kubeadm join --config /etc/kubernetes/bosun-kubeadm.yaml >"$DIR/kubeadm-join-$n.log" 2>&1 \
      || { tail -n 30 "$DIR/kubeadm-join-$n.log" >&2; die "kubeadm join on $n failed; full log: $DIR/kubeadm-join-$n.log"; }
  done
  local join_s; join_s=$(since "$tj")

  # Pod network: a bridge per node on the node's spec.podCIDR (allocated by the
  # controller-manager from $POD_SUBNET) and a route on every node to every other node's pod
  # CIDR through that node's address on the lab bridge ("host-gw").
  local cidrs=()
  for i in "${!nodes[@]}"; do
    local n="${nodes[$i]}"
    wait_for 180 "the pod CIDR of node $n" has_pod_cidr "$n"
    cidrs+=("$(kubectl_ get node "$n" -o jsonpath='{.spec.podCIDR}')")
  done
  for i in "${!nodes[@]}"; do
    local n="${nodes[$i]}"
    cat >"$DIR/cni-$n.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "bosun-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "${cidrs[$i]}" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
JSON
    node_put "$n" "$DIR/cni-$n.conflist" /etc/cni/net.d/10-bosun.conflist
    for j in "${!nodes[@]}"; do
      [ "$i" = "$j" ] && continue
      node_exec "$n" ip route replace "${cidrs[$j]}" via "${ips[$j]}"
    done
  done

  say "waiting for every node Ready and CoreDNS available"
  wait_for 300 "every node Ready" kubectl_ wait --for=condition=Ready node --all --timeout=5s
  wait_for 300 "CoreDNS available" kubectl_ -n kube-system wait --for=condition=Available deployment/coredns --timeout=5s
  cat >"$DIR/timings" <<T
build_check_s=$(awk -v a="$t0" -v b="$tb" 'BEGIN { printf "%.1f", b - a }')
nodes_and_images_s=$(awk -v a="$tb" -v b="$tn" 'BEGIN { printf "%.1f", b - a }')
kubeadm_init_s=$init_s
joins_s=$join_s
up_total_s=$(since "$t0")
T
  say "up: ${#nodes[@]} nodes ($cps control plane(s), $workers worker(s)) in $(since "$t0")s; init ${init_s}s, joins ${join_s}s"
  cmd_env
}

cmd_env() {
  [ -f "$DIR/kubeconfig" ] || die "cluster '$NAME' is not up (no $DIR/kubeconfig); run 'cluster.sh up'"
  # The tools of the version the cluster was made with (kubectl within the skew kubeadm
  # supports during an upgrade).
  load_build "$(cat "$DIR/version" 2>/dev/null || true)"
  echo "export KUBECONFIG=$DIR/kubeconfig"
  echo "export BOSUN_CLUSTER_BIN=$BOSUN_CLUSTER_BIN"
  echo "export PATH=$BOSUN_CLUSTER_BIN:\$PATH"
}

cmd_status() {
  local c; c=$(lab_containers)
  if [ -z "$c" ]; then echo "cluster '$NAME': down"; return 0; fi
  load_build
  podman ps -a --filter "label=$LABEL" --format '{{.Names}}\t{{.Status}}\t{{.Networks}}'
  kubectl_ get nodes -o wide
  kubectl_ get pods -A -o wide
}

# The host interface that holds the lab network's gateway address (podman 4.3 names CNI bridges
# cni-podmanN itself), if any.
lab_bridge() { ip -o -4 addr show | awk -v gw="$GATEWAY" '$4 ~ "^"gw"/" {print $2}'; }

# Container cgroups (libpod-<id>, in every hierarchy) whose container no longer exists.
orphan_cgroups() {
  local ids d id
  ids=" $(podman ps -aq --no-trunc | xargs) "
  find /sys/fs/cgroup/ -maxdepth 4 -type d -name 'libpod-*' 2>/dev/null | while read -r d; do
    id=$(basename "$d" | sed -E 's/^libpod-(conmon-)?([0-9a-f]{64}).*/\2/')
    [[ "$ids" == *" $id "* ]] || echo "$d"
  done
}

apt_serving() { ss -ltnH "( sport = :$APT_PORT )" | grep -qF "$GATEWAY:$APT_PORT"; }
lb_serving() { ss -ltnH "( sport = :$LB_PORT )" | grep -qF "$ENDPOINT"; }

# Everything of this lab that still exists on the host, one line each; empty when clean.
leftovers() {
  local c
  c=$(lab_containers | xargs)
  [ -z "$c" ] || echo "containers: $c"
  podman network exists "$NET" && echo "podman network: $NET"
  local br; br=$(lab_bridge)
  [ -z "$br" ] || echo "bridge interface: $br (holds $GATEWAY)"
  apt_serving && echo "apt repository server: listening on $GATEWAY:$APT_PORT"
  lb_serving && echo "control-plane load balancer: listening on $ENDPOINT"
  local rules
  rules=$(iptables-save 2>/dev/null | grep -E -e "${PREFIX//./\\.}\\.|$NET|CNI-" || true)
  [ -z "$rules" ] || echo "iptables rules: $(echo "$rules" | wc -l) ($(echo "$rules" | head -n 3 | xargs))"
  orphan_cgroups | sed 's/^/cgroup: /'
  if [ -z "$(podman ps -aq)" ]; then
    find /sys/fs/cgroup/ -maxdepth 2 -type d -name libpod_parent | sed 's/^/cgroup (podman, no container left): /'
  fi
  grep -F -e "$DIR/" -e "/opt/bosun/images" -e "libpod" /proc/self/mountinfo \
    | awk '{print "mount: " $5}' || true
  if [ -f "$DIR/host-ip_forward" ] && [ -z "$(podman ps -q)" ] \
    && [ "$(cat /proc/sys/net/ipv4/ip_forward)" != "$(cat "$DIR/host-ip_forward")" ]; then
    echo "net.ipv4.ip_forward: $(cat /proc/sys/net/ipv4/ip_forward), was $(cat "$DIR/host-ip_forward") before up"
  fi
}

cmd_down() {
  local c t0; t0=$(now)
  c=$(lab_containers)
  mkdir -p "$DIR"
  if [ -n "$c" ]; then
    say "removing $(echo "$c" | xargs)"
    # SIGRTMIN+3 first: systemd stops kubelet, containerd and the pods' shims in order.
    podman rm -f -t 20 $c >/dev/null
  fi
  if [ -f "$DIR/apt-httpd.pid" ]; then
    local pid; pid=$(cat "$DIR/apt-httpd.pid")
    # Only the server this lab started: its pid, still running busybox httpd on our address.
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "httpd -f -p $GATEWAY:$APT_PORT"; then
      kill "$pid"
      wait_for 10 "the apt repository server (pid $pid) to stop" test ! -e "/proc/$pid"
    fi
  fi
  if [ -f "$DIR/haproxy.pid" ]; then
    local lb; lb=$(cat "$DIR/haproxy.pid")
    # Only the haproxy this lab started: its pid, still running with our configuration.
    if tr '\0' ' ' <"/proc/$lb/cmdline" 2>/dev/null | grep -qF "haproxy -db -f $DIR/haproxy.cfg"; then
      kill "$lb"
      wait_for 10 "the control-plane load balancer (pid $lb) to stop" test ! -e "/proc/$lb"
    fi
  fi
  local br
  if podman network exists "$NET"; then podman network rm -f "$NET" >/dev/null; fi
  br=$(lab_bridge)
  if [ -n "$br" ]; then ip link del "$br"; fi
  # Rules the CNI plugins of podman's network left: masquerade of the node subnet and the
  # CNI-FORWARD accepts. Delete each of them.
  local table rule
  for table in nat filter; do
    { iptables-save -t "$table" | grep -E "^-A .*(${PREFIX//./\\.}\\.|$NET)" || true; } \
      | while read -r rule; do
        # iptables-save quotes comments the way a shell does, so eval splits the rule correctly.
        eval "iptables -t $table ${rule/-A /-D }" || say "could not delete iptables rule '$rule' in $table"
      done
  done
  # The CNI firewall plugin's chains, once no podman network uses them any more: CNI-FORWARD
  # then holds only its jump to CNI-ADMIN, and CNI-ADMIN is empty.
  if [ -z "$(podman ps -q)" ] && iptables -S CNI-FORWARD >/dev/null 2>&1 \
    && [ "$(iptables -S CNI-FORWARD | grep -vc -e '^-N' -e '-j CNI-ADMIN')" = 0 ] \
    && [ "$(iptables -S CNI-ADMIN 2>/dev/null | grep -vc '^-N')" = 0 ]; then
    iptables -D FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD 2>/dev/null || true
    iptables -F CNI-FORWARD && iptables -X CNI-FORWARD && iptables -X CNI-ADMIN
  fi
  # Kubelet and pod cgroups inside the nodes' private cgroup namespaces outlive the container if
  # a process was still in them; remove them depth first. podman's empty libpod_parent too.
  local top
  while read -r top; do
    [ -n "$top" ] && find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done <<<"$(orphan_cgroups)"
  if [ -z "$(podman ps -aq)" ]; then
    find /sys/fs/cgroup/*/libpod_parent -depth -type d -exec rmdir {} \; 2>/dev/null || true
  fi
  if [ -f "$DIR/host-ip_forward" ] && [ -z "$(podman ps -q)" ]; then
    cat "$DIR/host-ip_forward" >/proc/sys/net/ipv4/ip_forward
  fi
  local left; left=$(leftovers)
  if [ -n "$left" ]; then
    echo "$left" >&2
    die "down left the above behind (state kept in $DIR)"
  fi
  rm -rf "$DIR"
  say "down in $(since "$t0")s; nothing of cluster '$NAME' is left"
}

cmd_check_clean() {
  local left; left=$(leftovers)
  if [ -n "$left" ]; then echo "$left"; die "cluster '$NAME' left the above behind"; fi
  echo "cluster '$NAME': nothing left (containers, network, bridge, iptables, cgroups, mounts)"
}

# Prints every Node with its kubelet version and Ready status; fails naming the first one
# whose kubelet is not at <version> or that is not Ready.
cmd_check_nodes() {
  local want="${1:-}"
  [ -n "$want" ] || die "usage: cluster.sh check-nodes vX.Y.Z"
  load_build
  local nodes n v r
  nodes=$(kubectl_ get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.nodeInfo.kubeletVersion}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}') \
    || die "cannot list the Nodes of cluster '$NAME'"
  echo "$nodes"
  while read -r n v r; do
    [ "$v" = "$want" ] || die "node $n: kubelet $v, expected $want"
    [ "$r" = True ] || die "node $n: Ready=$r, expected True"
  done <<<"$nodes"
}

# Imports every image of an image directory (images.list: repository tag archive) into every
# node's containerd (nothing can be pulled here).
import_dir() { # import_dir <image dir> <what, for messages>
  local images="$1" what="$2" n repo tag file
  [ -f "$images/images.list" ] || die "no $images/images.list"
  while read -r n; do
    while read -r repo tag file; do
      podman exec -i "$n" ctr -n k8s.io images import --base-name "$repo" - \
        <"$images/$file" >/dev/null || die "importing $repo:$tag into $n failed"
    done <"$images/images.list"
    say "$n: $what imported"
  done <"$DIR/nodes.list"
}

# Imports another built version's images into every node (what an upgrade to that version
# pulls).
cmd_load_images() {
  local version="${1:-}"
  [ -n "$version" ] || die "usage: cluster.sh load-images vX.Y.Z"
  [ -f "$DIR/nodes.list" ] || die "cluster '$NAME' is not up"
  load_build "$version"
  import_dir "$BOSUN_CLUSTER_IMAGES" "the images of Kubernetes $version"
}

# Imports the images of a directory deploy/images/build.sh --save made into every node.
cmd_import() {
  local images="${1:-}"
  [ -n "$images" ] || die "usage: cluster.sh import <image directory with images.list>"
  [ -f "$DIR/nodes.list" ] || die "cluster '$NAME' is not up"
  import_dir "$images" "$(awk '{printf "%s%s:%s", (NR > 1 ? ", " : ""), $1, $2}' "$images/images.list")"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  load-images) shift; cmd_load_images "$@" ;;
  import) shift; cmd_import "$@" ;;
  check-nodes) shift; cmd_check_nodes "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  check-clean) cmd_check_clean ;;
  *) die "usage: cluster.sh up [--control-planes M] [--workers N] [--version vX.Y.Z] | load-images vX.Y.Z | import DIR | check-nodes vX.Y.Z | status | env | down | check-clean" ;;
esac
