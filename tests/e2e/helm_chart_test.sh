#!/usr/bin/env bash
# The Helm chart (charts/tessera) against the real things: helm lint and template (helm from npm,
# scripts/helm.sh), the RBAC equal to what tessera-controller --print-permissions says it uses (no
# verb more, none less), and on a test cluster of real nodes (scripts/test-cluster.sh: kubelets and
# containerd running the images scripts/images.sh builds) the rendered objects accepted by the API
# server, helm install creating the CRD, Deployment and RBAC, the Deployment's two controllers
# running from the controller image with one leader, a job trained to Succeeded by workers from the
# worker image that reach the leader through the Service's DNS name, kubectl exec and logs into them,
# kubectl explain showing the CRD's field descriptions, and the CRD kept on helm uninstall. The
# cluster and the temporary directory are removed on exit, pass or fail.
#   usage: helm_chart_test.sh BIN_DIR SOURCE_DIR PYTHON
set -euo pipefail
bin=$1
src=$2
py=$3
chart=$src/charts/tessera
dir=$(mktemp -d)
cleanup() {
  bash "$src/scripts/test-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL $*" >&2
  if [ -f "$dir/cluster/kubeconfig" ]; then
    echo "--- pods" >&2
    kubectl --kubeconfig "$dir/cluster/kubeconfig" get pods -A -o wide >&2 || true
    echo "--- controller logs (end)" >&2
    kubectl --kubeconfig "$dir/cluster/kubeconfig" logs -n tessera-system -l app.kubernetes.io/component=controller --tail=20 >&2 || true
    echo "--- job status" >&2
    kubectl --kubeconfig "$dir/cluster/kubeconfig" get tj -n team-a -o jsonpath='{.items[*].status}' >&2 || true
    for p in $(kubectl --kubeconfig "$dir/cluster/kubeconfig" get pods -n team-a -o name 2>/dev/null); do
      echo "--- $p log (end)" >&2
      kubectl --kubeconfig "$dir/cluster/kubeconfig" logs -n team-a "$p" --tail=10 >&2 || true
    done
  fi
  exit 1
}
helm=$(bash "$src/scripts/helm.sh")
ns=tessera-system
# The node pool of the chart's job defaults: zone-0 of the test cluster's nodes.
values=(--set "jobDefaults.nodeSelector.topology\.kubernetes\.io/zone=zone-0" --set controller.statusIntervalSeconds=1)

"$helm" lint "$chart" >/dev/null || fail "helm lint"
"$helm" lint "$chart" --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set controller.watchNamespace=team-a >/dev/null || fail "helm lint with the monitors and a watched namespace"
"$helm" template tessera "$chart" -n "$ns" --include-crds "${values[@]}" >"$dir/rendered.yaml" || fail "helm template"
"$helm" template tessera "$chart" -n "$ns" --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set controller.watchNamespace=team-a >"$dir/rendered-namespaced.yaml" || fail "helm template with the monitors"
echo "PASS helm lint and template"
# The API server here (1.20) has no PodSecurity admission: the restricted level's rules are checked here.
"$py" "$src/testing/pod_security.py" "$dir/rendered.yaml" --expect restricted >"$dir/pss.log" ||
  fail "the controller's pod breaks the restricted Pod Security Standard: $(cat "$dir/pss.log")"
echo "PASS the controller's pod meets the restricted Pod Security Standard"

# The RBAC is exactly what the controller uses, in both modes (all namespaces; one namespace).
"$bin/tessera-controller" --print-permissions --leader-elect >"$dir/permissions.json"
"$py" - "$dir/permissions.json" "$dir/rendered.yaml" "$dir/rendered-namespaced.yaml" "$ns" <<'PY' || fail "RBAC"
import json, sys, yaml
need = json.load(open(sys.argv[1]))
release_ns = sys.argv[4]
def grants(docs, kinds):
    out = set()
    for d in docs:
        if d and d["kind"] in kinds:
            for r in d.get("rules", []):
                for g in r["apiGroups"]:
                    for res in r["resources"]:
                        for v in r["verbs"]:
                            out.add((d["kind"], d["metadata"].get("namespace", ""), g, res, v))
    return out
for path, watched in ((sys.argv[2], ""), (sys.argv[3], "team-a")):
    docs = list(yaml.safe_load_all(open(path)))
    got = grants(docs, {"ClusterRole", "Role"})
    want = set()
    for rule in need:
        for g in rule["apiGroups"]:
            for res in rule["resources"]:
                for v in rule["verbs"]:
                    if res == "leases":
                        want.add(("Role", release_ns, g, res, v))
                    elif rule["scope"] == "cluster" or not watched:
                        want.add(("ClusterRole", "", g, res, v))
                    else:
                        want.add(("Role", watched, g, res, v))
    extra, missing = sorted(got - want), sorted(want - got)
    if extra or missing:
        sys.exit(f"{path}: the chart grants {extra} that the controller never uses, and lacks {missing}")
    kinds = sorted({d["kind"] for d in docs if d})
    print(f"  RBAC of {'all namespaces' if not watched else 'namespace ' + watched}: {len(got)} grants, exactly the controller's; objects {kinds}")
PY
echo "PASS RBAC is least privilege"

# The images the chart names, built from this build's binaries, and a cluster of real nodes
# (kubelets and containerd) that runs them.
bash "$src/scripts/images.sh" build --binaries "$bin" || fail "the images did not build"
t0=$SECONDS
bash "$src/scripts/test-cluster.sh" start "$dir/cluster" --nodes 2 --gpus 2 --zones 2 --bin-dir "$bin" || fail "the test cluster did not start"
echo "  test cluster of 2 real nodes up in $((SECONDS - t0)) s"
export KUBECONFIG=$dir/cluster/kubeconfig
kubectl create namespace "$ns" >/dev/null
kubectl apply --dry-run=server -f "$dir/rendered.yaml" >"$dir/dry-run.log" 2>&1 || fail "server dry run: $(cat "$dir/dry-run.log")"
echo "PASS the rendered objects are accepted by the API server ($(grep -c . "$dir/dry-run.log") objects)"

"$helm" install tessera "$chart" -n "$ns" "${values[@]}" >"$dir/install.log" || fail "helm install: $(cat "$dir/install.log")"
kubectl wait --for condition=established --timeout=60s crd/trainingjobs.tessera.dev >/dev/null
for o in deployment/tessera serviceaccount/tessera service/tessera configmap/tessera-job-defaults configmap/tessera-dashboard \
         secret/tessera-token-key role/tessera-leader-election rolebinding/tessera-leader-election; do
  kubectl get -n "$ns" "$o" >/dev/null || fail "helm install did not create $o"
done
kubectl get clusterrole/tessera clusterrolebinding/tessera >/dev/null || fail "helm install did not create the ClusterRole"
[ "$(kubectl get deployment tessera -n $ns -o jsonpath='{.spec.replicas}')" = 2 ] || fail "the controller does not default to 2 replicas"
kubectl get deployment tessera -n $ns -o json | "$py" -c '
import json, sys
d = json.load(sys.stdin)["spec"]["template"]["spec"]
c, p = d["containers"][0]["securityContext"], d["securityContext"]
assert p["runAsNonRoot"] and p["seccompProfile"]["type"] == "RuntimeDefault", p
assert c["readOnlyRootFilesystem"] and c["capabilities"]["drop"] == ["ALL"] and not c["allowPrivilegeEscalation"], c
' || fail "the Deployment's securityContext is not restrictive"
echo "PASS helm install created the CRD, the Deployment (2 replicas, restrictive securityContext) and the RBAC"

# kubectl explain documents the API from the CRD's descriptions.
explain=$(kubectl explain trainingjob.spec.training.optimizer 2>&1)
[[ $explain == *"Peak learning rate"* && $explain == *"sgd (with momentum), adam, adamw"* ]] || fail "kubectl explain: $explain"
echo "PASS kubectl explain trainingjob.spec.training.optimizer shows the field descriptions"

# The controller's account may create and update Secrets, never read one: a job's token Secret is
# read only by the kubelets that run the job's pods.
for verb in get list watch; do
  [ "$(kubectl auth can-i "$verb" secrets -n team-a --as="system:serviceaccount:$ns:tessera" 2>/dev/null)" = no ] ||
    fail "the controller's service account may $verb secrets"
done
[ "$(kubectl auth can-i create secrets -n team-a --as="system:serviceaccount:$ns:tessera" 2>/dev/null)" = yes ] ||
  fail "the controller's service account may not create secrets"

# The Deployment's two controllers run from the controller image, on the nodes, with the chart's
# service account: one leads and is ready (the Service's only endpoint), the other stands by.
controllers() { kubectl get pods -n $ns -l app.kubernetes.io/component=controller -o jsonpath="$1" 2>/dev/null; }
t0=$SECONDS
for _ in $(seq 1 240); do
  [ "$(controllers '{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c Running)" = 2 ] &&
    [ "$(controllers '{range .items[*]}{.status.containerStatuses[0].ready}{"\n"}{end}' | grep -c true)" = 1 ] && break
  sleep 0.5
done
[ "$(controllers '{range .items[*]}{.status.containerStatuses[0].ready}{"\n"}{end}' | grep -c true)" = 1 ] ||
  fail "not one ready controller of two after 120 s: $(kubectl get pods -n $ns -o wide; kubectl describe pods -n $ns | tail -20)"
leader=$(controllers '{range .items[?(@.status.containerStatuses[0].ready==true)]}{.metadata.name}{end}')
[ "$(controllers '{.items[0].spec.containers[0].image}')" = "tessera/controller:0.1.0" ] ||
  fail "the controller runs $(controllers '{.items[0].spec.containers[0].image}'), not the built image"
kubectl get endpoints tessera -n $ns -o jsonpath='{.subsets[0].addresses[*].targetRef.name}' | grep -qx "$leader" ||
  fail "the Service's endpoints are not the leader $leader alone: $(kubectl get endpoints tessera -n $ns -o yaml)"
echo "PASS the chart's 2 controllers run from the built image on the nodes; $leader leads and alone backs the Service ($((SECONDS - t0)) s)"

kubectl create namespace team-a >/dev/null
mkdir -p "$dir/checkpoints"
# chart_job NAME SAMPLES EPOCHS [SPEC LINE...]: a job of 2 pods x 1 GPU in team-a, on the chart's
# defaults, with an emptyDir SSD tier.
chart_job() {
  local name=$1 samples=$2 epochs=$3
  shift 3
  { cat <<EOF2
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata:
  name: $name
spec:
  replicas: 2
  ranksPerReplica: 1
  resources: {gpu: 1}
  device: cpu  # the test cluster's GPUs are device IDs with no GPU behind them
  model: {name: cosmoflow, inputSize: 16, hidden: [16]}
  dataset: {format: synthetic, samples: $samples, validationSamples: 16}
  training: {epochs: $epochs, batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}
  cache: {localSSD: {path: /var/cache/tessera, sizeLimit: 64Mi, volume: emptyDir}}
EOF2
    printf '  %s\n' "$@"; } | kubectl apply -n team-a -f - >/dev/null
}
# job_done NAME SECONDS: the job's phase once it is Succeeded or Failed, or after SECONDS.
job_done() {
  local phase=
  for _ in $(seq 1 $(($2 * 2))); do
    phase=$(kubectl get tj "$1" -n team-a -o jsonpath='{.status.phase}' 2>/dev/null)
    [ "$phase" = Succeeded ] || [ "$phase" = Failed ] && break
    sleep 0.5
  done
  echo "$phase"
}
chart_job chart-job 96 3 "communication: {strategy: hybrid, sparse: topk, dense: dense, switchAtEpoch: 1, density: 0.05}" \
  "checkpoint: {path: /checkpoints, everySteps: 4, volume: {hostPath: {path: $dir/checkpoints/chart-job}}}"
# While it runs: a worker container runs as the image's user on a read-only root file system, and
# kubectl exec reaches it.
pod=chart-job-0-0
for _ in $(seq 1 240); do
  [ "$(kubectl get pod $pod -n team-a -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ] && break
  sleep 0.5
done
ids=$(kubectl exec -n team-a $pod -c worker -- id 2>&1) || fail "kubectl exec into $pod: $ids"
[[ $ids == "uid=65532 gid=65532 groups=65532"* ]] || fail "the worker runs as '$ids', not uid and gid 65532"
out=$(kubectl exec -n team-a $pod -c worker -- sh -c 'touch /usr/x 2>&1; touch /var/cache/tessera/x && touch /checkpoints/x && echo writable' 2>&1)
[[ $out == *"Read-only file system"*writable* ]] || fail "the root file system is not read-only, or a volume is not writable: $out"
echo "PASS kubectl exec into $pod: $ids; root file system read-only, the cache (emptyDir) and checkpoint (hostPath) volumes writable"

phase=$(job_done chart-job 180)
[ "$phase" = Succeeded ] || fail "the job is '$phase' after 180 s: $(kubectl get tj chart-job -n team-a -o jsonpath='{.status.message}')"
kubectl logs -n $ns -l app.kubernetes.io/component=controller --tail=-1 >"$dir/controller.log" 2>&1
# 403 as a status, not inside a port or a number
grep -qiE 'forbidden|(^|[^0-9])403([^0-9]|$)' "$dir/controller.log" && fail "the controller was refused something with the chart's RBAC"
nodes=$(kubectl get pods -n team-a -l tessera.dev/job=chart-job -o jsonpath='{.items[*].spec.nodeName}')
[ "$nodes" = "node-0 node-0" ] || fail "the pods ran on '$nodes', not on the chart's default node pool (zone-0: node-0)"
rendezvous=$(kubectl get pod $pod -n team-a -o jsonpath='{.spec.containers[0].args}')
[[ $rendezvous == *'grpc://tessera.tessera-system.svc:7070'* ]] || fail "the workers were not sent to the Service's DNS name: $rendezvous"
# Each pod's log: its progress lines, and the GPU the device plugin gave it (node-0 has GPUs 0 and 1).
gpus=""
for p in chart-job-0-0 chart-job-0-1; do
  log=$(kubectl logs -n team-a $p -c worker)
  # Rank 0 (in one of the two pods) logs the progress lines.
  [ $p = chart-job-0-1 ] || grep -q "epoch 3/3 step 72/72" <<<"$log$(kubectl logs -n team-a chart-job-0-1 -c worker)" ||
    fail "kubectl logs shows no progress: $(tail -5 <<<"$log")"
  g=$(sed -n 's/.*slot 0: GPU \([0-9]*\) of this pod.s GPUs \([0-9,]*\).*/\1=\2/p' <<<"$log")
  [[ $g =~ ^[01]=[01]$ ]] && [ "${g%%=*}" = "${g#*=}" ] || fail "$p does not report the one GPU it was given: '$g'"
  gpus="$gpus ${g%%=*}"
done
[ "$(tr ' ' '\n' <<<"$gpus" | sort -u | grep -c .)" = 2 ] || fail "the two pods on node-0 were given the same GPU:$gpus"
[ "$(stat -c %u "$dir/checkpoints/chart-job")" = 65532 ] || fail "the checkpoint hostPath is not the worker's: $(ls -ld "$dir/checkpoints/chart-job")"
ls "$dir/checkpoints/chart-job" | grep -q . || fail "no checkpoint was written to the hostPath volume"
leader_ip=$(kubectl get pod "$leader" -n $ns -o jsonpath='{.status.podIP}')
metrics=$(curl -sf "http://$leader_ip:8080/metrics")  # whole: grep -q on a pipe would cut curl short
grep -q '^tessera_jobs_succeeded_total{namespace="team-a"} 1' <<<"$metrics" ||
  fail "the controller's /metrics does not count the job: $(grep jobs_ <<<"$metrics")"
echo "PASS the chart's controller ran a job to Succeeded on real nodes: workers from the built image reached it at tessera.tessera-system.svc:7070; kubectl logs shows their progress; GPUs$gpus reported"

# The workers' pods and the Pod Security Standards: a hostPath volume (here the checkpoints) needs
# the privileged level, and the init container that makes it the worker's is its only other break;
# with an emptyDir SSD tier and no hostPath the pod meets the restricted level.
kubectl get pods -n team-a -l tessera.dev/job=chart-job -o json >"$dir/chart-pods.json"
"$py" "$src/testing/pod_security.py" "$dir/chart-pods.json" >"$dir/pss.log" || true
grep -q '^  baseline hostPathVolumes: checkpoints' "$dir/pss.log" || fail "the hostPath volume is not reported: $(cat "$dir/pss.log")"
other=$(grep '^  ' "$dir/pss.log" | grep -v 'hostPathVolumes: checkpoints\|volume-owner' || true)
[ -z "$other" ] || fail "the worker pod breaks rules beyond its hostPath volume: $other"
chart_job restricted-job 16 1
phase=$(job_done restricted-job 120)
[ "$phase" = Succeeded ] || fail "restricted-job is '$phase': $(kubectl get tj restricted-job -n team-a -o jsonpath='{.status.message}')"
kubectl get pods -n team-a -l tessera.dev/job=restricted-job -o json >"$dir/restricted-pods.json"
"$py" "$src/testing/pod_security.py" "$dir/restricted-pods.json" --expect restricted >"$dir/pss.log" ||
  fail "a worker pod without hostPath breaks the restricted Pod Security Standard: $(cat "$dir/pss.log")"
echo "PASS worker pods: restricted with an emptyDir SSD tier; a hostPath volume and its owner init container are the only breaks"

"$helm" uninstall tessera -n "$ns" >/dev/null || fail "helm uninstall"
kubectl get crd trainingjobs.tessera.dev >/dev/null 2>&1 || fail "helm uninstall removed the CRD"
kubectl get tj chart-job -n team-a >/dev/null 2>&1 || fail "helm uninstall removed a TrainingJob"
echo "PASS helm uninstall keeps the CRD and the jobs"
