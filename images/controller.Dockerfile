# The Tessera controller image: tessera-controller (and the tessera CLI) on Debian bookworm, as a
# non-root user (65532).
#   BINARIES=source (the default): built inside the image build, portable (no -march=native).
#   BINARIES=prebuilt: taken from images/bin/ of the build context, put there by scripts/images.sh
#     from a build on the same Debian release (how `make images` and the tests build it).
# From the repository root:
#   docker build -f images/controller.Dockerfile -t tessera/controller:0.1.0 .
#   make images    (buildah, no Docker daemon: scripts/images.sh)
ARG DEBIAN=debian:bookworm-20241111-slim
ARG BINARIES=source

FROM ${DEBIAN} AS binaries-source
# scripts/deps.sh (run by make) installs the Debian build dependencies.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends make sudo ca-certificates && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN apt-get update -q && make build BUILD_DIR=/build CMAKE_ARGS="-DTESSERA_WITH_CUDA=OFF -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_NATIVE_ARCH=OFF" \
    && mkdir -p /out && cp /build/bin/tessera-controller /build/bin/tessera /out/ && strip /out/*

FROM scratch AS binaries-prebuilt
COPY images/bin/tessera-controller images/bin/tessera /out/

FROM binaries-${BINARIES} AS binaries

FROM ${DEBIAN}
# The shared libraries tessera-controller links (libcurl, gRPC, protobuf, yaml-cpp, prometheus-cpp).
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      ca-certificates libcurl4 libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 libprometheus-cpp-core1.0 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=binaries /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8080 7070
ENTRYPOINT ["/usr/local/bin/tessera-controller"]
