#!/usr/bin/env bash
# Tessera's container images, built without a Docker daemon by Debian's buildah from
# images/*.Dockerfile, into a store of their own under $TESSERA_CACHE/containers (default
# ~/.cache/tessera): nothing is pulled from a registry.
#   - The Debian base the Dockerfiles name (ARG DEBIAN, debian:bookworm-...-slim) is made once by
#     mmdebstrap (--variant=minbase) from this machine's own apt sources, and tagged with that name.
#   - The pod sandbox image (pause, built by scripts/test-cluster.sh build from the Kubernetes source)
#     is tagged localhost/tessera/pause:VERSION.
#   - The image builds keep their layers (--layers): an unchanged base and package list are reused,
#     so a rebuild only copies new binaries.
#
#   scripts/images.sh build [--binaries DIR | --source] [--variant cpu|cuda]
#        builds docker.io/tessera/worker:V and docker.io/tessera/controller:V (V: the chart's
#        appVersion). --binaries DIR (the default, DIR = build/bin) takes tessera, tessera-worker and
#        tessera-controller from a build on this machine (BINARIES=prebuilt); --source builds them
#        inside the image build, portable. --variant: the worker's (default cpu: NVIDIA's CUDA image
#        cannot be fetched here).
#   scripts/images.sh archives DIR
#        writes DIR/worker.tar, DIR/controller.tar and DIR/pause.tar (docker-archive, what
#        `ctr images import` reads), reusing an archive while its image is unchanged
#   scripts/images.sh push REGISTRY
#        pushes both images to REGISTRY/tessera/worker:V and REGISTRY/tessera/controller:V
#   scripts/images.sh names      prints the three image names, one a line
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}
STORE=$CACHE/containers
KUBE_VERSION=v1.20.2
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$src/charts/tessera/Chart.yaml")
WORKER=docker.io/tessera/worker:$version
CONTROLLER=docker.io/tessera/controller:$version
PAUSE=localhost/tessera/pause:$KUBE_VERSION

die() { echo "images: $*" >&2; exit 1; }
bah() { buildah --root "$STORE/storage" --runroot "$STORE/run" --storage-driver overlay "$@"; }
have() { bah inspect --type image "$1" >/dev/null 2>&1; }
for c in buildah mmdebstrap; do command -v $c >/dev/null || die "'$c' is missing; run make deps"; done
[ "$(id -u)" = 0 ] || die "needs root (buildah's overlay store and RUN steps)"

# The base image the Dockerfiles name, made from this machine's apt sources (never pulled).
base() {
  local name suite
  name=$(sed -n 's/^ARG DEBIAN=//p' "$src/images/worker.Dockerfile")
  [ "$name" = "$(sed -n 's/^ARG DEBIAN=//p' "$src/images/controller.Dockerfile")" ] ||
    die "images/worker.Dockerfile and images/controller.Dockerfile name different Debian bases"
  have "$name" && return 0
  suite=${name#debian:}
  suite=${suite%%-*}
  local sources=() f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && sources+=("$f")
  done
  ((${#sources[@]})) || die "this machine has no apt sources to build the $suite base from"
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"; trap - RETURN' RETURN
  echo "images: building $name with mmdebstrap (minbase, $suite, this machine's apt sources)"
  mmdebstrap --quiet --variant=minbase --format=tar "$suite" "$work/base.tar" "${sources[@]}" ||
    die "mmdebstrap could not build the $suite base"
  local c
  c=$(bah from scratch)
  bah add "$c" "$work/base.tar" / >/dev/null
  bah config --cmd /bin/bash "$c"
  bah commit -q "$c" "$name" >/dev/null
  bah rm "$c" >/dev/null
}

pause() {
  local bin=$CACHE/pause-$KUBE_VERSION
  [ -x "$bin" ] || die "$bin is missing; run scripts/test-cluster.sh build"
  local sum
  sum=$(sha256sum <"$bin" | cut -d' ' -f1)
  if have "$PAUSE" && [ "$(bah inspect --type image -f '{{index .ImageAnnotations "tessera.dev/pause-sha256"}}' "$PAUSE")" = "$sum" ]; then
    return 0
  fi
  local c
  c=$(bah from scratch)
  bah copy "$c" "$bin" /pause >/dev/null
  bah config --entrypoint '["/pause"]' --annotation "tessera.dev/pause-sha256=$sum" "$c"
  bah commit -q "$c" "$PAUSE" >/dev/null
  bah rm "$c" >/dev/null
}

# Binaries built with CUDA load the CUDA runtime, cuDNN, cuBLAS and NCCL, which the cpu variant does
# not carry: for it the three programs are built once more without CUDA, in build-cpu (ccache gives
# back every object that does not depend on the CUDA option, so this takes a minute, not a build).
# (The dynamic section is read whole: `ldd | grep -q` under pipefail fails when grep stops reading early.)
links_cuda() {
  local dynamic
  dynamic=$(readelf -d "$1" 2>/dev/null) || return 1
  [[ $dynamic =~ \[lib(cudart|cudnn|cublas|nccl)[^]]*\] ]]
}
cpu_binaries() {
  local dir=$src/build-cpu
  mkdir -p "$dir"
  (
    flock 9
    export CCACHE_BASEDIR=$src
    cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DTESSERA_WITH_CUDA=OFF -DTESSERA_BUILD_TESTS=OFF \
      -DTESSERA_BUILD_BENCH=OFF >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log" >&2; exit 1; }
    cmake --build "$dir" -j"$(nproc)" --target tessera tessera-worker tessera-controller >"$dir/build.log" 2>&1 ||
      { tail -30 "$dir/build.log" >&2; exit 1; }
  ) 9>"$dir/.lock" || die "the binaries without CUDA (for the cpu variant) did not build in $dir"
  echo "$dir/bin"
}

build() {
  local binaries=$src/build/bin mode=prebuilt variant=cpu
  while (($#)); do
    case $1 in
      --binaries) binaries=${2:?--binaries needs a directory}; shift 2 ;;
      --source) mode=source; shift ;;
      --variant) variant=${2:?--variant needs cpu or cuda}; shift 2 ;;
      *) die "unknown option '$1'" ;;
    esac
  done
  [[ $variant == cpu || $variant == cuda ]] || die "--variant '$variant': cpu or cuda"
  base
  if [ "$mode" = prebuilt ] && [ "$variant" = cpu ] && links_cuda "$binaries/tessera-worker"; then
    binaries=$(cpu_binaries)
  fi
  if [ "$mode" = prebuilt ]; then
    local b
    rm -rf "$src/images/bin"
    mkdir -p "$src/images/bin"
    for b in tessera tessera-worker tessera-controller; do
      [ -x "$binaries/$b" ] || die "$binaries/$b is missing: build first (make build), or pass --binaries DIR"
      cp "$binaries/$b" "$src/images/bin/$b"
      if [ "$variant" = cpu ] && links_cuda "$src/images/bin/$b"; then
        die "$binaries/$b links CUDA libraries, which the cpu variant does not carry"
      fi
      strip "$src/images/bin/$b"
    done
  fi
  local t0=$SECONDS
  bah bud --layers --pull=never --network host -q -f "$src/images/worker.Dockerfile" \
    --build-arg BINARIES=$mode --build-arg VARIANT=$variant -t "$WORKER" "$src" >/dev/null ||
    die "the worker image did not build (images/worker.Dockerfile)"
  bah bud --layers --pull=never --network host -q -f "$src/images/controller.Dockerfile" \
    --build-arg BINARIES=$mode -t "$CONTROLLER" "$src" >/dev/null ||
    die "the controller image did not build (images/controller.Dockerfile)"
  # A multi-stage build leaves the working containers of the stages it copied from, mounted.
  bah rm --all >/dev/null
  echo "images: built $WORKER ($variant, $mode binaries) and $CONTROLLER in $((SECONDS - t0)) s"
}

archives() {
  local out=${1:?archives needs a directory} name file id
  mkdir -p "$out" "$STORE/archives"
  pause
  for pair in "worker=$WORKER" "controller=$CONTROLLER" "pause=$PAUSE"; do
    name=${pair%%=*}
    have "${pair#*=}" || die "${pair#*=} is not built; run scripts/images.sh build"
    id=$(bah inspect --type image -f '{{.FromImageID}}' "${pair#*=}")
    file=$STORE/archives/$name-$id.tar
    if [ ! -s "$file" ]; then
      rm -f "$STORE/archives/$name-"*.tar
      bah push -q "${pair#*=}" "docker-archive:$file.tmp:${pair#*=}" >/dev/null
      mv "$file.tmp" "$file"
    fi
    ln -sf "$file" "$out/$name.tar"
  done
}

push() {
  local registry=${1:?push needs a registry such as registry.example.com/team}
  for image in "$WORKER" "$CONTROLLER"; do
    have "$image" || die "$image is not built; run make images"
    bah push "$image" "docker://$registry/${image#docker.io/}"
  done
}

case "${1:-}" in
  build) shift; mkdir -p "$STORE"; exec 8>"$STORE/build.lock"; flock 8; build "$@" ;;  # one build at a time
  archives) archives "${2:-}" ;;
  push) push "${2:-}" ;;
  names) printf '%s\n' "$WORKER" "$CONTROLLER" "$PAUSE" ;;
  *) sed -n '2,28p' "$0" >&2; exit 2 ;;
esac
