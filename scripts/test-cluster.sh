#!/usr/bin/env bash
# A real Kubernetes control plane for tests, on loopback: etcd (Debian's etcd-server), kube-apiserver
# and kube-controller-manager v1.20.2 built from Debian bookworm's `kubernetes` source package (no
# package ships the binaries), and the test node agent (testing/node_agent), which registers
# GPU nodes and runs the pods bound to them as local processes. There is no scheduler: the Tessera
# controller binds its pods itself.
#
#   scripts/test-cluster.sh build        builds kube-apiserver and kube-controller-manager once into
#                                        $TESSERA_CACHE (default ~/.cache/tessera; about 8 minutes on 2 cores)
#   scripts/test-cluster.sh start DIR [--nodes N] [--gpus G] [--zones Z] [--simulate] [--agent BIN] [--bin-dir D]
#                                        starts the control plane with its state in DIR, writes
#                                        DIR/kubeconfig (admin token) and waits until it is ready; with
#                                        --nodes N (default 0) the node agent BIN registers N nodes of G
#                                        GPUs (default 2) spread over Z zones (default 2)
#   scripts/test-cluster.sh stop DIR     stops everything started in DIR
#   scripts/test-cluster.sh restart-apiserver DIR
#                                        stops and starts kube-apiserver alone (same port, same etcd)
#   scripts/test-cluster.sh stop-apiserver DIR / start-apiserver DIR
#                                        the same in two steps (the API server gone meanwhile)
#   scripts/test-cluster.sh account-kubeconfig DIR NAMESPACE ACCOUNT
#                                        prints a kubeconfig that authenticates as service account
#                                        NAMESPACE/ACCOUNT (its token, not the admin's)
set -euo pipefail

CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}
VERSION=v1.20.2
APISERVER=$CACHE/kube-apiserver-$VERSION
CONTROLLER_MANAGER=$CACHE/kube-controller-manager-$VERSION

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

build() {
  if [ -x "$APISERVER" ] && [ -x "$CONTROLLER_MANAGER" ]; then
    echo "test-cluster: $APISERVER and $CONTROLLER_MANAGER are built"
    return
  fi
  PATH=/usr/lib/go-1.19/bin:$PATH require go rsync apt-get dpkg-deb make python3
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
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
  echo "test-cluster: building kube-apiserver and kube-controller-manager $VERSION (several minutes)"
  (cd "$src" && PATH=/usr/lib/go-1.19/bin:$PATH CGO_ENABLED=0 KUBE_GIT_VERSION=$VERSION KUBE_GIT_TREE_STATE=clean \
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$work/build.log" 2>&1) ||
    { tail -20 "$work/build.log" >&2; exit 1; }
  mkdir -p "$CACHE"
  cp "$src/_output/bin/kube-apiserver" "$APISERVER.tmp" && mv "$APISERVER.tmp" "$APISERVER"
  cp "$src/_output/bin/kube-controller-manager" "$CONTROLLER_MANAGER.tmp" && mv "$CONTROLLER_MANAGER.tmp" "$CONTROLLER_MANAGER"
  echo "test-cluster: built $APISERVER and $CONTROLLER_MANAGER"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_apiserver() {
  local dir=$1
  setsid "$APISERVER" --etcd-servers="http://127.0.0.1:$(cat "$dir/etcd.port")" --bind-address=127.0.0.1 \
    --secure-port="$(cat "$dir/apiserver.port")" --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" \
    --authorization-mode=RBAC --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  for _ in $(seq 1 120); do
    if kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "test-cluster: the API server is not ready after 60 s; the end of its log:" >&2
  tail -20 "$dir/apiserver.log" >&2
  return 1
}

start() {
  local dir=$1
  shift
  local nodes=0 gpus=2 zones=2 simulate="" agent="" bin_dir=""
  while (($#)); do
    case $1 in
      --nodes) nodes=$2; shift 2 ;;
      --gpus) gpus=$2; shift 2 ;;
      --zones) zones=$2; shift 2 ;;
      --simulate) simulate=--simulate; shift ;;
      --agent) agent=$2; shift 2 ;;
      --bin-dir) bin_dir=$2; shift 2 ;;
      *) echo "test-cluster: unknown option '$1'" >&2; exit 2 ;;
    esac
  done
  [ -x "$APISERVER" ] && [ -x "$CONTROLLER_MANAGER" ] ||
    { echo "test-cluster: $APISERVER or $CONTROLLER_MANAGER is missing; run scripts/test-cluster.sh build" >&2; exit 1; }
  require etcd openssl kubectl python3
  if ((nodes > 0)) && [ ! -x "$agent" ]; then
    echo "test-cluster: --nodes needs --agent, the node agent binary (build/bin/tessera-node-agent)" >&2
    exit 2
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local etcd_port peer_port token
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
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:$(cat "$dir/apiserver.port")", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: $token}}]
contexts: [{name: test, context: {cluster: test, user: admin, namespace: default}}]
current-context: test
EOF
  start_apiserver "$dir" || { stop "$dir"; exit 1; }
  # Garbage collection (owner references), namespace deletion and service-account tokens.
  setsid "$CONTROLLER_MANAGER" --kubeconfig="$dir/kubeconfig" --bind-address=127.0.0.1 --secure-port=0 --port=0 \
    --controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token \
    --service-account-private-key-file="$dir/sa.key" --root-ca-file="$dir/certs/apiserver.crt" \
    --leader-elect=false >"$dir/controller-manager.log" 2>&1 &
  echo $! >"$dir/controller-manager.pid"
  if ((nodes > 0)); then
    setsid "$agent" --kubeconfig "$dir/kubeconfig" --nodes "$nodes" --gpus "$gpus" --zones "$zones" --dir "$dir/agent" \
      ${bin_dir:+--bin-dir "$bin_dir"} $simulate >"$dir/node-agent.log" 2>&1 &
    echo $! >"$dir/node-agent.pid"
    for _ in $(seq 1 120); do
      [ "$(kubectl --kubeconfig "$dir/kubeconfig" get nodes --no-headers 2>/dev/null | grep -c ' Ready')" -ge "$nodes" ] && break
      kill -0 "$(cat "$dir/node-agent.pid")" 2>/dev/null || { tail -20 "$dir/node-agent.log" >&2; stop "$dir"; exit 1; }
      sleep 0.5
    done
  fi
  # The default service account, which pods need before they are admitted.
  for _ in $(seq 1 120); do
    kubectl --kubeconfig "$dir/kubeconfig" get serviceaccount default >/dev/null 2>&1 && break
    sleep 0.5
  done
  echo "test-cluster: ready on 127.0.0.1:$(cat "$dir/apiserver.port") with $nodes nodes (kubeconfig $dir/kubeconfig)"
}

stop_one() {
  local dir=$1 name=$2
  [ -f "$dir/$name.pid" ] || return 0
  local pid
  pid=$(cat "$dir/$name.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/$name.pid"
}

stop() {
  local dir=$1
  # The agent first: it stops the pods' processes.
  for name in node-agent controller-manager apiserver etcd; do stop_one "$dir" "$name"; done
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
    stop_one "${2:?restart-apiserver needs a directory}" apiserver
    start_apiserver "$2"
    ;;
  stop-apiserver) stop_one "${2:?stop-apiserver needs a directory}" apiserver ;;
  start-apiserver) start_apiserver "${2:?start-apiserver needs a directory}" ;;
  account-kubeconfig) account_kubeconfig "${2:?account-kubeconfig needs a directory}" "${3:?and a namespace}" "${4:?and an account}" ;;
  *) sed -n '2,22p' "$0" >&2; exit 2 ;;
esac
