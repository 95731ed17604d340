#!/usr/bin/env bash
# Draws the Grafana dashboard's panels for a real `make run` job to PNG (docs/observability.md):
# runs the job with Prometheus scraping it (tessera run --prometheus), serves that Prometheus data
# again, and renders every panel from it (scripts/dashboard.py render, matplotlib).
#   scripts/dashboard-pictures.sh [OUT_DIR]     (default docs/observability)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/observability}
work=.tessera/cosmoflow-local
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rm -rf "$work/prometheus"
start=$(date +%s)
make run RUN_ARGS="--prometheus=127.0.0.1:$(port)"
end=$(date +%s)
url=127.0.0.1:$(port)
prometheus --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/prometheus/data" \
  --web.listen-address="$url" >"$work/prometheus/replay.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://$url/-/ready" >/dev/null && break; sleep 0.3; done
/usr/bin/python3 scripts/dashboard.py render --prometheus "http://$url" --namespace default --job cosmoflow-local \
  --start "$start" --end "$end" --out "$out"
