#!/usr/bin/env bash
# A real Kubernetes API server for tests, on loopback: kube-apiserver v1.20.2 built from Debian
# bookworm's `kubernetes` source package (no package ships the binary) with etcd from etcd-server.
# There is no scheduler, kubelet or controller manager: it stores and validates objects.
#
#   scripts/test-apiserver.sh build       builds kube-apiserver once into $TESSERA_CACHE (default
#                                         ~/.cache/tessera; about 6 minutes on 2 cores)
#   scripts/test-apiserver.sh start DIR   starts etcd and the API server with their state in DIR and
#                                         writes DIR/kubeconfig (admin token); waits until it is ready
#   scripts/test-apiserver.sh stop DIR    stops them
set -euo pipefail

CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}
VERSION=v1.20.2
BIN=$CACHE/kube-apiserver-$VERSION

# The commands it needs come from scripts/deps.sh (make deps).
require() {
  for c in "$@"; do
    command -v "$c" >/dev/null || { echo "test-apiserver: '$c' is missing; run make deps" >&2; exit 1; }
  done
}

build() {
  if [ -x "$BIN" ]; then
    echo "test-apiserver: $BIN is built"
    return
  fi
  PATH=/usr/lib/go-1.19/bin:$PATH require go rsync apt-get dpkg-deb make
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  # The source package (and reflect2's), through a private APT configuration with its own lists
  # and a deb-src entry (/etc/apt is left alone).
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
  printf 'deb http://deb.debian.org/debian bookworm main\ndeb-src http://deb.debian.org/debian bookworm main\n' >"$work/apt/sources.list"
  cat >"$work/apt/apt.conf" <<EOF
Dir::Etc::SourceList "$work/apt/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::State::Lists "$work/apt/lists";
Dir::Cache "$work/apt/cache";
EOF
  echo "test-apiserver: fetching Debian's kubernetes source package"
  (cd "$work" && APT_CONFIG=$work/apt/apt.conf apt-get -o APT::Sandbox::User=root update -q >/dev/null &&
    APT_CONFIG=$work/apt/apt.conf apt-get -o APT::Sandbox::User=root source --download-only -q kubernetes >/dev/null 2>&1 &&
    APT_CONFIG=$work/apt/apt.conf apt-get -o APT::Sandbox::User=root download -q golang-github-modern-go-reflect2-dev >/dev/null 2>&1) ||
    { echo "test-apiserver: cannot fetch the kubernetes source package from deb.debian.org" >&2; exit 1; }
  tar -xzf "$work"/kubernetes_*.orig.tar.gz -C "$work"
  local src
  src=$(find "$work" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
  # The vendored reflect2 v1.0.1 crashes under Go 1.18+ on the first custom-resource write: use v1.0.2.
  dpkg-deb -x "$work"/golang-github-modern-go-reflect2-dev_*.deb "$work/reflect2"
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r "$work/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2" "$src/vendor/github.com/modern-go/"
  echo "test-apiserver: building kube-apiserver $VERSION (a few minutes)"
  (cd "$src" && PATH=/usr/lib/go-1.19/bin:$PATH CGO_ENABLED=0 KUBE_GIT_VERSION=$VERSION KUBE_GIT_TREE_STATE=clean \
    make WHAT=cmd/kube-apiserver >"$work/build.log" 2>&1) || { tail -20 "$work/build.log" >&2; exit 1; }
  mkdir -p "$CACHE"
  cp "$src/_output/bin/kube-apiserver" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
  echo "test-apiserver: built $BIN"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local dir=$1
  [ -x "$BIN" ] || { echo "test-apiserver: $BIN is missing; run scripts/test-apiserver.sh build" >&2; exit 1; }
  require etcd openssl kubectl python3 curl
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local etcd_port peer_port api_port token
  etcd_port=$(free_port)
  peer_port=$(free_port)
  api_port=$(free_port)
  token=$(openssl rand -hex 16)
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
  setsid etcd --name tessera-test --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "tessera-test=http://127.0.0.1:$peer_port" >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  setsid "$BIN" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 --secure-port="$api_port" \
    --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$dir/sa.pub" \
    --service-account-signing-key-file="$dir/sa.key" --service-cluster-ip-range=10.96.0.0/16 >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: $token}}]
contexts: [{name: test, context: {cluster: test, user: admin, namespace: default}}]
current-context: test
EOF
  for _ in $(seq 1 120); do
    if kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
      echo "test-apiserver: ready on 127.0.0.1:$api_port (kubeconfig $dir/kubeconfig)"
      return
    fi
    sleep 0.5
  done
  echo "test-apiserver: not ready after 60 s; the end of its log:" >&2
  tail -20 "$dir/apiserver.log" >&2
  stop "$dir"
  exit 1
}

stop() {
  local dir=$1
  for name in apiserver etcd; do
    [ -f "$dir/$name.pid" ] || continue
    local pid
    pid=$(cat "$dir/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
}

case "${1:-}" in
  build) build ;;
  start) start "${2:?start needs a directory}" ;;
  stop) stop "${2:?stop needs a directory}" ;;
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
