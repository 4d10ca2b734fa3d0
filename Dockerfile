# Sluice images: one small runtime image per service, from binaries built in a build stage
# (Docker with a registry) or beforehand (`make images`, with podman and no registry).
#   docker build --target center -t sluice-center .   (and worker, etl, sluicectl)
#   make images    (deploy/images.sh: the same targets from target/ship, on a Debian base
#                   made by debootstrap; BINARIES=prebuilt, RUNTIME=localhost/sluice-base)
# Docker needs BuildKit (the build stage's cache mounts; it skips the unused stage).
ARG RUNTIME=debian:bookworm-slim
ARG BINARIES=build

FROM rust:1.95-slim-bookworm AS build
# cmake: rdkafka's bundled librdkafka (cmake-build; its sources include curl/curl.h even
# without curl); protoc: the gRPC API; libssl-dev: for rdkafka's `ssl` feature (SASL_SSL).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake pkg-config \
      protobuf-compiler libcurl4-openssl-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --profile ship --locked -p sluice-center -p sluice-worker -p sluice-etl -p sluicectl \
 && mkdir -p /out \
 && cp target/ship/sluice-center target/ship/sluice-worker target/ship/sluice-etl \
       target/ship/sluicectl /out/

# Binaries built beforehand: deploy/images.sh stages them in target/images/<tag>/bin.
FROM scratch AS prebuilt
ARG PREBUILT=target/images/bin
COPY ${PREBUILT}/ /out/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME} AS runtime
# A base that has the CA certificates and OpenSSL already (deploy/images.sh's) needs no
# package index.
RUN if [ ! -s /etc/ssl/certs/ca-certificates.crt ] || ! ldconfig -p | grep -q 'libssl\.so\.3 '; then \
      apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates libssl3 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && groupadd --gid 10001 sluice \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sluice
ENV SLUICE_CONFIG_FILE=/etc/sluice/config.toml

# gRPC API 7070, IK dictionaries 7071, console 7072, search API 7073; telemetry 9464.
FROM runtime AS center
COPY --from=binaries /out/sluice-center /usr/local/bin/sluice-center
USER 10001:10001
EXPOSE 7070 7071 7072 7073 9464
ENTRYPOINT ["/usr/local/bin/sluice-center"]

FROM runtime AS worker
COPY --from=binaries /out/sluice-worker /usr/local/bin/sluice-worker
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/sluice-worker"]

FROM runtime AS etl
COPY --from=binaries /out/sluice-etl /usr/local/bin/sluice-etl
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/sluice-etl"]

FROM runtime AS sluicectl
COPY --from=binaries /out/sluicectl /usr/local/bin/sluicectl
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/sluicectl"]
