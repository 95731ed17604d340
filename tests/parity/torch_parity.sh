#!/usr/bin/env bash
# Writes PyTorch's reference (bench/torch/torch_<model>.py --dump) into a temporary directory and runs the
# parity test on it; the directory goes however the test ends.
# usage: torch_parity.sh TEST_BINARY SOURCE_DIR PYTHON
set -euo pipefail
test_bin=$1 src=$2 python=$3
dir=$(mktemp -d /tmp/tessera-parity.XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$python" "$src/bench/torch/torch_transformer.py" --dump "$dir/transformer"
"$python" "$src/bench/torch/torch_resnet50.py" --dump "$dir/resnet50"
TESSERA_TORCH_REFERENCE="$dir" "$test_bin"
