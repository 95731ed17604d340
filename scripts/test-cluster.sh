#!/usr/bin/env bash
# A real Kubernetes cluster for tests, on this machine: etcd (Debian's etcd-server), kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy and kubelet v1.20.2 built from Debian
# bookworm's `kubernetes` source package (no package ships the binaries), and real nodes, each a
# network namespace with its own kubelet and containerd running the project's images
# (scripts/images.sh), the GPU device plugin (testing/device_plugin.cc) and the DNS
# (testing/cluster_dns.py). For the controller's scale benchmark, --simulate registers nodes with
# nothing behind them instead (testing/simulated_nodes.cc).
#
#   scripts/test-cluster.sh build        builds the Kubernetes binaries once into $TESSERA_CACHE
#                                        (default ~/.cache/tessera; about 8 minutes on 2 cores)
#   scripts/test-cluster.sh start DIR [--nodes N] [--gpus G] [--zones Z] [--bin-dir D] [--simulate BIN]
#                                        starts the control plane with its state in DIR, writes
#                                        DIR/kubeconfig (admin token) and waits until it is ready; with
#                                        --nodes N (default 0), N real nodes of G GPUs (default 2;
#                                        the device plugin from D) spread over Z zones (default 2);
#                                        with --simulate, N nodes that BIN (tessera-simulated-nodes)
#                                        registers, whose bound pods it marks Running
#   scripts/test-cluster.sh stop DIR     stops everything started in DIR
#   scripts/test-cluster.sh restart-apiserver DIR
#                                        stops and starts kube-apiserver alone (same port, same etcd)
#   scripts/test-cluster.sh stop-apiserver DIR / start-apiserver DIR
#                                        the same in two steps (the API server gone meanwhile)
#   scripts/test-cluster.sh add-node DIR one real node more (node-K, K the next index)
#   scripts/test-cluster.sh lose-node DIR K  kills node-K's kubelet, containerd and containers and
#                                        removes its network, as a lost machine (its Node object stays)
#   scripts/test-cluster.sh account-kubeconfig DIR NAMESPACE ACCOUNT
#                                        prints a kubeconfig that authenticates as service account
#                                        NAMESPACE/ACCOUNT (its token, not the admin's)
set -euo pipefail

CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}
VERSION=v1.20.2
APISERVER=$CACHE/kube-apiserver-$VERSION

# The commands it needs come from scripts/deps.sh (make deps).
require() {
  for c in "$@"; do
    command -v "$c" >/dev/null || { echo "test-cluster: '$c' is missing; run make deps" >&2; exit 1; }
  done
}

# Writes to $1 a sources list with the deb-src twin of every Debian entry this machine's apt uses
# (one-line .list files and deb822 .sources files), so no archive address is written here.
debian_sources() {
  local out=$1
  python3 - "$out" <<'PY'
import glob, os, sys
entries = []
files = [f for f in ["/etc/apt/sources.list"] if os.path.exists(f)] + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
for f in files:
    for line in open(f):
        line = line.split("#", 1)[0].strip()
        if line.startswith("deb "):
            entries.append("deb-src " + line[4:])
            entries.append(line)
for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in open(f).read().split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
        if fields.get("Enabled", "yes") == "no" or "deb" not in fields.get("Types", "").split():
            continue
        opts = " [signed-by=%s]" % fields["Signed-By"] if "Signed-By" in fields else ""
        for uri in fields.get("URIs", "").split():
            for suite in fields.get("Suites", "").split():
                for kind in ("deb", "deb-src"):
                    entries.append("%s%s %s %s %s" % (kind, opts, uri, suite, fields.get("Components", "")))
debian = [e for e in entries if "debian" in e and "security" not in e]
if not debian:
    sys.exit("test-cluster: no Debian entry in this machine's apt sources")
open(sys.argv[1], "w").write("\n".join(debian) + "\n")
PY
}

# The Kubernetes binaries the test cluster runs, all built from one source tree.
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
PAUSE=$CACHE/pause-$VERSION

built() {
  for c in "${COMPONENTS[@]}"; do [ -x "$CACHE/$c-$VERSION" ] || return 1; done
  [ -x "$PAUSE" ]
}

build() {
  if built; then
    echo "test-cluster: ${COMPONENTS[*]} and pause $VERSION are built in $CACHE"
    return
  fi
  PATH=/usr/lib/go-1.19/bin:$PATH require go rsync apt-get dpkg-deb make python3 gcc
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"; trap - RETURN' RETURN
  # The source package (and reflect2's), through a private APT configuration with its own lists
  # and the machine's Debian entries as deb-src (/etc/apt is left alone).
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
  debian_sources "$work/apt/sources.list"
  cat >"$work/apt/apt.conf" <<EOF
Dir::Etc::SourceList "$work/apt/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::State::Lists "$work/apt/lists";
Dir::Cache "$work/apt/cache";
EOF
  echo "test-cluster: fetching Debian's kubernetes source package"
  (cd "$work" && APT_CONFIG=$work/apt/apt.conf apt-get -o APT::Sandbox::User=root update -q >/dev/null &&
    APT_CONFIG=$work/apt/apt.conf apt-get -o APT::Sandbox::User=root source --download-only -q kubernetes >/dev/null 2>&1 &&
    APT_CONFIG=$work/apt/apt.conf apt-get -o APT::Sandbox::User=root download -q golang-github-modern-go-reflect2-dev >/dev/null 2>&1) ||
    { echo "test-cluster: cannot fetch the kubernetes source package from the Debian archive in the apt sources" >&2; exit 1; }
  tar -xzf "$work"/kubernetes_*.orig.tar.gz -C "$work"
  local src
  src=$(find "$work" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
  # The vendored reflect2 v1.0.1 crashes under Go 1.18+ on the first custom-resource write: use v1.0.2.
  dpkg-deb -x "$work"/golang-github-modern-go-reflect2-dev_*.deb "$work/reflect2"
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r "$work/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2" "$src/vendor/github.com/modern-go/"
  local what=() c
  for c in "${COMPONENTS[@]}"; do [ -x "$CACHE/$c-$VERSION" ] || what+=("cmd/$c"); done
  mkdir -p "$CACHE"
  if ((${#what[@]})); then
    echo "test-cluster: building ${what[*]} $VERSION (several minutes each)"
    (cd "$src" && PATH=/usr/lib/go-1.19/bin:$PATH CGO_ENABLED=0 KUBE_GIT_VERSION=$VERSION KUBE_GIT_TREE_STATE=clean \
      make WHAT="${what[*]}" >"$work/build.log" 2>&1) ||
      { tail -20 "$work/build.log" >&2; exit 1; }
    for c in "${what[@]}"; do
      c=${c#cmd/}
      cp "$src/_output/bin/$c" "$CACHE/$c-$VERSION.tmp" && mv "$CACHE/$c-$VERSION.tmp" "$CACHE/$c-$VERSION"
    done
  fi
  # The pod sandbox's pause process, from the same tree (no registry to pull it from).
  gcc -Os -static -DVERSION="$VERSION" -o "$PAUSE.tmp" "$src/build/pause/linux/pause.c" && strip "$PAUSE.tmp" && mv "$PAUSE.tmp" "$PAUSE"
  echo "test-cluster: built ${COMPONENTS[*]} and pause $VERSION in $CACHE"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_apiserver() {
  local dir=$1
  setsid "$APISERVER" --etcd-servers="http://127.0.0.1:$(cat "$dir/etcd.port")" --bind-address="$(cat "$dir/apiserver.addr")" \
    --secure-port="$(cat "$dir/apiserver.port")" --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" \
    --authorization-mode=RBAC --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true --service-node-port-range=30000-32767 \
    --kubelet-preferred-address-types=InternalIP >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  for _ in $(seq 1 120); do
    if kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "test-cluster: the API server is not ready after 60 s; the end of its log:" >&2
  tail -20 "$dir/apiserver.log" >&2
  return 1
}

# ---- Real nodes: one network namespace each on the bridge tessera-kbr (tessera-netns, set
# "cluster": node K is tessera-kK at 10.78.0.K+1, the host 10.78.0.254), with its own containerd,
# kubelet, kube-proxy and GPU device plugin; its pods on 10.79.K.0/24 (CNI bridge and host-local),
# routed between nodes; the cluster DNS on the host's bridge address.
NETNS=(env TESSERA_NETNS_SET=cluster bash "$(dirname "$0")/../controller/local/tessera-netns.sh")
HOST_ADDR=10.78.0.254
node_addr() { echo "10.78.0.$(($1 + 1))"; }
pod_subnet() { echo "10.79.$1.0/24"; }
in_node() { local k=$1; shift; nsenter --net="/run/netns/tessera-k$k" "$@"; }
nodes_of() { ls -d "$1"/nodes/node-* 2>/dev/null | sed 's/.*node-//' | sort -n; }
# The nodes that still have their network (a lost node has none).
live_nodes_of() {
  local k
  for k in $(nodes_of "$1"); do [ -e "/run/netns/tessera-k$k" ] && echo "$k"; done
  return 0
}

# Routes to every live node's pod subnet, from the host and from every other live node.
route_pods() {
  local dir=$1 k j
  for k in $(live_nodes_of "$dir"); do
    ip route replace "$(pod_subnet "$k")" via "$(node_addr "$k")"
    for j in $(live_nodes_of "$dir"); do
      [ "$j" = "$k" ] || in_node "$j" ip route replace "$(pod_subnet "$k")" via "$(node_addr "$k")"
    done
  done
}

# start_node DIR K GPUS ZONES: node-K, ready in the API with GPUS GPUs from the device plugin.
start_node() {
  local dir=$1 k=$2 gpus=$3 zones=$4 bin_dir=$5
  local n=$dir/nodes/node-$k addr
  addr=$(node_addr "$k")
  mkdir -p "$n"/{containerd,kubelet,cni/conf,cni/ipam,logs,run}
  "${NETNS[@]}" add "$k" --rate "${TESSERA_CLUSTER_RATE:-10gbit}" >/dev/null
  in_node "$k" sysctl -qw net.ipv4.ip_forward=1
  in_node "$k" ip route replace default via "$HOST_ADDR"
  # The cgroup root of the node's pods, in every v1 hierarchy the kubelet uses.
  local c
  for c in /sys/fs/cgroup/*/; do mkdir -p "$c/tessera-node-$k"; done
  cat >"$n/cni/conf/10-pods.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "tessera-pods-$k", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$(pod_subnet "$k")"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$n/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  cat >"$n/containerd/config.toml" <<TOML
version = 2
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd/containerd.sock"
[ttrpc]
  address = "$n/containerd/containerd.ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$n/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/tessera/pause:$VERSION"
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  # Lowering a process's oom_score_adj is refused on these machines: keep containers at or above containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$n/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$n/cni/conf"
TOML
  # The node's own mount namespace, shared by its kubelet and containerd (so the volumes the kubelet
  # mounts are the ones containers get) and private from the host: its /run, and the paths the
  # kubelet does not take from --root-dir (the device-plugin directory, /var/log/pods) are the
  # node's. Everything mounted in it goes when its last process ends.
  mkdir -p "$n/device-plugins" "$n/var-log" /var/lib/kubelet/device-plugins
  setsid unshare --mount --propagation private sh -c "mount -t tmpfs tmpfs /run &&
    mount --bind '$n/device-plugins' /var/lib/kubelet/device-plugins && mount --bind '$n/var-log' /var/log &&
    touch '$n/mounts.ready' && exec sleep 2147483647" </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/node-$k-mounts.pid"
  for _ in $(seq 1 50); do [ -f "$n/mounts.ready" ] && break; sleep 0.1; done
  [ -f "$n/mounts.ready" ] || { echo "test-cluster: node-$k: its mount namespace did not start" >&2; return 1; }
  local on_node=(nsenter --mount="/proc/$(cat "$dir/node-$k-mounts.pid")/ns/mnt" --net="/run/netns/tessera-k$k")
  setsid "${on_node[@]}" containerd --config "$n/containerd/config.toml" >"$n/logs/containerd.log" 2>&1 &
  echo $! >"$dir/node-$k-containerd.pid"
  local ctr=(ctr -a "$n/containerd/containerd.sock" -n k8s.io)
  for _ in $(seq 1 60); do "${ctr[@]}" version >/dev/null 2>&1 && break; sleep 0.5; done
  local image
  for image in pause worker controller; do
    "${ctr[@]}" images import "$dir/images/$image.tar" >/dev/null ||
      { echo "test-cluster: node-$k: containerd could not import the $image image" >&2; return 1; }
  done
  sed -e "s#server: \"https://[^\"]*\"#server: \"https://$HOST_ADDR:$(cat "$dir/apiserver.port")\"#" "$dir/kubeconfig" >"$n/kubeconfig"
  cat >"$n/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $addr
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /tessera-node-$k
clusterDNS: [$HOST_ADDR]
clusterDomain: cluster.local
resolvConf: ""
failSwapOn: false
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
nodeStatusUpdateFrequency: 4s
syncFrequency: 5s
fileCheckFrequency: 60s
runtimeRequestTimeout: 2m
serializeImagePulls: false
YAML
  local zone=$((k % zones))
  setsid "${on_node[@]}" "$CACHE/kubelet-$VERSION" --config="$n/kubelet.yaml" --kubeconfig="$n/kubeconfig" \
    --root-dir="$n/kubelet" --cert-dir="$n/kubelet/pki" --hostname-override="node-$k" --node-ip="$addr" \
    --container-runtime=remote --container-runtime-endpoint="unix://$n/containerd/containerd.sock" \
    --node-labels="topology.kubernetes.io/zone=zone-$zone,topology.tessera.dev/rack=rack-$zone-$((k / (2 * zones))),tessera.dev/test-node=true" \
    --v=1 >"$n/logs/kubelet.log" 2>&1 &
  echo $! >"$dir/node-$k-kubelet.pid"
  setsid "${on_node[@]}" "$CACHE/kube-proxy-$VERSION" --kubeconfig="$n/kubeconfig" --hostname-override="node-$k" \
    --bind-address="$addr" --proxy-mode=iptables --masquerade-all --cluster-cidr=10.79.0.0/16 \
    --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
    --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256 >"$n/logs/kube-proxy.log" 2>&1 &
  echo $! >"$dir/node-$k-proxy.pid"
  if ((gpus > 0)); then
    setsid "$bin_dir/tessera-device-plugin" --kubelet-dir "$n/device-plugins" --devices "$gpus" \
      >"$n/logs/device-plugin.log" 2>&1 &
    echo $! >"$dir/node-$k-device-plugin.pid"
  fi
}

# wait_nodes DIR COUNT GPUS: until COUNT nodes are Ready with GPUS GPUs allocatable each.
wait_nodes() {
  local dir=$1 count=$2 gpus=$3 ready=0
  for _ in $(seq 1 240); do
    ready=$(kubectl --kubeconfig "$dir/kubeconfig" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' 2>/dev/null |
      grep -c "^True ${gpus/#0/}" || true)
    ((ready >= count)) && return 0
    sleep 0.5
  done
  echo "test-cluster: $ready of $count nodes Ready with $gpus GPUs after 120 s; kubelet log ends:" >&2
  tail -n 5 "$dir"/nodes/node-*/logs/kubelet.log >&2
  return 1
}

# Stops node K's processes and everything its containers left: processes, cgroups, network. (Its
# mounts live in its own mount namespace and go with its last process.)
stop_node() {
  local dir=$1 k=$2
  local n=$dir/nodes/node-$k
  stop_one "$dir" "node-$k-device-plugin"
  stop_one "$dir" "node-$k-kubelet"
  stop_one "$dir" "node-$k-proxy"
  # The containers' processes: every process in the node's cgroups (the shims are outside them).
  local c p
  for _ in 1 2 3; do
    for c in /sys/fs/cgroup/pids/tessera-node-$k /sys/fs/cgroup/memory/tessera-node-$k; do
      [ -d "$c" ] || continue
      for p in $(find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    done
    sleep 0.2
  done
  stop_one "$dir" "node-$k-containerd"
  stop_one "$dir" "node-$k-mounts"
  # Whatever a pid file missed (a half-started node), by the node's own paths.
  # (pgrep, then kill: pkill -f would match its own command line, which holds the pattern)
  for p in $(pgrep -f -- "-address $n/containerd/containerd.sock|--config $n/containerd/config.toml|--kubeconfig=$n/kubeconfig|--kubelet-dir $n/|$n/mounts.ready" || true); do
    kill -9 "$p" 2>/dev/null || true
  done
  for c in /sys/fs/cgroup/*/tessera-node-$k; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ip netns del "tessera-k$k" 2>/dev/null || true
  ip link del "tsk${k}h" 2>/dev/null || true
}

start() {
  local dir=$1
  shift
  local nodes=0 gpus=2 zones=2 simulate="" bin_dir=""
  while (($#)); do
    case $1 in
      --nodes) nodes=$2; shift 2 ;;
      --gpus) gpus=$2; shift 2 ;;
      --zones) zones=$2; shift 2 ;;
      --simulate) simulate=$2; shift 2 ;;
      --bin-dir) bin_dir=$2; shift 2 ;;
      *) echo "test-cluster: unknown option '$1'" >&2; exit 2 ;;
    esac
  done
  built || { echo "test-cluster: the Kubernetes binaries are not all in $CACHE; run scripts/test-cluster.sh build" >&2; exit 1; }
  require etcd openssl kubectl python3
  if [ -n "$simulate" ] && [ ! -x "$simulate" ]; then
    echo "test-cluster: --simulate needs the simulated nodes' binary (build/bin/tessera-simulated-nodes), not '$simulate'" >&2
    exit 2
  fi
  local real=0
  if ((nodes > 0)) && [ -z "$simulate" ]; then
    real=$nodes
    require containerd ctr runc nsenter iptables ip
    [ "$(id -u)" = 0 ] || { echo "test-cluster: real nodes need root (namespaces, containerd, kubelet)" >&2; exit 1; }
    ((gpus == 0)) || [ -x "$bin_dir/tessera-device-plugin" ] ||
      { echo "test-cluster: --gpus $gpus needs --bin-dir with tessera-device-plugin" >&2; exit 2; }
    # One real cluster at a time: its network and cgroups have fixed names.
    clear_leftovers
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  ((real)) && echo "$dir" >"$OWNER"
  local etcd_port peer_port token addr=127.0.0.1
  if ((real)); then
    "${NETNS[@]}" bridge >/dev/null
    addr=$HOST_ADDR
    bash "$(dirname "$0")/images.sh" archives "$dir/images" || { stop "$dir"; exit 1; }
  fi
  echo "$addr" >"$dir/apiserver.addr"
  etcd_port=$(free_port)
  peer_port=$(free_port)
  echo "$etcd_port" >"$dir/etcd.port"
  free_port >"$dir/apiserver.port"
  token=$(openssl rand -hex 16)
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
  setsid etcd --name tessera-test --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "tessera-test=http://127.0.0.1:$peer_port" >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  cat >"$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://$addr:$(cat "$dir/apiserver.port")", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: $token}}]
contexts: [{name: test, context: {cluster: test, user: admin, namespace: default}}]
current-context: test
KC
  start_apiserver "$dir" || { stop "$dir"; exit 1; }
  # Garbage collection (owner references), namespace deletion and service-account tokens; with real
  # nodes also what a Deployment and a Service need, and the node lifecycle (taints, eviction).
  local controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token node_monitor=()
  ((real)) && controllers+=,deployment,replicaset,endpoint,endpointslice,nodelifecycle
  # A node whose kubelet stopped is NotReady after 20 s (40 s by default; the kubelets here report
  # every 4 s), so that the tests of a lost node are short.
  ((real)) && node_monitor=(--node-monitor-grace-period=20s --node-monitor-period=2s)
  setsid "$CACHE/kube-controller-manager-$VERSION" --kubeconfig="$dir/kubeconfig" --bind-address=127.0.0.1 --secure-port=0 --port=0 \
    --controllers=$controllers "${node_monitor[@]}" \
    --service-account-private-key-file="$dir/sa.key" --root-ca-file="$dir/certs/apiserver.crt" \
    --leader-elect=false >"$dir/controller-manager.log" 2>&1 &
  echo $! >"$dir/controller-manager.pid"
  if ((real)); then
    setsid "$CACHE/kube-scheduler-$VERSION" --kubeconfig="$dir/kubeconfig" --leader-elect=false --port=0 \
      --bind-address=127.0.0.1 --secure-port="$(free_port)" >"$dir/scheduler.log" 2>&1 &
    echo $! >"$dir/scheduler.pid"
    setsid python3 "$(dirname "$0")/../testing/cluster_dns.py" --kubeconfig "$dir/kubeconfig" --listen "$HOST_ADDR:53" \
      >"$dir/dns.log" 2>&1 &
    echo $! >"$dir/dns.pid"
    echo "$gpus $zones $bin_dir" >"$dir/nodes.conf"
    # The nodes side by side (importing the images takes most of a node's start).
    local k failed=0 pids=()
    for ((k = 0; k < nodes; k++)); do
      start_node "$dir" "$k" "$gpus" "$zones" "$bin_dir" &
      pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k" || failed=1; done
    ((failed == 0)) || { stop "$dir"; exit 1; }
    route_pods "$dir"
    wait_nodes "$dir" "$nodes" "$gpus" || { stop "$dir"; exit 1; }
  elif ((nodes > 0)); then
    setsid "$simulate" --kubeconfig "$dir/kubeconfig" --nodes "$nodes" --gpus "$gpus" --zones "$zones" \
      >"$dir/simulated-nodes.log" 2>&1 &
    echo $! >"$dir/simulated-nodes.pid"
    for _ in $(seq 1 120); do
      [ "$(kubectl --kubeconfig "$dir/kubeconfig" get nodes --no-headers 2>/dev/null | grep -c ' Ready')" -ge "$nodes" ] && break
      kill -0 "$(cat "$dir/simulated-nodes.pid")" 2>/dev/null || { tail -20 "$dir/simulated-nodes.log" >&2; stop "$dir"; exit 1; }
      sleep 0.5
    done
  fi
  # The default service account, which pods need before they are admitted.
  for _ in $(seq 1 120); do
    kubectl --kubeconfig "$dir/kubeconfig" get serviceaccount default >/dev/null 2>&1 && break
    sleep 0.5
  done
  echo "test-cluster: ready on $addr:$(cat "$dir/apiserver.port") with $nodes ${simulate:+simulated }nodes (kubeconfig $dir/kubeconfig)"
}

# add_node DIR: one real node more (node-K, K the next index), as the others were started.
add_node() {
  local dir=$1 gpus zones bin_dir k
  [ -f "$dir/nodes.conf" ] || { echo "test-cluster: $dir has no real nodes" >&2; exit 1; }
  read -r gpus zones bin_dir <"$dir/nodes.conf"
  k=$(($(nodes_of "$dir" | tail -1) + 1))
  start_node "$dir" "$k" "$gpus" "$zones" "$bin_dir" || exit 1
  route_pods "$dir"
  wait_nodes "$dir" "$(live_nodes_of "$dir" | wc -l)" "$gpus" || exit 1  # a lost node stays NotReady
  echo "test-cluster: node-$k is Ready"
}

# stop_one DIR NAME [WAIT]: SIGTERM, then SIGKILL after WAIT tenths of a second (default 100).
stop_one() {
  local dir=$1 name=$2 wait=${3:-100}
  [ -f "$dir/$name.pid" ] || return 0
  local pid
  pid=$(cat "$dir/$name.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 "$wait"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/$name.pid"
}

# kube-apiserver on SIGTERM closes its port at once, then waits up to 60 s for its clients' watches
# to end, which they do not. Its state is in etcd: after 2 s it is killed, so that the API server is
# gone for no longer than a test asks. A longer outage marks nodes NotReady (their kubelets cannot
# report; the node monitor's grace is 20 s here) and looks like lost nodes to the controller.
stop_apiserver() { stop_one "$1" apiserver 20; }

# The directory of the running cluster with real nodes (written by start, removed by stop).
OWNER=/run/tessera-test-cluster
# A real cluster runs while its etcd, started from its directory, does.
cluster_alive() {
  local dir=$1 pid
  pid=$(cat "$dir/etcd.pid" 2>/dev/null) || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--data-dir $dir/etcd"
}

# Before a start with real nodes: refuses if another such cluster runs; removes what one that ended
# without a stop (a killed test, a restarted machine) left: its processes, cgroups and network.
clear_leftovers() {
  local old k
  old=$(cat "$OWNER" 2>/dev/null || true)
  if [ -n "$old" ] && cluster_alive "$old"; then
    echo "test-cluster: another test cluster with real nodes is running (in $old); stop it first" >&2
    exit 1
  fi
  [ -n "$old" ] || ip link show tessera-kbr >/dev/null 2>&1 || return 0
  echo "test-cluster: removing what a test cluster that was not stopped left${old:+ (in $old)}" >&2
  [ -n "$old" ] && [ -d "$old" ] && stop "$old"
  for k in $(ls /run/netns 2>/dev/null | sed -n 's/^tessera-k\([0-9]*\)$/\1/p'; ls -d /sys/fs/cgroup/*/tessera-node-* 2>/dev/null | sed 's/.*tessera-node-//' | sort -u); do
    stop_node /nonexistent "$k"
  done
  "${NETNS[@]}" down >/dev/null 2>&1 || true
  rm -f "$OWNER"
}

stop() {
  local dir=$1 k
  # The nodes first: they stop the pods' processes.
  stop_one "$dir" simulated-nodes
  for k in $(nodes_of "$dir"); do stop_node "$dir" "$k"; done
  if [ -f "$dir/nodes.conf" ]; then
    "${NETNS[@]}" down >/dev/null 2>&1 || true
    rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true  # the mount points, once unused
  fi
  for name in dns scheduler controller-manager apiserver etcd; do stop_one "$dir" "$name"; done
  [ "$(cat "$OWNER" 2>/dev/null)" != "$dir" ] || rm -f "$OWNER"
}

account_kubeconfig() {
  local dir=$1 ns=$2 account=$3 secret= server
  export KUBECONFIG=$dir/kubeconfig
  # kube-controller-manager's token controller writes the account's token Secret.
  for _ in $(seq 1 60); do
    secret=$(kubectl get serviceaccount "$account" -n "$ns" -o jsonpath='{.secrets[0].name}' 2>/dev/null)
    [ -n "$secret" ] && break
    sleep 0.5
  done
  [ -n "$secret" ] || { echo "test-cluster: no token for service account $ns/$account" >&2; exit 1; }
  server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
  cat <<EOF
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "$server", insecure-skip-tls-verify: true}}]
users: [{name: $account, user: {token: $(kubectl get secret "$secret" -n "$ns" -o jsonpath='{.data.token}' | base64 -d)}}]
contexts: [{name: test, context: {cluster: test, user: $account}}]
current-context: test
EOF
}

case "${1:-}" in
  build) build ;;
  start) start "${2:?start needs a directory}" "${@:3}" ;;
  stop) stop "${2:?stop needs a directory}" ;;
  restart-apiserver)
    stop_apiserver "${2:?restart-apiserver needs a directory}"
    start_apiserver "$2"
    ;;
  add-node) add_node "${2:?add-node needs a directory}" ;;
  lose-node) stop_node "${2:?lose-node needs a directory}" "${3:?and a node index}" ;;
  stop-apiserver) stop_apiserver "${2:?stop-apiserver needs a directory}" ;;
  start-apiserver) start_apiserver "${2:?start-apiserver needs a directory}" ;;
  account-kubeconfig) account_kubeconfig "${2:?account-kubeconfig needs a directory}" "${3:?and a namespace}" "${4:?and an account}" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/!p}' "$0" >&2; exit 2 ;;
esac
