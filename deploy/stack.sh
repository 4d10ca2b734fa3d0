#!/usr/bin/env bash
# The local stack of real services Sluice is tested against: MariaDB and Oracle MySQL
# (binlog sources), ZooKeeper (coordination), Apache Kafka (KRaft mode) and OpenSearch.
#
#   deploy/stack.sh up|down|status [SERVICE...] | clean | env | logs [-f] | versions
#
# Each service runs on a private port with its state under <repo>/.work/stack/<service>/;
# deploy/install.sh installs them. Point MARIADB_URL, MYSQL_URL, ZOOKEEPER, KAFKA_BROKERS or
# ES_URL at another endpoint and `up` leaves that service alone and only health-checks it.
# A value equal to the default counts as local, so `eval "$(deploy/stack.sh env)";
# deploy/stack.sh up` still starts everything.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK="$ROOT/.work/stack"
# shellcheck source=deploy/versions.sh
. "$ROOT/deploy/versions.sh"

DEFAULT_MARIADB_URL="mysql://sluice_admin:sluice_admin@127.0.0.1:13306"
DEFAULT_MYSQL_URL="mysql://sluice_admin:sluice_admin@127.0.0.1:13307"
DEFAULT_ZOOKEEPER="127.0.0.1:12181"
DEFAULT_KAFKA_BROKERS="127.0.0.1:19092"
DEFAULT_ES_URL="http://127.0.0.1:19200"
DEFAULT_ELASTICSEARCH_URL="http://127.0.0.1:19201"

MARIADB_PORT=13306
MYSQL_PORT=13307
ZOOKEEPER_PORT=12181
KAFKA_PORT=19092
KAFKA_CONTROLLER_PORT=19093
OPENSEARCH_PORT=19200
OPENSEARCH_TRANSPORT_PORT=19300
ELASTICSEARCH_PORT=19201
ELASTICSEARCH_TRANSPORT_PORT=19301

SERVICES=(mariadb mysql zookeeper kafka opensearch elasticsearch)

log() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

# --- per-service facts -------------------------------------------------------------

env_var() {
  case $1 in
    mariadb) echo MARIADB_URL ;; mysql) echo MYSQL_URL ;; zookeeper) echo ZOOKEEPER ;;
    kafka) echo KAFKA_BROKERS ;; opensearch) echo ES_URL ;; elasticsearch) echo ELASTICSEARCH_URL ;;
  esac
}
default_of() { local v; v="DEFAULT_$(env_var "$1")"; echo "${!v}"; }
endpoint() { local v; v=$(env_var "$1"); echo "${!v:-$(default_of "$1")}"; }
is_external() { local v; v=$(env_var "$1"); [[ -n "${!v:-}" && "${!v}" != "$(default_of "$1")" ]]; }
local_port() {
  case $1 in
    mariadb) echo $MARIADB_PORT ;; mysql) echo $MYSQL_PORT ;; zookeeper) echo $ZOOKEEPER_PORT ;;
    kafka) echo $KAFKA_PORT ;; opensearch) echo $OPENSEARCH_PORT ;;
    elasticsearch) echo $ELASTICSEARCH_PORT ;;
  esac
}
# Seconds to become healthy / to stop. A database's first start includes creating its files;
# OpenSearch's JVM takes 20 s on an idle machine and much longer beside a cargo build. A
# Kafka restarted over thousands of partitions (a developer's stack after many test runs)
# loads each partition's log before it answers: 90 s was seen to be too short.
start_deadline() {
  case $1 in
    mariadb | mysql | zookeeper) echo 90 ;;
    kafka | opensearch | elasticsearch) echo 240 ;;
    *) echo 90 ;;
  esac
}
stop_deadline() { case $1 in mariadb | mysql | opensearch | elasticsearch) echo 60 ;; *) echo 30 ;; esac; }
# What the process' command line must contain: a pid file left from before a reboot may
# name an unrelated process by now.
proc_marker() {
  case $1 in
    mariadb) echo mariadbd ;; mysql) echo "$MYSQL_HOME/usr/sbin/mysqld" ;;
    zookeeper) echo QuorumPeerMain ;; kafka) echo kafka.Kafka ;;
    opensearch) echo org.opensearch.bootstrap.OpenSearch ;;
    elasticsearch) echo org.elasticsearch.bootstrap.Elasticsearch ;;
  esac
}

dir_of() { echo "$WORK/$1"; }
pidfile() { echo "$WORK/$1/$1.pid"; }
logfile() { echo "$WORK/$1/$1.log"; }

# Prints the pid if the service's pid file names a live process of that service.
running_pid() {
  local f pid
  f=$(pidfile "$1")
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  grep -qa -- "$(proc_marker "$1")" "/proc/$pid/cmdline" || return 1
  # A zombie still has /proc/<pid>; it is not a running service.
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || return 1
  echo "$pid"
}

tcp_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# host:port of the first entry of a "h1:p1,h2:p2/chroot" list.
first_hostport() { local s=${1%%,*}; s=${s%%/*}; echo "$s"; }

# Starts "$@" detached so it outlives this script and whoever ran it: own session (no
# SIGHUP or process-group kill from a harness, e.g. a timeout killing `make`'s group),
# stdin from /dev/null, and no inherited fds beyond 0-2, so a caller reading our stdout
# through a pipe is not kept waiting for EOF forever. The pid file names the process
# that `exec` becomes, so "$@" must exec the server itself (not fork it).
launch() {
  local svc=$1; shift
  local out; out=$(logfile "$svc")
  printf '\n===== %s: starting %s =====\n' "$svc" "$(date -Is)" >>"$out"
  (
    # cwd = the service's directory: JVM crash files land there.
    cd "$(dir_of "$svc")"
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid "$@" </dev/null >>"$out" 2>&1
  ) &
  echo $! >"$(pidfile "$svc")"
}

# user, password, host, port of a mysql:// URL, tab-separated (percent-decoded).
parse_mysql_url() {
  python3 - "$1" <<'PY'
import sys
from urllib.parse import urlsplit, unquote
u = urlsplit(sys.argv[1])
print("\t".join([unquote(u.username or "root"), unquote(u.password or ""),
                 u.hostname or "127.0.0.1", str(u.port or 3306)]))
PY
}

# A CA, a server certificate for 127.0.0.1 and a client certificate, made once and shared
# by both databases: they offer TLS (plain connections still work), and the TLS tests
# connect with them.
stack_tls() {
  local t=$WORK/tls
  [[ -s $t/client.key ]] && return 0
  mkdir -p "$t"
  (
    cd "$t"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -keyout ca.key -out ca.pem -subj "/CN=sluice-test-ca" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
    for who in server client; do
      local ext usage=serverAuth
      [[ $who == client ]] && usage=clientAuth
      ext="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=$usage\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$who.key.tmp" -out "$who.csr" -subj "/CN=sluice-test-$who"
      openssl pkcs8 -topk8 -nocrypt -in "$who.key.tmp" -out "$who.key.p8"
      openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
        -out "$who.pem" -extfile <(printf "$ext")
      rm -f "$who.csr" "$who.key.tmp"
      mv "$who.key.p8" "$who.key"
    done
  ) >>"$WORK/tls.log" 2>&1 || die "cannot make the test TLS certificates (openssl; see $WORK/tls.log)"
}

# The accounts tests and the demo use, on either database (root over the socket runs it).
# Idempotent; grants only add, so re-running while tests are connected disturbs nothing.
# REPLICATION CLIENT lets the source user read binlog positions (MariaDB 10.11 calls it
# BINLOG MONITOR).
USERS_SQL="SET SESSION sql_log_bin = 0;
CREATE USER IF NOT EXISTS 'sluice'@'%' IDENTIFIED BY 'sluice';
CREATE USER IF NOT EXISTS 'sluice'@'localhost' IDENTIFIED BY 'sluice';
GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'sluice'@'%';
GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'sluice'@'localhost';
CREATE USER IF NOT EXISTS 'sluice_admin'@'%' IDENTIFIED BY 'sluice_admin';
CREATE USER IF NOT EXISTS 'sluice_admin'@'localhost' IDENTIFIED BY 'sluice_admin';
GRANT ALL PRIVILEGES ON *.* TO 'sluice_admin'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'sluice_admin'@'localhost' WITH GRANT OPTION;"

# --- MariaDB -----------------------------------------------------------------------

mariadb_sock() { echo "$WORK/mariadb/mariadb.sock"; }
mariadb_root() { mariadb --no-defaults --socket="$(mariadb_sock)" -uroot --batch --skip-column-names "$@"; }

# Runs SQL over TCP with the credentials of a service's URL: what the tests will do.
# MYSQL_PWD keeps the password off the command line; the MariaDB client talks to both
# servers (caching_sha2_password over TLS on MySQL 9).
url_sql() {
  local user pass host port
  IFS=$'\t' read -r user pass host port < <(parse_mysql_url "$(endpoint "$1")")
  shift
  MYSQL_PWD=$pass mariadb --no-defaults --protocol=TCP -h "$host" -P "$port" -u "$user" \
    --connect-timeout=2 --batch --skip-column-names "$@" 2>/dev/null
}
url_ok() { url_sql "$1" -e 'SELECT 1' >/dev/null; }

mariadb_write_cnf() {
  local d; d=$(dir_of mariadb)
  # Only this file is read (--defaults-file): Debian's /etc/mysql config must not leak in.
  cat >"$d/my.cnf" <<EOF
[mariadbd]
user=root
datadir=$d/data
port=$MARIADB_PORT
bind-address=127.0.0.1
socket=$d/mariadb.sock
pid-file=$d/mariadb.pid
log-error=$d/mariadb.log
skip-name-resolve
server-id=1
log-bin=$d/data/binlog
binlog-format=ROW
binlog-row-image=FULL
binlog-row-metadata=FULL
gtid-strict-mode=1
log-slave-updates
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
max_allowed_packet=256M
innodb_buffer_pool_size=256M
ssl-ca=$WORK/tls/ca.pem
ssl-cert=$WORK/tls/server.pem
ssl-key=$WORK/tls/server.key
EOF
}

mariadb_start() {
  local d; d=$(dir_of mariadb)
  stack_tls
  mariadb_write_cnf
  # The marker is written last, so a half-finished bootstrap is redone rather than reused.
  if [[ ! -e $d/data/.installed ]]; then
    rm -rf "$d/data"
    mariadb-install-db --no-defaults --user=root --datadir="$d/data" --skip-test-db \
      --auth-root-authentication-method=socket >>"$(logfile mariadb)" 2>&1 \
      || { tail -n 30 "$(logfile mariadb)" >&2; die "mariadb: mariadb-install-db failed"; }
    touch "$d/data/.installed"
  fi
  launch mariadb mariadbd --defaults-file="$d/my.cnf"
}

mariadb_healthy() {
  if is_external mariadb; then url_ok mariadb; else mariadb_root -e 'SELECT 1' >/dev/null 2>&1; fi
}

mariadb_after_healthy() {
  is_external mariadb && return 0
  mariadb_root <<<"$USERS_SQL" || return 1
  url_ok mariadb || { log "mariadb: TCP login with MARIADB_URL credentials failed"; return 1; }
}

# --- Oracle MySQL (a private prefix unpacked by deploy/install.sh) -------------------------

MYSQL_HOME="$SLUICE_TOOLS/mysql"

# A program of the prefix, run through the prefix's own loader and libraries (they are
# Debian unstable's, newer than this machine's), as the words of a command line.
mysql_prefix_argv() {
  local lib="$MYSQL_HOME/usr/lib/x86_64-linux-gnu"
  printf '%s\n' "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$MYSQL_HOME/$1"
}
mysqld_argv() {
  mysql_prefix_argv usr/sbin/mysqld
  printf '%s\n' --no-defaults --user=root --basedir="$MYSQL_HOME/usr" \
    --lc-messages-dir="$MYSQL_HOME/usr/share/mysql" \
    --character-sets-dir="$MYSQL_HOME/usr/share/mysql/charsets" \
    --plugin-dir="$MYSQL_HOME/usr/lib/mysql/plugin" --secure-file-priv=
}
mysql_sock() { echo "$WORK/mysql/mysql.sock"; }
mysql_root() {
  local client; mapfile -t client < <(mysql_prefix_argv usr/bin/mysql)
  "${client[@]}" --no-defaults --socket="$(mysql_sock)" -uroot --batch --skip-column-names "$@"
}
# The unpacked server's version ("9.7.4-2"): deploy/install.sh's check that it runs.
mysqld_version() {
  local mysqld; mapfile -t mysqld < <(mysqld_argv)
  "${mysqld[@]}" --version | sed -nE 's/.* Ver ([^ ]+) .*/\1/p' | grep .
}

mysql_start() {
  local d mysqld; d=$(dir_of mysql)
  [[ -x $MYSQL_HOME/usr/sbin/mysqld ]] || die "mysql: $MYSQL_HOME/usr/sbin/mysqld not found (run deploy/install.sh)"
  stack_tls
  mapfile -t mysqld < <(mysqld_argv)
  # The marker is written last, so a half-finished initialize is redone rather than reused.
  if [[ ! -e $d/data/.installed ]]; then
    rm -rf "$d/data"
    "${mysqld[@]}" --datadir="$d/data" --initialize-insecure --log-error="$d/init.log" \
      || { tail -n 30 "$d/init.log" >&2; die "mysql: mysqld --initialize-insecure failed"; }
    touch "$d/data/.installed"
  fi
  # GTIDs on and full row metadata: what Sluice asks of a MySQL source (README, Supported
  # servers). Durability is relaxed (a throwaway instance on a shared disk).
  launch mysql "${mysqld[@]}" \
    --datadir="$d/data" --socket="$d/mysql.sock" --pid-file="$d/mysqld.pid" \
    --log-error="$d/mysqld.err" --port=$MYSQL_PORT --bind-address=127.0.0.1 --mysqlx=OFF \
    --skip-name-resolve --server-id=2 --log-bin=binlog --gtid-mode=ON \
    --enforce-gtid-consistency=ON --binlog-format=ROW --binlog-row-image=FULL \
    --binlog-row-metadata=FULL --character-set-server=utf8mb4 --max-allowed-packet=256M \
    --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=2 --sync-binlog=0 \
    --ssl-ca="$WORK/tls/ca.pem" --ssl-cert="$WORK/tls/server.pem" --ssl-key="$WORK/tls/server.key"
}

# A MySQL server of a test's own (integration-tests' PrivateSource), in DIR on PORT with
# SERVER_ID, set up as the stack's: initializes DIR/data on the first start, then becomes
# mysqld's process (exec), which runs until killed. Its socket is DIR/mysql.sock.
cmd_mysql_private() {
  (($# == 3)) || die "usage: $0 mysql-private DIR PORT SERVER_ID"
  local d=$1 port=$2 server_id=$3 mysqld
  [[ -x $MYSQL_HOME/usr/sbin/mysqld ]] || die "mysql: $MYSQL_HOME/usr/sbin/mysqld not found (run deploy/install.sh)"
  mkdir -p "$d"
  mapfile -t mysqld < <(mysqld_argv)
  if [[ ! -e $d/data/.installed ]]; then
    rm -rf "$d/data"
    "${mysqld[@]}" --datadir="$d/data" --initialize-insecure --log-error="$d/init.log" \
      || { tail -n 30 "$d/init.log" >&2; die "mysql: mysqld --initialize-insecure failed in $d"; }
    touch "$d/data/.installed"
  fi
  exec "${mysqld[@]}" --datadir="$d/data" --socket="$d/mysql.sock" --pid-file="$d/mysqld.pid" \
    --log-error="$d/mysqld.err" --port="$port" --bind-address=127.0.0.1 --mysqlx=OFF \
    --skip-name-resolve --server-id="$server_id" --log-bin=binlog --log-replica-updates=ON \
    --gtid-mode=ON --enforce-gtid-consistency=ON --binlog-format=ROW --binlog-row-image=FULL \
    --binlog-row-metadata=FULL --character-set-server=utf8mb4 --innodb-buffer-pool-size=32M \
    --innodb-redo-log-capacity=16M --performance-schema=OFF --innodb-flush-log-at-trx-commit=2 \
    --sync-binlog=0
}

mysql_healthy() {
  if is_external mysql; then url_ok mysql; else mysql_root -e 'SELECT 1' >/dev/null 2>&1; fi
}

mysql_after_healthy() {
  is_external mysql && return 0
  mysql_root <<<"$USERS_SQL" || return 1
  url_ok mysql || { log "mysql: TCP login with MYSQL_URL credentials failed"; return 1; }
}

# --- ZooKeeper -----------------------------------------------------------------------

# Not the "/usr/share/java/*" glob: it holds every Java library on the machine, among them
# slf4j-nop, slf4j-simple and other bindings, and slf4j picks one at random (nop: no log at
# all). zookeeper.jar's manifest Class-Path names its own dependencies; we add one binding.
ZK_CLASSPATH="/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"

zookeeper_start() {
  local d; d=$(dir_of zookeeper)
  mkdir -p "$d/data"
  # maxClientCnxns=0: the default caps connections per IP at 60, and every test client is
  # 127.0.0.1. forceSync=no: a throwaway instance; fsync stalls while cargo builds would
  # otherwise expire sessions (tickTime is short to make expiry tests fast).
  cat >"$d/zoo.cfg" <<EOF
tickTime=500
initLimit=10
syncLimit=5
dataDir=$d/data
clientPort=$ZOOKEEPER_PORT
clientPortAddress=127.0.0.1
minSessionTimeout=1000
maxSessionTimeout=30000
maxClientCnxns=0
forceSync=no
admin.enableServer=false
4lw.commands.whitelist=*
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
  # Log to stdout, which launch() sends to zookeeper.log with any JVM error.
  cat >"$d/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
EOF
  launch zookeeper java -Xms64m -Xmx256m -XX:+UseSerialGC \
    -Dlog4j.configuration="file:$d/log4j.properties" \
    -cp "$ZK_CLASSPATH" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg"
}

zk_4lw() {
  local hp host port
  hp=$(first_hostport "$(endpoint zookeeper)")
  host=${hp%:*}; port=${hp##*:}
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"; printf %s "$3" >&3; cat <&3' _ "$host" "$port" "$1" 2>/dev/null
}
zookeeper_healthy() { [[ $(zk_4lw ruok) == imok ]]; }
zookeeper_after_healthy() { :; }

# --- Apache Kafka (KRaft: one process is broker and controller) ----------------------------

KAFKA_HOME="$SLUICE_TOOLS/kafka-$KAFKA_VERSION"

# The settings of a one-node cluster for tests: one partition per topic unless asked,
# replication factor 1 for the internal topics, and no delay before a group's first
# rebalance. Also deploy/kafka-server.sh's template for a test's private broker.
kafka_properties() {
  local dir=$1 port=$2 controller=$3
  cat <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.flush.interval.messages=9223372036854775807
log.retention.hours=24
EOF
}

kafka_java() {
  local dir=$1; shift
  cat >"$dir/log4j2.yaml" <<'EOF'
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
EOF
  echo "$JAVA_HOME/bin/java" -Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true "-Dlog4j2.configurationFile=$dir/log4j2.yaml" \
    -cp "$KAFKA_HOME/libs/*"
}

kafka_start() {
  local d; d=$(dir_of kafka)
  [[ -f $KAFKA_HOME/stamp ]] || die "kafka: $KAFKA_HOME not found (run deploy/install.sh)"
  kafka_properties "$d" $KAFKA_PORT $KAFKA_CONTROLLER_PORT >"$d/server.properties"
  local java; read -ra java < <(kafka_java "$d")
  # The marker is written last, so a half-finished format is redone rather than reused.
  if [[ ! -e $d/data/.formatted ]]; then
    rm -rf "$d/data"
    "${java[@]}" kafka.tools.StorageTool format --standalone --cluster-id sluice-local-stack0 \
      -c "$d/server.properties" >>"$(logfile kafka)" 2>&1 \
      || { tail -n 30 "$(logfile kafka)" >&2; die "kafka: formatting its storage failed"; }
    touch "$d/data/.formatted"
  fi
  launch kafka "${java[@]}" kafka.Kafka "$d/server.properties"
}

# A broker of a test's own (integration-tests' PrivateKafka), in DIR, listening on PORT
# with its controller on CONTROLLER_PORT, advertising ADVERTISED (a fault proxy's
# host:port, so every client connection passes the proxy). Formats DIR's storage on the
# first start, then becomes the broker's process (exec), which runs until killed.
cmd_kafka_private() {
  (($# == 4)) || die "usage: $0 kafka-private DIR PORT CONTROLLER_PORT ADVERTISED"
  local d=$1 port=$2 controller=$3 advertised=$4
  [[ -f $KAFKA_HOME/stamp ]] || die "kafka: $KAFKA_HOME not found (run deploy/install.sh)"
  mkdir -p "$d"
  kafka_properties "$d" "$port" "$controller" \
    | sed "s#^advertised.listeners=.*#advertised.listeners=PLAINTEXT://$advertised#" >"$d/server.properties"
  local java; read -ra java < <(kafka_java "$d")
  if [[ ! -e $d/data/.formatted ]]; then
    "${java[@]}" kafka.tools.StorageTool format --standalone --cluster-id sluice-private-kafka0 \
      -c "$d/server.properties" || die "kafka: formatting $d failed"
    touch "$d/data/.formatted"
  fi
  exec "${java[@]}" kafka.Kafka "$d/server.properties"
}

# A Metadata request through librdkafka proves the broker speaks Kafka, not just TCP.
kafka_metadata_ok() {
  timeout 10 python3 - "$(endpoint kafka)" 2>/dev/null <<'PY'
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=3)
sys.exit(0 if md.brokers else 1)
PY
}

kafka_healthy() {
  local hp; hp=$(first_hostport "$(endpoint kafka)")
  tcp_open "${hp%:*}" "${hp##*:}" || return 1
  if is_external kafka; then
    if python3 -c 'import confluent_kafka' 2>/dev/null; then kafka_metadata_ok; fi
  else
    # The broker listens before it has joined its own controller's quorum: its log since
    # this start must say it is serving.
    awk '/^===== kafka: starting/ { started = 0 } /Kafka Server started/ { started = 1 }
      END { exit !started }' "$(logfile kafka)"
  fi
}
kafka_after_healthy() { :; }

# --- OpenSearch ----------------------------------------------------------------------------

OPENSEARCH_HOME="$SLUICE_TOOLS/opensearch-$OPENSEARCH_VERSION"

# Runs "$@" as the search user when this script runs as root (OpenSearch refuses root).
as_search_user() {
  if [[ $(id -u) == 0 ]]; then
    id "$SEARCH_USER" >/dev/null 2>&1 || die "opensearch: user $SEARCH_USER missing (run deploy/install.sh)"
    exec setpriv --reuid="$SEARCH_USER" --regid="$SEARCH_USER" --clear-groups "$@"
  fi
  exec "$@"
}

# The node of a search server: its own config directory (a 1 GiB heap, no disk
# watermarks — a test machine's disk may be fuller than a production node's would be
# allowed — no GC log or heap dump files), data and logs in the service's directory.
# $1: opensearch or elasticsearch; $2: its home; $3, $4: HTTP and transport ports.
search_start() {
  local svc=$1 home=$2 http=$3 transport=$4 d
  d=$(dir_of "$svc")
  [[ -f $home/stamp ]] || die "$svc: $home not found (run deploy/install.sh)"
  mkdir -p "$d/config" "$d/data" "$d/logs" "$d/tmp"
  cp "$home/config/log4j2.properties" "$d/config/"
  local jvm="-Xms1g
-Xmx1g
-XX:+UseG1GC
-XX:-HeapDumpOnOutOfMemoryError
-XX:ErrorFile=$d/logs/hs_err_pid%p.log"
  if [[ $svc == opensearch ]]; then
    cat >"$d/config/jvm.options" <<EOF
$jvm
-Djava.io.tmpdir=\${OPENSEARCH_TMPDIR}
-Djava.security.manager=allow
-Djava.util.concurrent.ForkJoinPool.common.threadFactory=org.opensearch.secure_sm.SecuredForkJoinWorkerThreadFactory
EOF
  else
    cat >"$d/config/jvm.options" <<EOF
$jvm
-Djava.io.tmpdir=\${ES_TMPDIR}
EOF
  fi
  cat >"$d/config/$svc.yml" <<EOF
cluster.name: sluice-local-$svc
node.name: sluice-local
discovery.type: single-node
network.host: 127.0.0.1
http.port: $http
transport.port: $transport
path.data: $d/data
path.logs: $d/logs
cluster.routing.allocation.disk.threshold_enabled: false
action.auto_create_index: false
EOF
  [[ $svc == elasticsearch ]] && printf 'xpack.security.enabled: false\n' >>"$d/config/$svc.yml"
  [[ $(id -u) == 0 ]] && chown -R "$SEARCH_USER:$SEARCH_USER" "$d"
  OPENSEARCH_JAVA_HOME=$JAVA_HOME OPENSEARCH_PATH_CONF=$d/config OPENSEARCH_TMPDIR=$d/tmp \
  ES_JAVA_HOME=$JAVA_HOME ES_PATH_CONF=$d/config ES_TMPDIR=$d/tmp \
    launch "$svc" bash -c "$(declare -f as_search_user die); SEARCH_USER=$SEARCH_USER; \
      as_search_user \"\$@\"" _ "$home/bin/$svc"
}

opensearch_start() {
  search_start opensearch "$OPENSEARCH_HOME" $OPENSEARCH_PORT $OPENSEARCH_TRANSPORT_PORT
}

search_healthy() {
  curl -fsS --max-time 2 "$(endpoint "$1")/_cluster/health?wait_for_status=yellow&timeout=1s" >/dev/null 2>&1
}
opensearch_healthy() { search_healthy opensearch; }
opensearch_after_healthy() { :; }

# --- Elasticsearch (the sink's second lane) --------------------------------------------

ELASTICSEARCH_HOME="$SLUICE_TOOLS/elasticsearch-$ELASTICSEARCH_VERSION"

elasticsearch_start() {
  search_start elasticsearch "$ELASTICSEARCH_HOME" $ELASTICSEARCH_PORT $ELASTICSEARCH_TRANSPORT_PORT
}
elasticsearch_healthy() { search_healthy elasticsearch; }
elasticsearch_after_healthy() { :; }

# --- versions ------------------------------------------------------------------------------

# What the service says it is ("?" when it does not answer).
version_of() {
  local v=""
  case $1 in
    mariadb | mysql) v=$(url_sql "$1" -e 'SELECT VERSION()') ;;
    zookeeper) v=$(zk_4lw srvr | sed -nE 's/^Zookeeper version: ([^-,]+).*/\1/p') ;;
    kafka)
      if is_external kafka; then v="(external)"
      else v=$(cat "$KAFKA_HOME/stamp" 2>/dev/null); fi ;;
    opensearch | elasticsearch)
      v=$(curl -fsS --max-time 2 "$(endpoint "$1")/" 2>/dev/null | python3 -c \
        'import json,sys; v=json.load(sys.stdin)["version"]; print(v.get("distribution","elasticsearch"), v["number"])' 2>/dev/null) ;;
  esac
  echo "${v:-?}"
}
# --- generic lifecycle -------------------------------------------------------------------

fail_service() {
  local svc=$1 why=$2
  if ! is_external "$svc" && [[ -f $(logfile "$svc") ]]; then
    printf -- '----- last lines of %s -----\n' "$(logfile "$svc")" >&2
    tail -n 40 "$(logfile "$svc")" >&2
    printf -- '-----\n' >&2
  fi
  die "$svc: $why"
}

# Starts the service unless it is external or already running; returns at once.
start_service() {
  local svc=$1 port pid
  if is_external "$svc"; then
    log "$svc: using external $(env_var "$svc") at $(endpoint "$svc")"
    return
  fi
  mkdir -p "$(dir_of "$svc")"
  if pid=$(running_pid "$svc"); then
    log "$svc: already running (pid $pid)"
    return
  fi
  port=$(local_port "$svc")
  if tcp_open 127.0.0.1 "$port"; then
    die "$svc: port $port is taken by a process this script did not start; stop it or set $(env_var "$svc")"
  fi
  STARTED_AT[$svc]=$(now_ms)
  "${svc}_start"
}

# Polls the health check until the service's deadline.
wait_service() {
  local svc=$1 deadline t0
  t0=${STARTED_AT[$svc]:-$(now_ms)}
  deadline=$((t0 + $(start_deadline "$svc") * 1000))
  until "${svc}_healthy"; do
    # While starting, the process may still be the launcher script that execs the server
    # (its command line does not name the server yet): alive is enough.
    if ! is_external "$svc" && ! kill -0 "$(cat "$(pidfile "$svc")" 2>/dev/null || echo 0)" 2>/dev/null; then
      fail_service "$svc" "process exited during startup"
    fi
    (($(now_ms) < deadline)) || fail_service "$svc" "not healthy after $(start_deadline "$svc")s at $(endpoint "$svc")"
    sleep 0.2
  done
  "${svc}_after_healthy" || fail_service "$svc" "post-start setup failed"
  log "$svc: healthy at $(endpoint "$svc") ($(($(now_ms) - t0)) ms)"
}

stop_service() {
  local svc=$1 pid deadline
  if ! pid=$(running_pid "$svc"); then
    rm -f "$(pidfile "$svc")"
    return
  fi
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$(($(now_ms) + $(stop_deadline "$svc") * 1000))
  while kill -0 "$pid" 2>/dev/null && (($(now_ms) < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    log "$svc: still alive after $(stop_deadline "$svc")s, SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$(pidfile "$svc")"
  log "$svc: stopped (pid $pid)"
}

# Optional arguments name a subset of services (default: all).
select_services() {
  local svc
  for svc in "$@"; do
    [[ " ${SERVICES[*]} " == *" $svc "* ]] || die "unknown service '$svc' (${SERVICES[*]})"
  done
  if (($#)); then SERVICES=("$@"); fi
}

cmd_up() {
  local t0 svc; t0=$(now_ms)
  declare -gA STARTED_AT=()
  # Start everything first and wait afterwards: the JVM and InnoDB start in parallel.
  for svc in "${SERVICES[@]}"; do start_service "$svc"; done
  for svc in "${SERVICES[@]}"; do wait_service "$svc"; done
  log "all healthy in $(($(now_ms) - t0)) ms"
}

cmd_down() {
  local i
  for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do stop_service "${SERVICES[i]}"; done
}

cmd_clean() {
  cmd_down
  rm -rf "$WORK"
  log "removed $WORK"
}

cmd_status() {
  local svc pid state where rc=0
  for svc in "${SERVICES[@]}"; do
    if is_external "$svc"; then
      where=$(endpoint "$svc")
      if "${svc}_healthy"; then state="external up"; else state="external DOWN"; rc=1; fi
    elif pid=$(running_pid "$svc"); then
      where="127.0.0.1:$(local_port "$svc") pid $pid"
      if "${svc}_healthy"; then state=up; else state=unhealthy; rc=1; fi
    else
      where="127.0.0.1:$(local_port "$svc")"
      state=down
      rc=1
    fi
    if [[ $state == *up ]]; then
      printf '%-11s %-14s %-30s %s\n' "$svc" "$state" "$(version_of "$svc")" "$where"
    else
      printf '%-11s %-14s %-30s %s\n' "$svc" "$state" "-" "$where"
    fi
  done
  return $rc
}

cmd_env() {
  local svc v
  for svc in "${SERVICES[@]}"; do
    v=$(env_var "$svc")
    printf 'export %s=%q\n' "$v" "$(endpoint "$svc")"
  done
}

cmd_logs() {
  local files=() svc
  for svc in "${SERVICES[@]}"; do
    [[ -f $(logfile "$svc") ]] && files+=("$(logfile "$svc")")
  done
  ((${#files[@]})) || die "no logs under $WORK"
  if [[ ${1:-} == -f ]]; then exec tail -n 20 -F "${files[@]}"; fi
  tail -n 40 "${files[@]}"
}

usage() {
  cat >&2 <<EOF
usage: $0 up|down|status [SERVICE...] | clean | env | logs [-f] | mysqld-version
  services: ${SERVICES[*]}
  up      start missing local services, wait until all are healthy
  down    stop local services (SIGTERM, then SIGKILL after a deadline)
  clean   down, then delete $WORK
  status  each service up/down with its version and endpoint; non-zero if any is not up
  env     export lines for MARIADB_URL MYSQL_URL ZOOKEEPER KAFKA_BROKERS ES_URL ELASTICSEARCH_URL
  mysqld-version  the version of the Oracle MySQL deploy/install.sh unpacked
  logs    last lines of every log (-f: follow)
EOF
  exit 2
}

cmd=${1:-}
shift || true
case $cmd in
  up) select_services "$@"; cmd_up ;;
  down) select_services "$@"; cmd_down ;;
  clean) cmd_clean ;;
  status) select_services "$@"; cmd_status ;;
  env) cmd_env ;;
  logs) cmd_logs "$@" ;;
  mysqld-version) mysqld_version ;;
  kafka-private) cmd_kafka_private "$@" ;;
  mysql-private) cmd_mysql_private "$@" ;;
  *) usage ;;
esac
