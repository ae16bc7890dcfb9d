# shardlm image for Kubernetes (deploy/k8s/): the CPU build of the `shardlm` binary
# on Debian 12, run as uid 10001 under tini.
#
#   docker build -t shardlm:0.1.0 .
#   docker build --build-arg SHARDLM_MARCH=x86-64-v2 -t shardlm:0.1.0 .
#
# The build stage uses the project's own scripts/install-deps.sh and
# scripts/build.sh. Not built in CI (no Docker daemon there); see
# deploy/k8s/README.md for what has and has not been run.

FROM debian:bookworm AS build
# The Release build targets -march=$SHARDLM_MARCH (CMake's SHARDLM_MARCH,
# "native" by default, which would tie the image to the build machine's
# CPU): x86-64-v3 (AVX2, FMA) runs on every x86 server CPU since 2015; use
# x86-64-v2 for older nodes.
ARG SHARDLM_MARCH=x86-64-v3
WORKDIR /src
# Dependencies first, so that a source change does not reinstall them.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN CMAKE_ARGS="-DSHARDLM_MARCH=${SHARDLM_MARCH} -DSHARDLM_CUDA=OFF" \
    BUILD_DIR=build-image bash scripts/build.sh --target shardlm && \
    strip -o /shardlm build-image/launch/shardlm

FROM debian:bookworm-slim
# Runtime libraries only: the shared objects of the -dev packages that
# scripts/install-deps.sh installs for the build (gRPC, protobuf, Abseil,
# OpenBLAS, OpenMPI, Gloo, OpenMP, OpenSSL), and tini as PID 1.
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 \
      libopenblas0-pthread libopenmpi3 libgloo0 libgomp1 libssl3 \
      tini && \
    rm -rf /var/lib/apt/lists/* && \
    groupadd --gid 10001 shardlm && \
    useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin shardlm
COPY --from=build /shardlm /opt/shardlm/bin/shardlm
# Fail the build here, not in a pod, if a library is missing.
RUN ! ldd /opt/shardlm/bin/shardlm | grep "not found" && \
    /opt/shardlm/bin/shardlm --help >/dev/null
ENV PATH=/opt/shardlm/bin:$PATH HOME=/tmp
USER 10001:10001
WORKDIR /tmp
# 50051 gRPC API, 8000 HTTP API and probes, 50052 control plane (leader);
# 8001 worker health. Gloo / NCCL use ephemeral ports between workers.
EXPOSE 50051 8000 50052 8001
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/shardlm/bin/shardlm"]
CMD ["--help"]
