#!/usr/bin/env bash
# The operator on a real test cluster (scripts/test-cluster.sh: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and 4 real nodes x 2 GPUs in two zones, each a kubelet and
# containerd running the worker image that scripts/images.sh builds from this build), driven with
# kubectl as a user would. The controllers run on this machine, serving the rendezvous on the
# nodes' bridge. Each scenario runs in its own namespace and is bounded in time; the
# cluster, the controllers and every temporary directory are removed on exit, pass or fail.
#   usage: kube_operator_test.sh BIN_DIR SOURCE_DIR [SCENARIO...]
# Scenarios: example kill restarts sigterm leader gang drain lifecycle images lost elastic (the
# start-up errors of tessera-controller are checked first, always; `startup` runs only those).
set -euo pipefail
bin=$1
src=$2
shift 2
scenarios=${*:-example kill restarts sigterm leader gang drain lifecycle images lost elastic}
dir=$(mktemp -d)
ctl_pids=()
cleanup() {
  for p in "${ctl_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  bash "$src/scripts/test-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL $*" >&2
  echo "--- controller log (end)" >&2
  tail -n 30 "$dir"/controller*.log >&2 || true
  echo "--- pods" >&2
  kubectl get pods -A -o wide >&2 || true
  # What each pod left still runs or why it ended: its containers' states and its log's end.
  local ns pod node
  while read -r ns pod node; do
    echo "--- $ns/$pod: $(kubectl get pod "$pod" -n "$ns" -o jsonpath='{.status.containerStatuses[*].state}' 2>&1)" >&2
    kubectl logs "$pod" -n "$ns" --tail 15 >&2 2>&1 || true
    echo "--- $node's kubelet on $pod" >&2
    grep -h "$pod" "$dir/cluster/nodes/$node/logs/kubelet.log" 2>/dev/null | tail -n 15 >&2 || true
  done < <(kubectl get pods -A -l tessera.dev/job -o wide --no-headers 2>/dev/null | awk '{print $1, $2, $8}')
  exit 1
}

bash "$src/scripts/images.sh" build --binaries "$bin"
t0=$(date +%s)
bash "$src/scripts/test-cluster.sh" start "$dir/cluster" --nodes 4 --gpus 2 --zones 2 --bin-dir "$bin"
echo "test cluster of 4 real nodes up in $(($(date +%s) - t0)) s"
# The worker (uid 65532) reaches its hostPath volumes through this directory.
chmod 755 "$dir"
export KUBECONFIG=$dir/cluster/kubeconfig
head -c 48 /dev/urandom | base64 >"$dir/token.key"
key=(--token-key-file "$dir/token.key")

# Start-up errors a user can act on: no token key, no CRD, no permission, no API server.
out=$("$bin/tessera-controller" --kubeconfig "$KUBECONFIG" --rendezvous-listen 127.0.0.1:0 2>&1) && fail "started without a token key"
[[ $out == *"--token-key-file: required"* ]] || fail "no-key message: $out"
head -c 16 /dev/urandom | base64 >"$dir/short.key"
out=$("$bin/tessera-controller" --token-key-file "$dir/short.key" 2>&1) && fail "started with a short token key"
[[ $out == *"--token-key-file: $dir/short.key: 24 bytes; a key needs at least 32"* ]] || fail "short-key message: $out"
out=$("$bin/tessera-controller" --kubeconfig "$KUBECONFIG" "${key[@]}" --rendezvous-listen 127.0.0.1:0 2>&1) && fail "started without the CRD"
[[ $out == *"TrainingJob CRD (trainingjobs.tessera.dev) is not installed"*"kubectl apply -f crds/"* ]] || fail "no-CRD message: $out"
kubectl apply -f "$src/crds/" >/dev/null
kubectl create serviceaccount nobody >/dev/null
bash "$src/scripts/test-cluster.sh" account-kubeconfig "$dir/cluster" default nobody >"$dir/nobody.kubeconfig" ||
  fail "no kubeconfig for service account nobody"
server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
out=$("$bin/tessera-controller" --kubeconfig "$dir/nobody.kubeconfig" "${key[@]}" --rendezvous-listen 127.0.0.1:0 2>&1) && fail "started without permissions"
[[ $out == *"no permission to get trainingjobs, list trainingjobs, watch trainingjobs, delete trainingjobs, update trainingjobs/status"*"create pods"* ]] ||
  fail "no-permission message: $out"
sed "s#$server#https://127.0.0.1:1#" "$KUBECONFIG" >"$dir/unreachable.kubeconfig"
timeout 3 "$bin/tessera-controller" --kubeconfig "$dir/unreachable.kubeconfig" "${key[@]}" --rendezvous-listen 127.0.0.1:0 >"$dir/unreachable.log" 2>&1 || true
grep -q "cannot reach the API server https://127.0.0.1:1.*retrying in" "$dir/unreachable.log" ||
  fail "unreachable message: $(cat "$dir/unreachable.log")"
echo "PASS start-up errors"

kubectl wait --for condition=established --timeout=60s crd/trainingjobs.tessera.dev >/dev/null
# The rendezvous on this machine's address on the nodes' bridge, where the pods reach it.
rendezvous_host=$(cat "$dir/cluster/apiserver.addr")
rendezvous_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("'$rendezvous_host'", 0)); print(s.getsockname()[1])')

# start_controller NAME [FLAGS...]: a controller whose rendezvous port survives its restarts.
start_controller() {
  local name=$1
  shift
  setsid "$bin/tessera-controller" --kubeconfig "$KUBECONFIG" "${key[@]}" --rendezvous-listen "$rendezvous_host:$rendezvous_port" \
    --status-interval 1 "$@" >>"$dir/controller-$name.log" 2>&1 &
  ctl_pids+=($!)
  echo $! >"$dir/controller-$name.pid"
  disown
}
stop_controller() { kill -9 "$(cat "$dir/controller-$1.pid")" 2>/dev/null || true; }

# A job's field; empty while the API server does not answer (under `set -e` a failed read in an
# assignment would end the test with no message): the waits poll again, the checks fail with one.
field() { kubectl get tj "$2" -n "$1" -o jsonpath="{$3}" 2>/dev/null || true; }
# A namespace's events, read whole before they are searched: grep -q on kubectl's pipe can exit
# before kubectl has written everything, and the SIGPIPE fails the check under pipefail.
events() { kubectl get events -n "$1" --no-headers 2>/dev/null; }

# wait_for NS JOB JSONPATH VALUE SECONDS
wait_for() {
  local ns=$1 job=$2 path=$3 want=$4 limit=$5 got=""
  for _ in $(seq 1 $((limit * 2))); do
    got=$(field "$ns" "$job" "$path")
    [ "$got" = "$want" ] && return 0
    [ "$want" != Failed ] && [ "$path" != .status.reason ] && [ "$(field "$ns" "$job" .status.phase)" = Failed ] &&
      fail "$ns/$job failed: $(field "$ns" "$job" .status.message)"
    sleep 0.5
  done
  fail "$ns/$job: $path is '$got', not '$want', after $limit s"
}
# wait_step NS JOB STEP SECONDS: until the job's status reports at least STEP.
wait_step() {
  for _ in $(seq 1 $(($4 * 2))); do
    [ "$(field "$1" "$2" .status.step)" -ge "$3" ] 2>/dev/null && return 0
    sleep 0.5
  done
  fail "$1/$2 did not reach step $3 in $4 s (status: $(field "$1" "$2" .status))"
}

# job NS [SED...]: the example, in namespace NS, with its paths in this test's directory and edits.
job() {
  local ns=$1
  shift
  kubectl create namespace "$ns" >/dev/null
  # The test cluster's GPUs are device IDs with no GPU behind them: the workers train on the CPU.
  sed -e "s#/var/tmp/tessera/cosmoflow-k8s#$dir/$ns#g" -e "s#namespace: .*##" -e '/^  image: /a\  device: cpu' "$@" \
    "$src/examples/cosmoflow-k8s.yaml" |
    kubectl apply -n "$ns" -f - >/dev/null
}

pods_of() { kubectl get pods -n "$1" -l tessera.dev/job --no-headers 2>/dev/null | wc -l; }
# pods_become NS COUNT SECONDS: whether NS holds COUNT pods of a job within SECONDS. Deleted pods go
# once the kubelet has removed their sandboxes, which kubelet 1.20 sometimes leaves to its container
# garbage collection, run once a minute.
pods_become() {
  for _ in $(seq 1 $(($3 * 2))); do [ "$(pods_of "$1")" = "$2" ] && return 0; sleep 0.5; done
  return 1
}

# A node to spare beside the example's four: a fifth one, added unless there is one.
spare_node() {
  [ "$(kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ')" -ge 5 ] && return 0
  bash "$src/scripts/test-cluster.sh" add-node "$dir/cluster" >/dev/null || fail "a fifth node did not join"
}

# moved NS STOPPED_AT_REGEX: waits for the job's first preemption and the new gang's first step; sets
# node (the node the gang left, as the status names it), reason, failed_at, resumed_at and took (s
# from $t0_fault to the new gang's first reported step).
moved() {
  wait_for "$1" cosmoflow-k8s .status.preemptions 1 120
  for _ in $(seq 1 240); do
    resumed_at=$(field "$1" cosmoflow-k8s '.status.restartHistory[0].resumedAtStep')
    [ "$resumed_at" -ge 0 ] 2>/dev/null && break
    sleep 0.5
  done
  [ "$resumed_at" -ge 0 ] 2>/dev/null || fail "the new gang did not start in 120 s: $(field "$1" cosmoflow-k8s .status)"
  took=$(python3 -c "import time; print(round(time.time() - $t0_fault, 1))")
  # When the controller decided (the restart's time, to the second).
  decided=$(python3 -c "import calendar, sys, time; print(round(calendar.timegm(time.strptime(sys.argv[1], '%Y-%m-%dT%H:%M:%SZ')) - $t0_fault))" \
    "$(field "$1" cosmoflow-k8s '.status.restartHistory[0].time')")
  reason=$(field "$1" cosmoflow-k8s '.status.restartHistory[0].reason')
  failed_at=$(field "$1" cosmoflow-k8s '.status.restartHistory[0].failedAtStep')
  [ "$(field "$1" cosmoflow-k8s '.status.restartHistory[0].preempted')" = true ] || fail "not recorded as a preemption: $reason"
}

# after_move NS NODE: the job succeeds without a failure counted, its new gang away from NODE.
after_move() {
  wait_for "$1" cosmoflow-k8s .status.phase Succeeded 240
  [ "$(field "$1" cosmoflow-k8s .status.restarts)" = 0 ] || fail "counted against backoffLimit: $(field "$1" cosmoflow-k8s .status.restartHistory)"
  [ "$(field "$1" cosmoflow-k8s .status.preemptions)" = 1 ] || fail "expected 1 preemption: $(field "$1" cosmoflow-k8s .status.restartHistory)"
  [[ " $(field "$1" cosmoflow-k8s '.status.placement[*].node') " != *" $2 "* ]] || fail "the new gang is on $2 again"
  grep -q "Preempted" <<<"$(events "$1")" || fail "no Preempted event: $(events "$1")"
}

start_controller main

for s in $scenarios; do
  t0=$(date +%s)
  case $s in
    example)
      # The example as shipped: Succeeded, progress visible in `kubectl get tj`, one pod per replica.
      # Meanwhile other clients label the job many times a second: the controller's status writes
      # carry the resourceVersion it read, so some meet 409 Conflict and are decided again on a
      # fresh read, and the status stays true.
      job example
      server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
      token=$(kubectl config view --raw -o jsonpath='{.users[0].user.token}')
      url=$server/apis/tessera.dev/v1alpha1/namespaces/example/trainingjobs/cosmoflow-k8s
      for w in 1 2 3 4; do
        (for i in $(seq 1 3000); do
          curl -sk -o /dev/null -X PATCH -H "Authorization: Bearer $token" -H "Content-Type: application/merge-patch+json" \
            --data "{\"metadata\":{\"labels\":{\"writer$w\":\"n$i\"}}}" "$url" || true
          [ -f "$dir/conflict.stop" ] && break
        done) &
      done
      before=$(cat "$dir"/controller-*.log | grep -c "example/cosmoflow-k8s: the write met a newer version" || true)
      seen=""
      for _ in $(seq 1 240); do
        line=$(kubectl get tj -n example --no-headers 2>/dev/null || true)
        [[ $line == *Running*sparse* || $line == *Running*dense* ]] && seen="$seen|$line"
        [[ $line == *Succeeded* || $line == *Failed* ]] && break
        sleep 0.5
      done
      wait_for example cosmoflow-k8s .status.phase Succeeded 10
      touch "$dir/conflict.stop"
      wait
      conflicts=$(cat "$dir"/controller-*.log | grep -c "example/cosmoflow-k8s: the write met a newer version" || true)
      echo "status writes retried after 409: $((conflicts - before))"
      ((conflicts > before)) || fail "no write met a conflict: the test did not exercise the retry"
      [ -n "$seen" ] || fail "kubectl get tj never showed the job Running with its training phase"
      echo "$seen" | tr '|' '\n' | tail -3
      [ "$(field example cosmoflow-k8s .status.trainingPhase)" = dense ] || fail "the job did not end dense"
      [ "$(field example cosmoflow-k8s .status.epoch)" = 3 ] || fail "epoch is not 3"
      [ "$(field example cosmoflow-k8s .status.switchStep)" -gt 0 ] || fail "no switch step"
      [ "$(pods_of example)" = 4 ] || fail "expected exactly 4 pods (one per replica): $(kubectl get pods -n example)"
      [ "$(field example cosmoflow-k8s .status.restarts)" = 0 ] || fail "restarts"
      [ "$(field example cosmoflow-k8s .status.step)" = 192 ] || fail "step is not 192 (3 epochs x 64)"
      # The job learned: its validation MSE at least 20% below predicting the mean (0.57x measured).
      python3 -c "import sys; v=float(sys.argv[1]); b=float(sys.argv[2]); print('validation MSE %.4f vs predict-the-mean %.4f: %.3fx' % (v, b, v / b)); sys.exit(0 if 0 < v <= 0.8 * b else 1)" \
        "$(field example cosmoflow-k8s .status.validation.loss)" "$(field example cosmoflow-k8s .status.validation.baselineLoss)" ||
        fail "the job did not learn: its validation MSE is not 20% below predicting the mean"
      # The final status keeps the run's overall throughput (rank 0's summary), not a last heartbeat's 0.
      python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)" "$(field example cosmoflow-k8s .status.samplesPerSecond)" ||
        fail "the finished job shows no samples/s: $(field example cosmoflow-k8s .status.samplesPerSecond)"
      grep -q PhaseSwitch <<<"$(events example)" || fail "no PhaseSwitch event"
      # Each rank of a pod says which of the pod's two GPUs (from the device plugin) it took.
      log=$(kubectl logs -n example cosmoflow-k8s-0-0 -c worker)
      gpus=$(sed -n "s/.*slot 0: GPU [0-9]* of this pod's GPUs \([0-9],[0-9]\).*/\1/p" <<<"$log")
      [[ $gpus =~ ^[01],[01]$ ]] && grep -q "slot 0: GPU ${gpus%,*} of" <<<"$log" && grep -q "slot 1: GPU ${gpus#*,} of" <<<"$log" ||
        fail "the ranks of cosmoflow-k8s-0-0 do not report the pod's GPUs: $(grep GPU <<<"$log")"
      ;;
    kill)
      # kill -9 of a random worker at a random step, once per seed (KILL_SEEDS, default 1 2 3), all
      # in one run of the example. The gang restarts in place: its pods stay (none is created) and
      # start their processes again from the newest checkpoint; for the second kill
      # spec.runPolicy.restartInPlace is turned off, and the gang's pods are replaced, as a comparison
      # of the recovery times. At most one checkpoint interval (10 steps) is retrained each time, and
      # the final validation loss is within 5% of the uninterrupted run's (scenario example).
      seeds=${KILL_SEEDS:-1 2 3}
      job kill -e "s/backoffLimit: 3/backoffLimit: $(($(wc -w <<<"$seeds") + 1))/"
      k=0
      from=0  # where the current gang started
      in_place_times="" replaced_times=""
      for seed in $seeds; do
        in_place=true
        ((k == 1)) && in_place=false
        kubectl patch tj cosmoflow-k8s -n kill --type merge -p "{\"spec\":{\"runPolicy\":{\"restartInPlace\":$in_place}}}" >/dev/null
        # The seed picks the worker (replica, slot) and the step: 5 to 24 steps past the gang's start,
        # as the status shows it (which trails the workers by up to a second).
        read -r replica slot step < <(python3 -c "import random; r = random.Random($seed); print(r.randrange(4), r.randrange(2), r.randrange(5, 25))")
        wait_step kill cosmoflow-k8s $((from + step)) 120
        # The current gang's pods (an earlier gang's ended pods may still be going).
        gang_pods() { kubectl get pods -n kill -l "tessera.dev/attempt=$(field kill cosmoflow-k8s .status.attempt)" -o name | sort | tr '\n' ' '; }
        pods_before=$(gang_pods)
        victim=$(pgrep -f -- "--replica $replica .*--slot $slot" | head -1 || true)
        [ -n "$victim" ] || fail "seed $seed: no worker process of replica $replica slot $slot (status: $(field kill cosmoflow-k8s .status))"
        t_kill=$(date +%s.%N)
        kill -9 "$victim"
        k=$((k + 1))
        wait_for kill cosmoflow-k8s .status.restarts "$k" 60
        for _ in $(seq 1 480); do
          from=$(field kill cosmoflow-k8s ".status.restartHistory[$((k - 1))].resumedAtStep")
          [ "$from" -ge 0 ] 2>/dev/null && break
          sleep 0.25
        done
        [ "$from" -ge 0 ] 2>/dev/null || fail "seed $seed: the gang did not resume in 120 s"
        took=$(python3 -c "import time; print(round(time.time() - $t_kill, 1))")
        recorded=$(field kill cosmoflow-k8s ".status.restartHistory[$((k - 1))].inPlace")
        if $in_place; then
          in_place_times+=" $took"
          [ "$recorded" = true ] || fail "seed $seed: not restarted in place: $(field kill cosmoflow-k8s ".status.restartHistory[$((k - 1))]")"
          [ "$(gang_pods)" = "$pods_before" ] || fail "seed $seed: pods changed in a restart in place: $pods_before -> $(gang_pods)"
        else
          replaced_times+=" $took"
          [ "$recorded" != true ] || fail "seed $seed: restarted in place with restartInPlace false"
        fi
        echo "seed $seed: killed replica $replica slot $slot at step $(field kill cosmoflow-k8s ".status.restartHistory[$((k - 1))].failedAtStep"), resumed at $from $(
          $in_place && echo "in place" || echo "in new pods") ${took} s after the kill"
      done
      echo "recovery, kill -9 to the first step after it: in place${in_place_times} s; new pods${replaced_times} s"
      wait_for kill cosmoflow-k8s .status.phase Succeeded 240
      [ "$(field kill cosmoflow-k8s .status.restarts)" = "$k" ] || fail "expected $k restarts: $(field kill cosmoflow-k8s .status.restartHistory)"
      for ((i = 0; i < k; i++)); do
        failed_at=$(field kill cosmoflow-k8s ".status.restartHistory[$i].failedAtStep")
        resumed_at=$(field kill cosmoflow-k8s ".status.restartHistory[$i].resumedAtStep")
        echo "restart $((i + 1)): failed at step $failed_at, resumed at $resumed_at"
        ((resumed_at > 0 && failed_at - resumed_at <= 10)) || fail "restart $((i + 1)) retrained more than one checkpoint interval: $failed_at -> $resumed_at"
        [[ "$(field kill cosmoflow-k8s ".status.restartHistory[$i].reason")" == *"exit code 137"* ]] ||
          fail "restart $((i + 1)) does not name the killed worker: $(field kill cosmoflow-k8s ".status.restartHistory[$i].reason")"
      done
      # The earlier gangs' pods go (the new gangs did not wait for the kubelets to remove them).
      pods_become kill 4 90 || fail "old pods left behind: $(kubectl get pods -n kill)"
      grep -q GangRestart <<<"$(events kill)" || fail "no GangRestart event"
      killed_loss=$(field kill cosmoflow-k8s .status.validation.loss)
      if [ -n "$(field example cosmoflow-k8s .status.validation.loss 2>/dev/null)" ]; then
        python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print('validation MSE after %d kills %.4f, uninterrupted %.4f (%+.2f%%)' % ($k, a, b, 100 * (a / b - 1))); sys.exit(0 if abs(a / b - 1) <= 0.05 else 1)" \
          "$killed_loss" "$(field example cosmoflow-k8s .status.validation.loss)" || fail "the final validation loss is not within 5% of the uninterrupted run's"
      fi
      ;;
    restarts)
      # The API server restarted mid-run, then the controller killed and started again: the job
      # succeeds with no gang restart and no duplicate pod.
      job restarts -e 's/epochs: 3/epochs: 5/'
      wait_step restarts cosmoflow-k8s 20 120
      bash "$src/scripts/test-cluster.sh" restart-apiserver "$dir/cluster"
      wait_step restarts cosmoflow-k8s 40 120
      stop_controller main
      sleep 3
      start_controller main
      wait_for restarts cosmoflow-k8s .status.phase Succeeded 240
      [ "$(pods_of restarts)" = 4 ] || fail "duplicate pods: $(kubectl get pods -n restarts)"
      [ "$(field restarts cosmoflow-k8s .status.restarts)" = 0 ] || fail "a restart of the API server or the controller restarted the gang"
      ;;
    sigterm)
      # SIGTERM exits 0 within 15 s in every state: waiting for an unreachable API server, syncing its
      # caches, running a job, running a job while the API server is gone, and leading a job with
      # --leader-elect. The job's gang outlives the controllers and succeeds without a restart.
      stop_controller main
      # term PID WHAT: SIGTERM to a controller started by this shell; it must exit 0 within 15 s.
      term() {
        kill -TERM "$1"
        for _ in $(seq 1 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$1" 2>/dev/null && { kill -9 "$1"; fail "the controller still ran 15 s after SIGTERM $2"; }
        local rc=0
        wait "$1" || rc=$?
        [ "$rc" = 0 ] || fail "the controller exited with status $rc on SIGTERM $2"
        echo "  SIGTERM $2: exit status 0"
      }
      child_controller() {  # a controller as this shell's child, its pid in $ctl
        "$bin/tessera-controller" "${key[@]}" --rendezvous-listen "$rendezvous_host:$rendezvous_port" --status-interval 1 "$@" \
          >>"$dir/controller-sigterm.log" 2>&1 &
        ctl=$!
        ctl_pids+=($ctl)
      }
      child_controller --kubeconfig "$dir/unreachable.kubeconfig"
      sleep 1.5
      term $ctl "while it waits for an unreachable API server"
      child_controller --kubeconfig "$KUBECONFIG"
      sleep 0.3
      term $ctl "as it starts"
      job sigterm -e 's/epochs: 3/epochs: 6/'
      child_controller --kubeconfig "$KUBECONFIG"
      wait_step sigterm cosmoflow-k8s 10 120
      term $ctl "with a running job"
      child_controller --kubeconfig "$KUBECONFIG"
      sleep 2
      bash "$src/scripts/test-cluster.sh" stop-apiserver "$dir/cluster"
      sleep 2
      term $ctl "with a running job and the API server gone"
      bash "$src/scripts/test-cluster.sh" start-apiserver "$dir/cluster"
      for _ in $(seq 1 60); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
      child_controller --kubeconfig "$KUBECONFIG" --leader-elect --lease-namespace sigterm
      for _ in $(seq 1 60); do grep -q " leads " "$dir/controller-sigterm.log" && break; sleep 0.5; done
      grep -q " leads " "$dir/controller-sigterm.log" || fail "the leader-elect controller did not lead"
      sleep 1
      term $ctl "while leading"
      start_controller main
      wait_for sigterm cosmoflow-k8s .status.phase Succeeded 240
      [ "$(field sigterm cosmoflow-k8s .status.restarts)" = 0 ] || fail "the gang restarted: $(field sigterm cosmoflow-k8s .status.restartHistory)"
      ;;
    leader)
      # Two controllers with --leader-elect: the leader killed, the other takes over within the
      # lease duration (15 s) plus one retry period, and runs a job.
      stop_controller main
      start_controller a --leader-elect --lease-namespace default
      for _ in $(seq 1 40); do grep -q " leads " "$dir/controller-a.log" && break; sleep 0.5; done
      grep -q " leads " "$dir/controller-a.log" || fail "controller a did not lead"
      start_controller b --leader-elect --lease-namespace default
      sleep 3
      grep -q " leads " "$dir/controller-b.log" && fail "two leaders"
      killed=$(date +%s.%N)
      stop_controller a
      for _ in $(seq 1 60); do grep -q " leads " "$dir/controller-b.log" && break; sleep 0.5; done
      took=$(python3 -c "import time; print(round(time.time() - $killed, 1))")
      grep -q " leads " "$dir/controller-b.log" || fail "controller b did not take over"
      echo "takeover after ${took} s"
      python3 -c "import sys; sys.exit(0 if $took <= 18 else 1)" || fail "takeover took ${took} s (lease 15 s)"
      job leader -e 's/epochs: 3/epochs: 2/'
      wait_for leader cosmoflow-k8s .status.phase Succeeded 180
      stop_controller b
      start_controller main
      ;;
    gang)
      # A gang that does not fit stays Pending and says what is missing; a node more lets it start.
      job gang -e 's/replicas: 4/replicas: 5/' -e 's/batchSize: 8/batchSize: 10/' -e 's/epochs: 3/epochs: 1/' \
        -e 's/strategy: hybrid/strategy: dense/'
      wait_for gang cosmoflow-k8s '.status.conditions[?(@.type=="Placed")].reason' Unschedulable 30
      msg=$(field gang cosmoflow-k8s '.status.conditions[?(@.type=="Placed")].message')
      echo "Placed=False: $msg"
      [[ $msg == *"needs 10 GPUs (5 pods of 2)"*"8 free on 4 nodes"* ]] || fail "unclear message: $msg"
      [ "$(field gang cosmoflow-k8s .status.phase)" = Pending ] || fail "not Pending"
      [ "$(pods_of gang)" = 0 ] || fail "pods created for a gang that does not fit"
      bash "$src/scripts/test-cluster.sh" add-node "$dir/cluster" || fail "node-4 did not join"
      wait_for gang cosmoflow-k8s .status.phase Succeeded 180
      ;;
    drain)
      # kubectl drain of a gang's node mid-run: its pods get SIGTERM, the ranks of the whole gang agree
      # on a step, checkpoint it and stop; the gang is placed on the other nodes and resumes at that
      # step (0 steps retrained), the job succeeds and backoffLimit is untouched.
      spare_node
      job drain
      wait_step drain cosmoflow-k8s 25 120
      node=$(kubectl get pods -n drain -l tessera.dev/job -o jsonpath='{.items[0].spec.nodeName}')
      t0_fault=$(date +%s.%N)
      out=$(kubectl drain "$node" --ignore-daemonsets --delete-emptydir-data --timeout=120s 2>&1) || fail "kubectl drain $node: $out"
      moved drain
      stopped_at=$(sed -n 's/.*stopped at step \([0-9]*\) on SIGTERM.*/\1/p' <<<"$reason")
      echo "drained $node: the gang stopped at step $stopped_at (last reported $failed_at), moved ${decided} s after the drain began and resumed at $resumed_at ${took} s after it"
      [[ $reason == *"node $node was cordoned"* ]] || fail "the preemption does not name the drained node: $reason"
      [ -n "$stopped_at" ] || fail "the preemption does not say where the gang stopped: $reason"
      [ "$resumed_at" = "$stopped_at" ] || fail "stopped at step $stopped_at but resumed at $resumed_at"
      [ "$(field drain cosmoflow-k8s '.status.restartHistory[0].node')" = "$node" ] || fail "the restart history does not name $node"
      after_move drain "$node"
      kubectl uncordon "$node" >/dev/null
      ;;
    lost)
      # A gang's node lost mid-run (its kubelet, containerd and containers killed, its network gone):
      # the pod there stays Running in the API until the node monitor calls the node NotReady (20 s on
      # this cluster); the gang is then placed on the other nodes from its newest checkpoint (at most
      # one interval, 10 steps, retrained), and the job succeeds.
      spare_node
      job lost
      wait_step lost cosmoflow-k8s 25 120
      node=$(kubectl get pods -n lost -l tessera.dev/job -o jsonpath='{.items[0].spec.nodeName}')
      t0_fault=$(date +%s.%N)
      bash "$src/scripts/test-cluster.sh" lose-node "$dir/cluster" "${node#node-}"
      moved lost
      echo "lost $node at step $failed_at: the gang moved ${decided} s later and resumed at $resumed_at ${took} s after the loss"
      [[ $reason == *"node $node is not ready"* ]] || fail "the preemption does not name the lost node: $reason"
      ((failed_at - resumed_at <= 10)) || fail "more than one checkpoint interval retrained: $failed_at -> $resumed_at"
      after_move lost "$node"
      ;;
    elastic)
      # spec.elastic: a 4-replica job (minReplicas 3, dense) loses a node with no node to spare. It
      # goes on with 3 pods from its newest checkpoint, keeping its global batch (rank 0 of the 3
      # trains two micro-batches of the job's four), and grows back to 4 when a node is added. Its
      # final validation loss is within 1% of the same job's uninterrupted run's.
      ready_nodes() { kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ' || true; }
      while [ "$(ready_nodes)" -lt 4 ]; do
        bash "$src/scripts/test-cluster.sh" add-node "$dir/cluster" >/dev/null || fail "a node did not join"
      done
      [ "$(ready_nodes)" = 4 ] || fail "expected exactly 4 ready nodes: $(kubectl get nodes)"
      # 12 epochs: the smaller gang still has steps to train once a node has joined (30-40 s here).
      # The learning rate decays to 0: with a floor, a change in the order of summation moved the
      # end of this small model's run by up to 1.4% (see docs/reliability.md).
      dense=(-e 's/^  communication: .*/  communication: {strategy: dense}/' -e 's/epochs: 3/epochs: 12/'
        -e 's/minLearningRate: [0-9.]*/minLearningRate: 0/')
      job elastic-ref "${dense[@]}"
      wait_for elastic-ref cosmoflow-k8s .status.phase Succeeded 240
      job elastic "${dense[@]}" -e '/^  runPolicy:/i\  elastic: {minReplicas: 3}'
      wait_step elastic cosmoflow-k8s 25 120
      node=$(kubectl get pods -n elastic -l tessera.dev/job -o jsonpath='{.items[0].spec.nodeName}')
      t0_fault=$(date +%s.%N)
      bash "$src/scripts/test-cluster.sh" lose-node "$dir/cluster" "${node#node-}"
      wait_for elastic cosmoflow-k8s .status.replicas 3 120
      moved elastic
      echo "lost $node at step $failed_at: the gang went on with 3 pods, resumed at $resumed_at ${took} s after the loss"
      # Rank 0 says how it trains, in its pod's log (whichever pod of the gang holds it).
      attempt=$(field elastic cosmoflow-k8s .status.attempt)
      log=$(for r in 0 1 2; do kubectl logs -n elastic "cosmoflow-k8s-$attempt-$r" -c worker 2>/dev/null || true; done)
      grep -q "global batch 8 (4 micro-batches of 2 over 3 replicas" <<<"$log" ||
        fail "the 3-pod gang does not keep the global batch: $(grep 'global batch' <<<"$log")"
      t0_grow=$(date +%s.%N)
      bash "$src/scripts/test-cluster.sh" add-node "$dir/cluster" >/dev/null || fail "a node did not join"
      wait_for elastic cosmoflow-k8s .status.replicas 4 120
      wait_for elastic cosmoflow-k8s .status.phase Succeeded 240
      echo "grew back to 4 pods $(python3 -c "import time; print(round(time.time() - $t0_grow, 1))") s after a node was added (or less: the job then ran to its end)"
      grep -q ScaledDown <<<"$(events elastic)" && grep -q ScaledUp <<<"$(events elastic)" || fail "no ScaledDown and ScaledUp events: $(events elastic)"
      [ "$(field elastic cosmoflow-k8s .status.restarts)" = 0 ] || fail "counted against backoffLimit: $(field elastic cosmoflow-k8s .status.restartHistory)"
      [ "$(field elastic cosmoflow-k8s .status.step)" = 768 ] || fail "step is not 768 (12 epochs x 64)"
      python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print('validation MSE elastic %.4f, uninterrupted %.4f (%+.2f%%)' % (a, b, 100 * (a / b - 1))); sys.exit(0 if abs(a / b - 1) <= 0.01 else 1)" \
        "$(field elastic cosmoflow-k8s .status.validation.loss)" "$(field elastic-ref cosmoflow-k8s .status.validation.loss)" ||
        fail "the elastic run's validation loss is not within 1% of the uninterrupted run's"
      ;;
    lifecycle)
      # Suspend and resume; the deadline; TTL; deletion leaves no child behind.
      job suspend -e 's/epochs: 3/epochs: 6/'
      wait_step suspend cosmoflow-k8s 15 120
      step_suspended=$(field suspend cosmoflow-k8s .status.step)
      kubectl patch tj cosmoflow-k8s -n suspend --type merge -p '{"spec":{"runPolicy":{"suspend":true}}}' >/dev/null
      wait_for suspend cosmoflow-k8s .status.phase Suspended 30
      # The workers stop within a second or two (they agree on a step and checkpoint it); the pod
      # objects take longer (pods_become).
      t0_suspend=$(date +%s)
      pods_become suspend 0 90 || fail "pods left running while suspended"
      echo "  suspended: the pods gone $(($(date +%s) - t0_suspend)) s after the phase"
      [ -n "$(ls -A "$dir/suspend/checkpoints")" ] || fail "the checkpoints were not kept"
      # The gang checkpointed the step it stopped at, not only its last periodic one (every 10 steps).
      newest=$(ls "$dir/suspend/checkpoints" | sed -n 's/^ckpt-0*\([0-9][0-9]*\)-rank0\.bin$/\1/p' | sort -n | tail -n 1)
      [ "${newest:-0}" -ge "$step_suspended" ] ||
        fail "the newest checkpoint is of step ${newest:-none}, before step $step_suspended, where the job was suspended"
      echo "  suspended at step $step_suspended (as reported); the gang stopped and checkpointed step $newest"
      kubectl patch tj cosmoflow-k8s -n suspend --type merge -p '{"spec":{"runPolicy":{"suspend":false}}}' >/dev/null
      wait_for suspend cosmoflow-k8s .status.phase Succeeded 240
      [ "$(field suspend cosmoflow-k8s '.status.conditions[?(@.type=="Suspended")].reason')" = Resumed ] || fail "no Resumed condition"
      grep -q Resumed <<<"$(events suspend)" || fail "no Resumed event: $(events suspend)"

      job deadline -e 's/epochs: 3/epochs: 20/' -e 's/backoffLimit: 3/backoffLimit: 3, activeDeadlineSeconds: 8/'
      wait_for deadline cosmoflow-k8s .status.reason DeadlineExceeded 60
      running_pods() { kubectl get pods -n deadline --no-headers 2>/dev/null | grep -c Running || true; }
      for _ in $(seq 1 60); do [ "$(running_pods)" = 0 ] && break; sleep 0.5; done
      [ "$(running_pods)" = 0 ] || fail "pods still running after the deadline: $(kubectl get pods -n deadline)"

      job ttl -e 's/epochs: 3/epochs: 2/' -e 's/ttlSecondsAfterFinished: 3600/ttlSecondsAfterFinished: 2/'
      wait_for ttl cosmoflow-k8s .status.phase Succeeded 120
      for _ in $(seq 1 40); do kubectl get tj cosmoflow-k8s -n ttl >/dev/null 2>&1 || break; sleep 0.5; done
      kubectl get tj cosmoflow-k8s -n ttl >/dev/null 2>&1 && fail "the TTL did not delete the job"

      kubectl delete tj cosmoflow-k8s -n deadline >/dev/null
      # A real kubelet stops a deleted pod's containers first (up to its grace period, 30 s), and
      # kubelet 1.20 may leave the removal of its sandbox to its garbage collection, once a minute.
      for ns in deadline ttl; do
        for _ in $(seq 1 240); do
          [ -z "$(kubectl get pods,secrets,configmaps,services -n $ns -l tessera.dev/job --no-headers 2>/dev/null)" ] && break
          sleep 0.5
        done
        left=$(kubectl get pods,secrets,configmaps,services -n $ns -l tessera.dev/job --no-headers 2>/dev/null)
        [ -z "$left" ] || fail "children left behind in $ns: $left"
      done
      ;;
    images)
      # An image that cannot be pulled: a PodsStarted=False condition and an Event naming the pod, the
      # image and the kubelet's reason, no restart, then StartFailed after startTimeoutSeconds. An image
      # without the worker's command (the pause image): StartFailed at once, no restart spent.
      job pull -e 's#image: .*#image: tessera/worker:0.0.0-missing#' -e 's/backoffLimit: 3/backoffLimit: 3, startTimeoutSeconds: 25/'
      wait_for pull cosmoflow-k8s '.status.conditions[?(@.type=="PodsStarted")].status' False 60
      msg=$(field pull cosmoflow-k8s '.status.conditions[?(@.type=="PodsStarted")].message')
      echo "PodsStarted=False: ${msg:0:160}..."
      [[ $msg == *"pod cosmoflow-k8s-0-"*"image tessera/worker:0.0.0-missing"*"ErrImagePull"* || $msg == *"ImagePullBackOff"* ]] ||
        fail "the condition does not name the pod, the image and the reason: $msg"
      grep -q PodNotStarting <<<"$(events pull)" || fail "no PodNotStarting event: $(events pull)"
      wait_for pull cosmoflow-k8s .status.reason StartFailed 60
      [ "$(field pull cosmoflow-k8s .status.restarts)" = 0 ] || fail "a gang restart was spent on an image that cannot be pulled"
      job nocommand -e 's#image: .*#image: localhost/tessera/pause:v1.20.2#'
      wait_for nocommand cosmoflow-k8s .status.reason StartFailed 60
      [ "$(field nocommand cosmoflow-k8s .status.restarts)" = 0 ] || fail "restarts spent on a container that cannot start"
      echo "StartFailed: $(field nocommand cosmoflow-k8s .status.message | cut -c1-200)"
      ;;
    startup) ;;  # only the start-up errors above
    *) fail "unknown scenario $s" ;;
  esac
  echo "PASS $s ($(($(date +%s) - t0)) s)"
done
