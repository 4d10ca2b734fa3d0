# Sluice images: one build stage, one small runtime image per service.
#   docker build --target center -t sluice-center .   (and worker, etl, sluicectl)
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
    cargo build --release --locked -p sluice-center -p sluice-worker -p sluice-etl -p sluicectl \
 && mkdir -p /out \
 && cp target/release/sluice-center target/release/sluice-worker target/release/sluice-etl \
       target/release/sluicectl /out/

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 sluice \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sluice
ENV SLUICE_CONFIG_FILE=/etc/sluice/config.toml

FROM runtime AS center
COPY --from=build /out/sluice-center /usr/local/bin/sluice-center
USER 10001:10001
EXPOSE 7070 9464
ENTRYPOINT ["/usr/local/bin/sluice-center"]

FROM runtime AS worker
COPY --from=build /out/sluice-worker /usr/local/bin/sluice-worker
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/sluice-worker"]

FROM runtime AS etl
COPY --from=build /out/sluice-etl /usr/local/bin/sluice-etl
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/sluice-etl"]

FROM runtime AS sluicectl
COPY --from=build /out/sluicectl /usr/local/bin/sluicectl
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/sluicectl"]
