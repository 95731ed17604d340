#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with Debian's clang in build-fuzz and runs each on its seed
# corpus (fuzz/corpus/TARGET, kept as committed; what a run finds new stays in a temporary directory).
#   scripts/fuzz.sh ci                      the run of `make test`: each target a fixed number of inputs
#                                           from a fixed seed (about 15 s each here); the inputs it makes
#                                           still differ from run to run, so a finding may come in one
#   scripts/fuzz.sh SECONDS [TARGET...]     each target for SECONDS, from a random seed
# A crash, an uncaught exception, a leak, an input taking over 10 s, a process over 2 GiB or a C++
# allocation over 1 GiB fails the run; the input is kept under build-fuzz/findings/ and can be
# replayed with build-fuzz/bin/TARGET FILE. A C library's malloc over 1 GiB returns NULL instead,
# as under a container's memory limit, and must be handled: HDF5 allocates what a corrupt file's
# metadata claims (2 GB for a 7 KB file) before it finds the file too short to fill it.
# docs/reliability.md lists the targets and longer runs.
set -euo pipefail
mode=${1:-ci}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=("$@")
((${#targets[@]})) || targets=(manifest_fuzz checkpoint_fuzz dataset_fuzz rendezvous_fuzz)
command -v clang++ >/dev/null || { echo "fuzz: clang++ is missing (scripts/deps.sh installs clang)" >&2; exit 1; }
mkdir -p "$build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
    -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_NATIVE_ARCH=OFF >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$build/build.log" 2>&1 || { tail -40 "$build/build.log" >&2; exit 1; }
mkdir -p "$build/findings"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Inputs per target in the ci run: about 15 s each on a 2-core machine.
declare -A ci_runs=([manifest_fuzz]=12000 [checkpoint_fuzz]=400000 [dataset_fuzz]=20000 [rendezvous_fuzz]=8000)
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  if [ "$mode" = ci ]; then budget=(-runs="${ci_runs[$t]}" -seed=1); else budget=(-max_total_time="$mode"); fi
  # The targets' scratch files go under $work (removed at exit), also when a target dies on a finding.
  mkdir -p "$work/tmp"
  if ! TMPDIR="$work/tmp" ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=1024 LSAN_OPTIONS="suppressions=$root/fuzz/lsan.supp:print_suppressions=0" "$build/bin/$t" "$work/$t" "$root/fuzz/corpus/$t" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -artifact_prefix="$build/findings/$t-" -print_final_stats=1 >"$build/$t.log" 2>&1; then
    tail -60 "$build/$t.log" >&2
    echo "fuzz: $t failed; the input is under $build/findings/" >&2
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/$t.log")
  cov=$(grep -o 'cov: [0-9]*' "$build/$t.log" | tail -1)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$build/$t.log" | grep -o '[0-9]* second' || true)
  echo "fuzz: $t: $execs inputs in ${secs:-?}s, $cov, no failure"
done
