# The Tessera controller image: tessera-controller on Debian bookworm slim, as a non-root user.
# Built from the repository root with the project's own Makefile:
#   docker build -f images/controller.Dockerfile -t tessera/controller:0.1.0 .
ARG DEBIAN=debian:bookworm-20241111-slim

FROM ${DEBIAN} AS build
# scripts/deps.sh (run by make) installs the Debian build dependencies.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends make sudo ca-certificates && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN apt-get update -q && make build BUILD_DIR=/build CMAKE_ARGS="-DTESSERA_WITH_CUDA=OFF -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_NATIVE_ARCH=OFF" \
    && strip /build/bin/tessera-controller /build/bin/tessera

FROM ${DEBIAN}
# The shared libraries tessera-controller links (libcurl, gRPC, protobuf, yaml-cpp, prometheus-cpp).
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      ca-certificates libcurl4 libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 libprometheus-cpp-core1.0 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/bin/tessera-controller /build/bin/tessera /usr/local/bin/
USER 65532:65532
EXPOSE 8080 7070
ENTRYPOINT ["/usr/local/bin/tessera-controller"]
