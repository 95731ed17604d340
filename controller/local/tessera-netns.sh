#!/usr/bin/env bash
# tessera-netns: the emulated network of `tessera run` (spec.local.network) and of the cluster
# benchmarks, installed beside tessera and tessera-worker. An emulated cloud cluster on one machine: one network namespace per virtual node (tessera-n0,
# tessera-n1, ...), each with loopback inside and one veth "NIC" (eth0, 10.77.0.K+1/24) on a
# bridge (tessera-br, 10.77.0.254 in this machine's namespace). Each NIC's rate is limited in both
# directions with tc (a token bucket, tbf), and its latency with netem where the kernel has it.
# Only these namespaces, their veths and the bridge are created or touched; the only addresses
# used are theirs (10.77.0.0/24) and loopback.
#
#   tessera-netns up --nodes N --rate RATE [--delay DELAY]
#                            RATE as tc writes it (1gbit, 200mbit); DELAY as 0.2ms (needs netem)
#   tessera-netns add K --rate RATE [--delay DELAY]
#                            one node more beside those up (the bridge made if missing)
#   tessera-netns bridge     only the bridge and this machine's address on it
#   tessera-netns rate K RATE   sets node K's link to RATE, both ways (a node made slow mid-run);
#                               its delay, if any, is kept
#   tessera-netns down          removes every tessera-n* namespace, its veth and the bridge
#   tessera-netns addr K        prints node K's address
#   tessera-netns exec K CMD... runs CMD in node K's namespace
#   tessera-netns status        lists the nodes with their addresses and qdiscs
# TESSERA_NETNS_SET=cluster works on the test cluster's set instead (scripts/test-cluster.sh: nodes
# tessera-k0.., bridge tessera-kbr, 10.78.0.0/24), so a test cluster and an emulated run coexist.
# Needs root (ip netns, tc: iproute2).
set -euo pipefail

die() { echo "tessera-netns: $*" >&2; exit 1; }

case ${TESSERA_NETNS_SET:-emulated} in
  emulated) PREFIX=10.77.0 BRIDGE=tessera-br NS=tessera-n VETH=tsn ;;
  cluster) PREFIX=10.78.0 BRIDGE=tessera-kbr NS=tessera-k VETH=tsk ;;
  *) die "TESSERA_NETNS_SET='$TESSERA_NETNS_SET': emulated or cluster" ;;
esac

# The bytes a token bucket may send at once: 1 ms of RATE, at least 64 KiB (several full frames).
burst_of() {
  python3 - "$1" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|bps)", sys.argv[1].lower())
if not m:
    sys.exit(f"tessera-netns: --rate '{sys.argv[1]}' is not a rate such as 1gbit or 200mbit")
v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
bits = v if m.group(3) == "bit" else 8 * v
print(max(65536, int(bits / 8 / 1000)))
PY
}

shape() {  # shape DEV RATE DELAY [NETNS]
  local dev=$1 rate=$2 delay=$3 ns=${4:-} burst
  burst=$(burst_of "$rate")
  local run=()
  [ -n "$ns" ] && run=(ip netns exec "$ns")
  if [ -n "$delay" ]; then
    "${run[@]}" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null ||
      die "--delay $delay: this kernel has no netem queueing discipline (sch_netem), so latency cannot be emulated here; leave out --delay"
    "${run[@]}" tc qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 100ms
  else
    "${run[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NS[0-9]+\$" || true); do
    ip netns del "$ns"  # its end of the veth goes with it, and so the pair
  done
  for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$VETH[0-9]+h\$" || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# The bridge, with this machine's address on it, unless it exists.
bridge() {
  ip link show "$BRIDGE" >/dev/null 2>&1 && return 0
  ip link add "$BRIDGE" type bridge
  ip addr add "$PREFIX.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# add_node K RATE DELAY: namespace $NS$K with its NIC on the bridge, shaped both ways.
add_node() {
  local k=$1 rate=$2 delay=$3
  local ns=$NS$k host=$VETH${k}h
  ip netns add "$ns"
  ip link add "$host" type veth peer name "$VETH${k}n"
  ip link set "$VETH${k}n" netns "$ns"
  ip -n "$ns" link set "$VETH${k}n" name eth0
  ip -n "$ns" addr add "$PREFIX.$((k + 1))/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip link set "$host" master "$BRIDGE"
  ip link set "$host" up
  shape eth0 "$rate" "$delay" "$ns"  # what the node sends
  shape "$host" "$rate" "$delay"     # what it receives
}

# Reads --rate and --delay into rate and delay (and --nodes into nodes).
parse_link() {
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      *) die "unknown flag '$1' (see the header of $0)" ;;
    esac
  done
  [ -n "$rate" ] || die "--rate is required (for example 1gbit)"
  burst_of "$rate" >/dev/null
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces and tc)"
  command -v tc >/dev/null && command -v ip >/dev/null || die "iproute2 (ip, tc) is missing"
}

up() {
  local nodes=0 rate= delay=
  parse_link "$@"
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || die "--nodes '$nodes' is not a count in [1, 200]"
  down
  trap 'down' EXIT  # a failure half way leaves nothing behind
  bridge
  for ((k = 0; k < nodes; k++)); do add_node "$k" "$rate" "$delay"; done
  trap - EXIT
  echo "tessera-netns: $nodes nodes ($NS""0..$NS$((nodes - 1)), $PREFIX.1..$PREFIX.$nodes), links of $rate${delay:+ and $delay}"
}

# add K --rate RATE [--delay DELAY]: one node more, beside those up (the bridge made if missing).
add() {
  local k=${1:?add needs a node index} nodes=0 rate= delay=
  shift
  [[ $k =~ ^[0-9]+$ ]] && [ "$k" -le 200 ] || die "add: '$k' is not a node index in [0, 200]"
  parse_link "$@"
  ip netns list | awk '{print $1}' | grep -qx "$NS$k" && die "add: node $k ($NS$k) exists"
  bridge
  add_node "$k" "$rate" "$delay"
  echo "tessera-netns: node $k ($NS$k, $PREFIX.$((k + 1))), link of $rate${delay:+ and $delay}"
}

# Changes node K's token buckets (what it sends and what it receives) to RATE.
rate() {
  local k=${1:?rate needs a node index} new=${2:?rate needs a rate such as 100mbit} burst
  [[ $k =~ ^[0-9]+$ ]] || die "rate: '$k' is not a node index"
  ip netns list | awk '{print $1}' | grep -qx "$NS$k" || die "rate: there is no node $k ($NS$k); bring the cluster up first"
  burst=$(burst_of "$new")
  local parent=(root) qdisc
  # With a delay the token bucket is netem's child (handle 2:); without, it is the root.
  qdisc=$(ip netns exec "$NS$k" tc qdisc show dev eth0)
  [[ $qdisc == *netem* ]] && parent=(parent 1: handle 2:)
  ip netns exec "$NS$k" tc qdisc change dev eth0 "${parent[@]}" tbf rate "$new" burst "$burst" latency 100ms
  tc qdisc change dev "$VETH${k}h" "${parent[@]}" tbf rate "$new" burst "$burst" latency 100ms
  echo "tessera-netns: node $k's link now runs at $new"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  add) shift; add "$@" ;;
  bridge) [ "$(id -u)" = 0 ] || die "needs root"; bridge ;;
  rate) shift; rate "$@" ;;
  down) down ;;
  addr) echo "$PREFIX.$((${2:?addr needs a node index} + 1))" ;;
  exec) k=${2:?exec needs a node index}; shift 2; exec ip netns exec "$NS$k" "$@" ;;
  status)
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$NS[0-9]+\$" | sort -V); do
      echo "$ns $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}') $(ip netns exec "$ns" tc qdisc show dev eth0 | tr '\n' ' ')"
    done ;;
  *) sed -n '2,23p' "$0" >&2; exit 2 ;;
esac
