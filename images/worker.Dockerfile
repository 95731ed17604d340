# The Tessera worker image: tessera-worker on Debian bookworm, as a non-root user (65532).
#   VARIANT=cuda (the default): built with CUDA, cuDNN and NCCL from NVIDIA's pinned image; without
#     a GPU the same binary trains on the CPU.
#   VARIANT=cpu: no CUDA at all, for CPU node pools and for machines that cannot fetch NVIDIA's image.
#   BINARIES=source (the default): the binaries are built inside the image build, portable (no
#     -march=native). BINARIES=prebuilt: they are taken from images/bin/ of the build context, put
#     there by scripts/images.sh from a build on the same Debian release (how `make images` and the
#     tests build it; for the cpu variant, a build without CUDA, whose binaries load no CUDA library).
# From the repository root:
#   docker build -f images/worker.Dockerfile -t tessera/worker:0.1.0 .
#   make images    (buildah, no Docker daemon: scripts/images.sh)
ARG CUDA=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04
ARG DEBIAN=debian:bookworm-20241111-slim
ARG VARIANT=cuda
ARG BINARIES=source

# The toolkit as the build looks for it (/opt/toolkit/cuda becomes /usr/local/cuda, with cuDNN and
# NCCL beside it), and the libraries the worker loads at run time (/opt/toolkit/lib).
FROM ${CUDA} AS toolkit-cuda
RUN mkdir -p /opt/toolkit/lib && cp -a /usr/local/cuda/. /opt/toolkit/cuda/ \
    && cp /usr/include/cudnn*.h /usr/include/nccl*.h /opt/toolkit/cuda/include/ \
    && cp -a /usr/lib/x86_64-linux-gnu/libcudnn* /usr/lib/x86_64-linux-gnu/libnccl* /opt/toolkit/cuda/lib64/ \
    && cp -a /usr/local/cuda/lib64/libcudart.so* /usr/lib/x86_64-linux-gnu/libcudnn* /usr/lib/x86_64-linux-gnu/libnccl.so* /opt/toolkit/lib/

FROM ${DEBIAN} AS toolkit-cpu
RUN mkdir -p /opt/toolkit/cuda /opt/toolkit/lib

FROM toolkit-${VARIANT} AS toolkit

FROM ${DEBIAN} AS binaries-source
RUN apt-get update -q && apt-get install -y -q --no-install-recommends make sudo ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=toolkit /opt/toolkit/cuda /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
COPY . .
RUN apt-get update -q && make build BUILD_DIR=/build CMAKE_ARGS="-DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_NATIVE_ARCH=OFF" \
    && mkdir -p /out && cp /build/bin/tessera-worker /build/bin/tessera /out/ && strip /out/*

FROM scratch AS binaries-prebuilt
COPY images/bin/tessera-worker images/bin/tessera /out/

FROM binaries-${BINARIES} AS binaries

FROM ${DEBIAN}
# The shared libraries tessera-worker links (oneDNN, Gloo, HDF5, libjpeg-turbo, gRPC, protobuf, yaml-cpp,
# prometheus-cpp, libcurl, OpenMP), and with VARIANT=cuda the CUDA runtime, cuDNN and NCCL.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      ca-certificates libdnnl2 ocl-icd-libopencl1 libgloo0 libhdf5-103-1 libjpeg62-turbo libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 \
      libprometheus-cpp-core1.0 libcurl4 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=toolkit /opt/toolkit/lib /usr/local/cuda/lib64
ENV LD_LIBRARY_PATH=/usr/local/cuda/lib64
COPY --from=binaries /out/ /usr/local/bin/
USER 65532:65532
# Rank S of a pod serves its metrics on 9400 + S.
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/tessera-worker"]
