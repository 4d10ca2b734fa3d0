#!/usr/bin/env bash
# Debezium's embedded engine as the bench's peer: installs it on first use, then becomes
# the JVM (exec, so this script's pid is the JVM's) that runs DebeziumBench with the
# arguments given.
#
#   integration-tests/debezium/run.sh install [mysql|mariadb]   install only
#   integration-tests/debezium/run.sh --port P --user U --password W --topic-prefix T \
#       --work-dir D --events N [--connector mysql|mariadb] [--host H] [--server-id ID] \
#       [--database DBS] [--table TABLES] [--bootstrap HOST:PORT] [--timeout-s S] [--hold] \
#       [--set ENGINE_KEY=VALUE]... [--producer-set PRODUCER_KEY=VALUE]...
#
# (see src/main/java/sluice/bench/DebeziumBench.java). Progress lines go to stdout, then
# one JSON line: {"events":N,"seconds":...,"events_per_s":...,"first_event_s":...,
# "peak_rss_kib":...,"cpu_s":...,...}. Logs (WARN and up) and errors go to stderr.
#
# Installed into $SLUICE_TOOLS/debezium-<version>-<connector>: lib/ (the jars Maven resolves
# from pom.xml) and classes-<hash of the source>/ (javac), each skipped when present; a
# stamp is written last. Versions: DEBEZIUM_VERSION (MySQL) and DEBEZIUM_MARIADB_VERSION
# (Maven Central serves no MariaDB connector of the 3.6 line) in deploy/versions.sh.
#
# The JVM: the JDK's default collector (G1) with a 1 GiB maximum heap. The JDK's default
# maximum is a quarter of the machine's memory (6 GiB on 24 GiB), which makes the peak RSS a
# figure of the machine: over a million events G1 grew to 1.6 GB RSS with it and 0.9 GB
# with -Xmx1g, at the same rate, while the live heap stays near 50 MB (so 1 GiB does not
# starve it). Kafka Connect, Debezium's usual host, starts with -Xmx2g; Debezium Server
# leaves the JDK's default. DEBEZIUM_JAVA_OPTS replaces these flags (empty: the JDK's
# defaults). DEBEZIUM_LOG_LEVEL sets the loggers' level (default warn).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/integration-tests/debezium"
# shellcheck source=deploy/versions.sh
. "$ROOT/deploy/versions.sh"

log() { printf '[debezium] %s\n' "$*" >&2; }
die() { printf '[debezium] ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

install_only=0
if [[ ${1:-} == install ]]; then
  install_only=1
  connector=${2:-mysql}
else
  # The connector decides what to install; DebeziumBench reads the same option.
  connector=${DEBEZIUM_BENCH_CONNECTOR:-mysql}
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
      --connector) connector=${args[i + 1]:-} ;;
      --connector=*) connector=${args[i]#--connector=} ;;
    esac
  done
fi
case $connector in
  mysql) version=$DEBEZIUM_VERSION ;;
  mariadb) version=$DEBEZIUM_MARIADB_VERSION ;;
  *) die "connector $connector: mysql or mariadb" ;;
esac

[[ -x ${JAVA_HOME:-}/bin/java ]] || die "no JDK (JAVA_HOME or java on PATH; deploy/install.sh installs one)"
[[ -x $JAVA_HOME/bin/javac ]] || die "$JAVA_HOME has no javac: a JDK, not a JRE, is needed"
home="$SLUICE_TOOLS/debezium-$version-$connector"

# The jars: debezium-embedded and debezium-connector-<connector> with their dependencies.
install_jars() {
  [[ -f $home/stamp ]] && return
  local t0 tmp
  t0=$(now_ms)
  log "installing Debezium $version ($connector connector) into $home"
  rm -rf "$home"
  tmp=$(mktemp -d)
  cp "$HERE/pom.xml" "$tmp/pom.xml"
  (cd "$tmp" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime \
    -Ddebezium.version="$version" -Ddebezium.connector="$connector" \
    -Dslf4j.version="$SLF4J_VERSION" -DoutputDirectory="$tmp/lib") >"$tmp/mvn.log" 2>&1 \
    || { tail -n 30 "$tmp/mvn.log" >&2; rm -rf "$tmp"
         die "Maven could not resolve debezium-connector-$connector $version"; }
  mkdir -p "$home"
  mv "$tmp/lib" "$home/lib"
  rm -rf "$tmp"
  echo "$version" >"$home/stamp"
  log "Debezium $version: $(ls "$home/lib" | wc -l) jars ($(du -sh "$home/lib" | cut -f1)) in $(( ($(now_ms) - t0) / 1000 )) s"
}

# The class, compiled once per version of its source.
src="$HERE/src/main/java/sluice/bench/DebeziumBench.java"
classes="$home/classes-$(sha256sum "$src" | cut -c1-16)"
compile() {
  [[ -f $classes/sluice/bench/DebeziumBench.class ]] && return
  local tmp
  tmp=$(mktemp -d "$home/classes.XXXXXX")
  "$JAVA_HOME/bin/javac" -nowarn -encoding UTF-8 --release 17 -cp "$home/lib/*" -d "$tmp" "$src" \
    || { rm -rf "$tmp"; die "javac failed on $src"; }
  rm -rf "$classes"
  mv "$tmp" "$classes"
  # Classes of earlier versions of the source.
  find "$home" -maxdepth 1 -name 'classes-*' ! -path "$classes" -exec rm -rf {} +
  log "compiled DebeziumBench into $classes"
}

install_jars
compile
((install_only)) && exit 0

# shellcheck disable=SC2086 # DEBEZIUM_JAVA_OPTS is a list of flags.
exec "$JAVA_HOME/bin/java" ${DEBEZIUM_JAVA_OPTS--Xmx1g} \
  -Dorg.slf4j.simpleLogger.defaultLogLevel="${DEBEZIUM_LOG_LEVEL:-warn}" \
  -Dorg.slf4j.simpleLogger.logFile=System.err -Dorg.slf4j.simpleLogger.showDateTime=true \
  -Dsluice.debezium.version="$version" \
  -cp "$classes:$home/lib/*" sluice.bench.DebeziumBench "$@"
