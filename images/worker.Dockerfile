# The Tessera worker image: tessera-worker with the CUDA paths (CUDA, cuDNN and NCCL from NVIDIA's
# pinned image), on Debian bookworm as the project is built and tested, as a non-root user. Without
# a GPU the same binary trains on the CPU.
# Built from the repository root with the project's own Makefile:
#   docker build -f images/worker.Dockerfile -t tessera/worker:0.1.0 .
ARG CUDA=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04
ARG DEBIAN=debian:bookworm-20241111-slim

FROM ${CUDA} AS cuda

FROM ${DEBIAN} AS build
RUN apt-get update -q && apt-get install -y -q --no-install-recommends make sudo ca-certificates && rm -rf /var/lib/apt/lists/*
# The toolkit where the build looks for it (/usr/local/cuda), with cuDNN and NCCL beside it.
COPY --from=cuda /usr/local/cuda /usr/local/cuda
COPY --from=cuda /usr/include/cudnn*.h /usr/include/nccl*.h /usr/local/cuda/include/
COPY --from=cuda /usr/lib/x86_64-linux-gnu/libcudnn* /usr/lib/x86_64-linux-gnu/libnccl* /usr/local/cuda/lib64/
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
COPY . .
RUN apt-get update -q && make build BUILD_DIR=/build CMAKE_ARGS="-DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_NATIVE_ARCH=OFF" \
    && strip /build/bin/tessera-worker /build/bin/tessera

FROM ${DEBIAN}
# The shared libraries tessera-worker links (oneDNN, Gloo, HDF5, gRPC, protobuf, yaml-cpp,
# prometheus-cpp, OpenMP) and the CUDA runtime, cuDNN and NCCL.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      ca-certificates libdnnl2 ocl-icd-libopencl1 libgloo0 libhdf5-103-1 libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 \
      libprometheus-cpp-core1.0 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=cuda /usr/local/cuda/lib64/libcudart.so* /usr/local/cuda/lib64/
COPY --from=cuda /usr/lib/x86_64-linux-gnu/libcudnn* /usr/lib/x86_64-linux-gnu/libnccl.so* /usr/local/cuda/lib64/
ENV LD_LIBRARY_PATH=/usr/local/cuda/lib64
COPY --from=build /build/bin/tessera-worker /build/bin/tessera /usr/local/bin/
USER 65532:65532
# Rank S of a pod serves its metrics on 9400 + S.
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/tessera-worker"]
