#!/usr/bin/env bash
# The emulated cluster (tessera-netns): nodes in their own network namespaces reach
# each other only over their rate-limited links; the rate measured between two nodes is the one
# asked for (within 25%), loopback inside a node is not limited, a delay without netem fails with
# the reason, and `down` leaves no namespace, veth or bridge behind; a job runs on it, and a node cut
# off mid-run fails the gang in bounded time naming the rank, and a node slowed mid-run is named as
# the straggler while the job goes on. Cleans up on exit, pass or fail.
#   usage: emulated_cluster_test.sh SOURCE_DIR PYTHON BIN_DIR
set -euo pipefail
src=$1
py=$2
bin=$3
cluster=$bin/tessera-netns
tp=$src/bench/cluster/throughput.py
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: network namespaces need root"
  exit 77
fi
fail() { echo "FAIL $*" >&2; exit 1; }

# rate_between OUT A B: Mbit/s from node A to node B (port 5201), sending for 2 s.
rate_between() {
  local out=$1 a=$2 b=$3
  timeout 20 "$cluster" exec "$b" "$py" "$tp" --serve 5201 >"$out" &
  local server=$!
  for _ in $(seq 1 50); do grep -q ready "$out" && break; sleep 0.1; done
  timeout 20 "$cluster" exec "$a" "$py" "$tp" "$("$cluster" addr "$b")" 5201 2
  wait "$server"
  tail -1 "$out"
}
tmp=$(mktemp -d)
trap '"$cluster" down; rm -rf "$tmp"' EXIT

out=$("$cluster" up --nodes 2 --rate 200mbit --delay 1ms 2>&1) && {
  echo "PASS netem is available: a delay was applied"
} || {
  [[ $out == *"no netem queueing discipline"* ]] || fail "a refused delay without the reason: $out"
  [ -z "$(ip netns list | grep tessera-n)" ] || fail "a failed up left namespaces behind"
  echo "PASS a delay this kernel cannot emulate is refused with the reason, leaving nothing behind"
}

"$cluster" up --nodes 3 --rate 200mbit >/dev/null
[ "$(ip netns list | grep -c '^tessera-n')" = 3 ] || fail "not 3 namespaces: $(ip netns list)"
for pair in "0 1" "2 0"; do
  set -- $pair
  mbps=$(rate_between "$tmp/r$1$2" "$1" "$2")
  "$py" -c "import sys; r = float('$mbps'); sys.exit(0 if 150 <= r <= 210 else 1)" ||
    fail "node $1 -> node $2: $mbps Mbit/s over a 200mbit link"
  echo "PASS node $1 -> node $2: $mbps Mbit/s over a 200mbit link"
done
# Inside a node: loopback, unlimited.
timeout 20 "$cluster" exec 0 "$py" "$tp" --serve 5202 >"$tmp/lo.out" &
server=$!
for _ in $(seq 1 50); do grep -q ready "$tmp/lo.out" && break; sleep 0.1; done
timeout 20 "$cluster" exec 0 "$py" "$tp" 127.0.0.1 5202 1
wait "$server"
lo=$(tail -1 "$tmp/lo.out")
"$py" -c "import sys; sys.exit(0 if float('$lo') > 1000 else 1)" || fail "loopback inside a node: $lo Mbit/s"
echo "PASS loopback inside a node: $lo Mbit/s"
# The nodes reach nothing but each other and the bridge: no default route, one subnet.
routes=$(ip -n tessera-n1 -4 route show)
[ "$routes" = "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2 " ] || [ "$routes" = "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2" ] ||
  fail "node 1 has routes beyond the cluster: $routes"
echo "PASS a node has no route beyond the cluster"

"$cluster" down
[ -z "$(ip netns list | grep tessera-n)" ] || fail "down left namespaces: $(ip netns list)"
! ip link show tessera-br >/dev/null 2>&1 || fail "down left the bridge"
[ -z "$(ip -o link show | grep -E ': tsn[0-9]+h')" ] || fail "down left veths"
echo "PASS down removes every namespace, veth and the bridge"

# tessera run with spec.local.network.
cat >"$tmp/job.yaml" <<EOF
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata: {name: netjob}
spec:
  replicas: 2
  ranksPerReplica: 2
  model: {name: cosmoflow, inputSize: 16, hidden: [32, 16]}
  dataset: {format: synthetic, samples: 64, validationSamples: 16}
  training: {epochs: 12, batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}
  communication: {strategy: hybrid, sparse: hitopk, dense: torus, switchAtEpoch: 6, density: 0.01}
  local: {nodes: 2, gpusPerNode: 2, workDir: $tmp/work, network: {rate: 200mbit}}
EOF
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 120 "$bin/tessera" run "$tmp/job.yaml" --metrics-addr "127.0.0.1:$port" >"$tmp/run.log" 2>&1 &
run=$!
targets=
for _ in $(seq 1 200); do
  targets=$(curl -sf "http://127.0.0.1:$port/targets" 2>/dev/null || true)
  [ "$(echo "$targets" | grep -o '"10.77.0.[12]:[0-9]*"' | wc -l)" = 4 ] && break
  sleep 0.1
done
wait "$run" || fail "tessera run with an emulated network: $(tail -5 "$tmp/run.log")"
[ "$(echo "$targets" | grep -o '"10.77.0.[12]:[0-9]*"' | wc -l)" = 4 ] ||
  fail "the 4 workers were not seen at the nodes' addresses: $targets"
grep -q "netjob Succeeded" "$tmp/run.log" || fail "the job did not succeed: $(tail -5 "$tmp/run.log")"
[ -z "$(ip netns list | grep tessera-n)" ] || fail "tessera run left namespaces: $(ip netns list)"
echo "PASS tessera run with spec.local.network: 4 workers at the nodes' addresses, Succeeded, the cluster removed"

# A node cut off mid-run (its link down): the gang fails within the collective deadline (5 s here)
# with an error naming the unreachable rank, is restarted (and fails again the same way while the
# node stays cut off), never hangs, and succeeds once the link is back.
cat >"$tmp/cut.yaml" <<EOF2
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata: {name: cutjob}
spec:
  replicas: 2
  ranksPerReplica: 1
  model: {name: cosmoflow, inputSize: 16, baseChannels: 4, hidden: [16]}
  dataset: {format: synthetic, samples: 64, validationSamples: 16}
  training: {epochs: 40, batchSize: 4, threads: 1, optimizer: {name: adam, learningRate: 0.001}}
  communication: {strategy: dense, timeoutSeconds: 5}
  checkpoint: {path: ckpt, everySteps: 20}
  runPolicy: {backoffLimit: 4}
  local: {nodes: 2, gpusPerNode: 1, workDir: $tmp/cut, network: {rate: 200mbit}}
EOF2
status_field() { "$py" -c "import json,sys; s=json.load(open('$tmp/cut/status.json'))['status']; print(s.get('$1', ''))" 2>/dev/null || true; }
timeout 180 "$bin/tessera" run "$tmp/cut.yaml" --progress 2 >"$tmp/cut.log" 2>&1 &
run=$!
for _ in $(seq 1 300); do [ "$(status_field step)" -ge 60 ] 2>/dev/null && break; sleep 0.1; done
[ "$(status_field step)" -ge 60 ] 2>/dev/null || fail "the cut job did not reach step 60: $(tail -5 "$tmp/cut.log")"
ip -n tessera-n1 link set eth0 down
cut_at=$(date +%s.%N)
for _ in $(seq 1 300); do [ "$(status_field restarts)" -ge 1 ] 2>/dev/null && break; sleep 0.1; done
failed_after=$("$py" -c "import time; print(round(time.time() - $cut_at, 1))")
[ "$(status_field restarts)" -ge 1 ] 2>/dev/null || fail "no gang restart 30 s after node 1 was cut off: $(tail -5 "$tmp/cut.log")"
"$py" -c "import sys; sys.exit(0 if $failed_after <= 12 else 1)" || fail "the gang failed $failed_after s after the cut (deadline 5 s)"
grep -q "rank 1 (global 1) did not answer within 5000 ms" "$tmp/cut.log" ||
  fail "the failure does not name the unreachable rank: $(grep failed "$tmp/cut.log" | head -2)"
sleep 3
ip -n tessera-n1 link set eth0 up
wait "$run" || fail "the cut job did not finish once the link was back: $(tail -5 "$tmp/cut.log")"
grep -q "cutjob Succeeded" "$tmp/cut.log" || fail "the cut job did not succeed: $(tail -5 "$tmp/cut.log")"
echo "PASS a node cut off: the gang failed $failed_after s after the cut naming rank 1, restarted $(status_field restarts) time(s), succeeded once the link was back"

# A node made slow mid-run (its link rate-limited to a tenth): the job goes on and finishes, and the
# ranks' link probes name the node in the status (slowRanks, the Straggler condition) and an Event;
# once its link is back the status clears. Before the slowdown no one is named.
cat >"$tmp/slow.yaml" <<EOF3
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata: {name: slowjob}
spec:
  replicas: 3
  ranksPerReplica: 1
  model: {name: cosmoflow, inputSize: 16, baseChannels: 4, hidden: [16]}
  dataset: {format: synthetic, samples: 60, validationSamples: 12}
  training: {epochs: 200, batchSize: 6, threads: 1, optimizer: {name: adam, learningRate: 0.001}}
  communication: {strategy: dense}
  local: {nodes: 3, gpusPerNode: 1, workDir: $tmp/slow, network: {rate: 200mbit}}
EOF3
slow_status() {  # slowRanks as JSON, then the Straggler condition's status and message
  "$py" -c "
import json
s = json.load(open('$tmp/slow/status.json'))['status']
c = [c for c in s.get('conditions', []) if c['type'] == 'Straggler']
print(json.dumps(s.get('slowRanks')), c[0]['status'] if c else '-', c[0].get('message', '') if c else '')" 2>/dev/null || true
}
timeout 240 "$bin/tessera" run "$tmp/slow.yaml" --progress 5 >"$tmp/slow.log" 2>&1 &
run=$!
for _ in $(seq 1 600); do [ "$("$py" -c "import json; print(json.load(open('$tmp/slow/status.json'))['status'].get('step', 0))" 2>/dev/null)" -ge 300 ] 2>/dev/null && break; sleep 0.1; done
before=$(slow_status)
[[ $before == "null -"* ]] || fail "a rank was named slow before any node was: $before"
"$cluster" rate 2 20mbit >/dev/null
slowed_at=$(date +%s)
for _ in $(seq 1 600); do [[ $(slow_status) == "[2] True"* ]] && break; sleep 0.1; done
named=$(slow_status)
[[ $named == "[2] True node local-2 (rank 2) has a slow network"* ]] ||
  fail "node 2 was not named slow 60 s after its link was cut to a tenth: $named ($(tail -3 "$tmp/slow.log"))"
named_after=$(($(date +%s) - slowed_at))
grep -q "slowjob: Straggler: node local-2 (rank 2) has a slow network" "$tmp/slow.log" || fail "no Straggler event: $(tail -3 "$tmp/slow.log")"
"$cluster" rate 2 200mbit >/dev/null
for _ in $(seq 1 600); do [[ $(slow_status) == "null False"* ]] && break; sleep 0.1; done
[[ $(slow_status) == "null False"* ]] || fail "node 2 was still named 60 s after its link was back: $(slow_status)"
wait "$run" || fail "the job with a slow node did not finish: $(tail -5 "$tmp/slow.log")"
grep -q "slowjob Succeeded" "$tmp/slow.log" || fail "the job with a slow node did not succeed: $(tail -5 "$tmp/slow.log")"
[ "$(grep -c "Straggler" "$tmp/slow.log")" = 2 ] || fail "not one Straggler and one StragglerGone event: $(grep Straggler "$tmp/slow.log")"
echo "PASS a node slowed to a tenth: named in the status and an Event $named_after s later (${named#* True }), cleared once its link was back, the job succeeded"
