#!/usr/bin/env bash
# The CRD on a real Kubernetes API server (scripts/test-cluster.sh): the server takes it as a
# structural schema; it accepts or rejects the corpus' manifests as the schema and the C++
# validation do (schema_agreement.py with a kubeconfig); and the status `tessera run` writes for
# a real local job is a valid TrainingJob status: stored whole through the status subresource and
# shown by `kubectl get tj`.
# usage: crd_apiserver_test.sh TESSERA_BIN SOURCE_DIR PYTHON
set -euo pipefail
tessera=$1
src=$2
python=${3:-python3}
dir=$(mktemp -d)
trap 'bash "$src/scripts/test-cluster.sh" stop "$dir/server" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

bash "$src/scripts/test-cluster.sh" start "$dir/server"
export KUBECONFIG=$dir/server/kubeconfig
kubectl apply -f "$src/crds/trainingjobs.tessera.dev.yaml"
kubectl create namespace ml  # the corpus' namespace
kubectl wait --for condition=established --timeout=60s crd/trainingjobs.tessera.dev
conditions=$(kubectl get crd trainingjobs.tessera.dev -o jsonpath='{.status.conditions[*].type}')
if [[ $conditions == *NonStructuralSchema* ]]; then
  echo "FAIL the API server finds the CRD's schema not structural:" >&2
  kubectl get crd trainingjobs.tessera.dev -o jsonpath='{.status.conditions}' >&2
  exit 1
fi
# Custom resources are served once the CRD is established; give discovery a moment.
for _ in $(seq 1 40); do kubectl get tj >/dev/null 2>&1 && break; sleep 0.25; done

"$python" "$src/tests/api/schema_agreement.py" "$tessera" "$src/crds/trainingjobs.tessera.dev.yaml" \
  "$src/tests/api/manifests.yaml" "$src/examples" "$KUBECONFIG"

# A real local job's status, patched into the same job on the server.
cat >"$dir/job.yaml" <<JOB
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata: {name: status-check}
spec:
  replicas: 2
  model: {name: cosmoflow, inputSize: 16, baseChannels: 4, hidden: [16]}
  dataset: {synthetic: cosmo, samples: 16, validationSamples: 4}
  training: {epochs: 2, batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}
  communication: {strategy: hybrid, sparse: topk, dense: dense, density: 0.1, switchAtEpoch: 1}
  local: {workDir: $dir/state}
JOB
"$tessera" run "$dir/job.yaml" >"$dir/run.log" 2>&1 || { cat "$dir/run.log" >&2; exit 1; }
kubectl apply -f "$dir/job.yaml"
"$python" -c 'import json, sys; print(json.dumps({"status": json.load(open(sys.argv[1]))["status"]}))' \
  "$dir/state/status.json" >"$dir/patch.json"
# Through the status subresource (raw, as a controller does; `kubectl patch --subresource` needs kubectl 1.24+).
server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
token=$(kubectl config view --raw -o jsonpath='{.users[0].user.token}')
curl -sSfk -X PATCH -H "Authorization: Bearer $token" -H "Content-Type: application/merge-patch+json" \
  --data-binary @"$dir/patch.json" "$server/apis/tessera.dev/v1alpha1/namespaces/default/trainingjobs/status-check/status" \
  -o "$dir/patched.json"
kubectl get tj status-check -o json >"$dir/stored.json"
"$python" - "$dir/patch.json" "$dir/stored.json" <<'PY'
import json, sys
sent = json.load(open(sys.argv[1]))["status"]
stored = json.load(open(sys.argv[2]))["status"]
if stored != sent:
    lost = sorted(set(sent) - set(stored))
    changed = sorted(k for k in sent if k in stored and stored[k] != sent[k])
    sys.exit("FAIL the server did not store the status as written: pruned %s, changed %s" % (lost, changed))
print("the API server stored the local job's status whole (%d fields)" % len(stored))
PY
row=$(kubectl get tj status-check --no-headers)
echo "kubectl get tj: $row"
read -r name phase training epoch samples age <<<"$row"
if [[ $phase != Succeeded || $training != dense || $epoch != 2 || ! $samples =~ ^[0-9.]+$ || -z $age ]]; then
  echo "FAIL printer columns: expected Succeeded, dense, 2, samples/s, age" >&2
  exit 1
fi
echo "PASS"
