#!/usr/bin/env bash
# The one-shot GPU check: the GPU tests (each cuDNN/cuBLAS layer and CUDA kernel against the CPU
# path, one CosmoFlow step GPU against CPU, MSTopK and scatter-add) and the GPU figures
# (tessera-gpu-bench: MSTopK against a memory pass, conv3d TFLOP/s, CosmoFlow samples/s at 128^3,
# 50-step loss curves GPU against CPU; and PyTorch CUDA's torch.topk and CosmoFlow in the same run)
# run on a machine with a GPU and print one JSON line per case and figure, then one line per
# criterion of the GPU path with whether it held.
#
#   scripts/gpu-check.sh bundle [--build-dir DIR]   here: build the GPU test binaries and pack them,
#                                                   with every library they need but the GPU's own
#                                                   (driver, cuDNN, cuBLAS), into DIR/gpu-check.tar.xz
#   scripts/gpu-check.sh run [--build-dir DIR]      on the GPU machine: unpack and run them there
#   scripts/gpu-check.sh --dry-run [--build-dir DIR]  bundle, then start every bundled binary here the
#                                                   way `run` does (without a GPU their cases skip)
# DIR defaults to build-gpu-check, configured here for any x86-64 CPU (no -march=native: the GPU
# machine's CPU is not this one); the unit test passes the main build, which is the same code.
#
# The GPU machine has no Debian packages: the bundle carries its own C library and dynamic loader,
# and takes cuDNN and cuBLAS from the Python wheels (nvidia-cudnn-cu13, nvidia-cublas) of the
# python3 found there, and the CUDA runtime from /usr/local/cuda. At most 64 MiB travel to that
# machine, so the bundle is compressed and its size checked here.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
[ $# -gt 0 ] && shift
build=$src/build-gpu-check
portable=1
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$(cd "$2" && pwd); portable=0; shift 2 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
tests=(nn_cuda_test topk_cuda_test)
bench=tessera-gpu-bench
archive=$build/gpu-check.tar.xz
limit_mib=48  # of the 64 MiB a call may carry, what is left after the working tree

json() { python3 -c 'import json,sys; print(json.dumps(dict(a.split("=",1) for a in sys.argv[1:])))' "$@"; }

bundle() {
  if [ "$portable" = 1 ]; then
    mkdir -p "$build"
    CCACHE_BASEDIR=$src cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTESSERA_NATIVE_ARCH=OFF >"$build/configure.log" 2>&1 ||
      { cat "$build/configure.log" >&2; exit 1; }
  fi
  grep -q "TESSERA_HAVE_CUDA 1" "$build/generated/tessera/config.h" 2>/dev/null ||
    { echo "gpu-check: $build was configured without CUDA (nvcc and cuDNN are needed to build the GPU tests)" >&2; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target "${tests[@]}" "$bench" >/dev/null
  local stage binaries=()
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/gpu-check/bin" "$stage/gpu-check/lib"
  for t in "${tests[@]}"; do binaries+=("$build/tests/$t"); done
  binaries+=("$build/bin/$bench")
  cp "${binaries[@]}" "$stage/gpu-check/bin/"
  # Every library the binaries load, but the GPU's own: the driver, cuDNN and cuBLAS come from the
  # GPU machine. The loader and C library go along, so that the binaries run whatever the machine's.
  for b in "${binaries[@]}"; do ldd "$b"; done |
    awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}' | sort -u |
    grep -Ev '/lib(cuda|cudnn[^/]*|cublas(Lt)?|nccl|nvidia-[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/gpu-check/lib/"; done
  tar -C "$stage" -cJf "$archive" gpu-check
  local mib
  mib=$(( $(stat -c %s "$archive") / 1048576 ))
  [ "$mib" -le "$limit_mib" ] || { echo "gpu-check: the bundle is $mib MiB, over the $limit_mib MiB it may take" >&2; exit 1; }
  json check=bundle "archive=$archive" "mib=$mib" "binaries=${tests[*]} $bench"
}

# The library directories of the GPU's own libraries: the wheels' nvidia/*/lib, then the toolkit's.
gpu_library_path() {
  local dirs=""
  if command -v python3 >/dev/null; then
    dirs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "nvidia", "*", "lib"))})))
PY
)
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && dirs="$dirs${dirs:+:}$d"; done
  # Where the machine says its driver is, when not in the loader's default directories.
  [ -n "${LD_LIBRARY_PATH:-}" ] && dirs="$dirs${dirs:+:}$LD_LIBRARY_PATH"
  echo "$dirs"
}

run_bundle() {
  local dry=$1 work
  [ -f "$archive" ] || { echo "gpu-check: no bundle at $archive (run 'scripts/gpu-check.sh bundle' where it builds)" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  tar -C "$work" -xJf "$archive"
  local root=$work/gpu-check loader path status=0
  loader=$(ls "$root"/lib/ld-linux-*.so.* | head -1)
  path=$root/lib:$(gpu_library_path)
  for t in "${tests[@]}"; do
    local out=$work/$t.json log=$work/$t.log rc=0
    timeout 300 "$loader" --library-path "$path" "$root/bin/$t" --gtest_output="json:$out" >"$log" 2>&1 || rc=$?
    if [ ! -f "$out" ]; then
      tail -20 "$log" >&2
      json check="$t" status=did-not-start "rc=$rc"
      status=1
      continue
    fi
    # One line per case: passed, failed (with its first failure) or skipped (with the reason).
    python3 - "$out" "$t" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for suite in report.get("testsuites", []):
    for case in suite.get("testsuite", []):
        line = {"check": sys.argv[2] + "." + suite["name"] + "." + case["name"], "time": case.get("time")}
        if case.get("failures"):
            line["status"] = "failed"
            line["failures"] = [f.get("failure", "")[:400] for f in case["failures"]][:10]
        elif case.get("result") == "SKIPPED":
            line["status"] = "skipped"
        else:
            line["status"] = "passed"
        print(json.dumps(line))
PY
    if [ "$rc" -ne 0 ]; then status=1; fi
    if [ "$dry" = 1 ] && ! grep -q "SKIPPED\|PASSED" "$log"; then status=1; fi
  done
  local figures=$work/figures.jsonl rc=0
  timeout 420 "$loader" --library-path "$path" "$root/bin/$bench" >"$figures" 2>"$work/bench.log" || rc=$?
  cat "$figures"
  if [ "$dry" = 1 ]; then
    # Without a GPU it must start, say why it measured nothing, and exit 2.
    [ "$rc" = 2 ] && grep -q '"status":"skipped"' "$figures" || { cat "$work/bench.log" >&2; status=1; }
    return $status
  fi
  [ "$rc" = 0 ] || { cat "$work/bench.log" >&2; status=1; }
  # PyTorch CUDA in the same run: torch.topk at the same size and densities, CosmoFlow at 128^3 in both layouts.
  for density in 0.001 0.01; do
    timeout 120 python3 "$src/bench/torch/torch_topk.py" --device cuda --density "$density" --repeat 10 >>"$figures" || status=1
  done
  for layout in ndhwc ncdhw; do
    timeout 300 python3 "$src/bench/torch/torch_cosmoflow.py" --device cuda --layout "$layout" --size 128 --batch 8 --iters 10 >>"$figures" || status=1
  done
  tail -4 "$figures"
  # The criteria of the GPU path, each with its figure and whether it held.
  python3 - "$figures" <<'PY' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
ok = True
def criterion(name, value, holds):
    global ok
    ok &= bool(holds)
    print(json.dumps({"criterion": name, "value": value, "holds": bool(holds)}))
mst = {r["density"]: r for r in rows if r.get("figure") == "mstopk"}
topk = {r["density"]: r for r in rows if "torch_topk_ms" in r}
if 0.001 in mst:
    criterion("mstopk at density 0.001 within 2x one device-memory pass", mst[0.001]["x_memory_pass"], mst[0.001]["x_memory_pass"] <= 2)
for d in sorted(set(mst) & set(topk)):
    speedup = topk[d]["torch_topk_ms"] / mst[d]["ms"]
    criterion(f"mstopk at density {d} at least 10x faster than torch.topk", speedup, speedup >= 10)
curves = [r for r in rows if r.get("figure") == "curves"]
if curves:
    criterion("50-step loss curves GPU and CPU within 1%", curves[0]["max_relative_difference"], curves[0]["max_relative_difference"] <= 0.01)
cf = {r.get("framework"): r for r in rows if r.get("figure") == "cosmoflow" and r.get("layout", "ndhwc") == "ndhwc"}
if "tessera" in cf and "pytorch" in cf:
    ratio = cf["tessera"]["samples_per_second"] / cf["pytorch"]["samples_per_second"]
    criterion("CosmoFlow at 128^3 at least 1.0x PyTorch CUDA samples/s", ratio, ratio >= 1.0)
sys.exit(0 if ok else 1)
PY
  return $status
}

case $mode in
  bundle) bundle ;;
  run) run_bundle 0 ;;
  --dry-run) bundle && run_bundle 1 && json check=dry-run status=passed ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
