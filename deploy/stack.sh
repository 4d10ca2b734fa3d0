#!/usr/bin/env bash
# The local stack of real services Sluice is tested against: MariaDB and Oracle MySQL
# (binlog sources), ZooKeeper (coordination), Apache Kafka (KRaft mode), OpenSearch and
# Elasticsearch, and OpenSearch with its security plugin (opensearch-secure).
#
# With credentials: Kafka has, beside its plain listener, a SASL_SSL one (SCRAM-SHA-512,
# a certificate of the stack's test CA); opensearch-secure speaks only HTTPS with basic
# auth. The passwords are made once (.work/stack/secrets/); .work/stack/secure.env says
# where to connect and as whom (KEY=value lines, see write_secure_env).
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
DEFAULT_SECURE_ES_URL="https://127.0.0.1:19202"
DEFAULT_PAINLESS_ES_URL="http://127.0.0.1:19203"

MARIADB_PORT=13306
MYSQL_PORT=13307
ZOOKEEPER_PORT=12181
KAFKA_PORT=19092
KAFKA_CONTROLLER_PORT=19093
KAFKA_SASL_PORT=19094
OPENSEARCH_PORT=19200
OPENSEARCH_TRANSPORT_PORT=19300
ELASTICSEARCH_PORT=19201
ELASTICSEARCH_TRANSPORT_PORT=19301
OPENSEARCH_SECURE_PORT=19202
OPENSEARCH_SECURE_TRANSPORT_PORT=19302
ELASTICSEARCH_PAINLESS_PORT=19203
ELASTICSEARCH_PAINLESS_TRANSPORT_PORT=19303

SERVICES=(mariadb mysql zookeeper kafka opensearch elasticsearch opensearch-secure elasticsearch-painless)
SECURE_ENV="$WORK/secure.env"
SECRETS="$WORK/secrets"

log() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

# --- per-service facts -------------------------------------------------------------

env_var() {
  case $1 in
    mariadb) echo MARIADB_URL ;; mysql) echo MYSQL_URL ;; zookeeper) echo ZOOKEEPER ;;
    kafka) echo KAFKA_BROKERS ;; opensearch) echo ES_URL ;; elasticsearch) echo ELASTICSEARCH_URL ;;
    opensearch-secure) echo SECURE_ES_URL ;; elasticsearch-painless) echo PAINLESS_ES_URL ;;
  esac
}
default_of() { local v; v="DEFAULT_$(env_var "$1")"; echo "${!v}"; }
endpoint() { local v; v=$(env_var "$1"); echo "${!v:-$(default_of "$1")}"; }
is_external() { local v; v=$(env_var "$1"); [[ -n "${!v:-}" && "${!v}" != "$(default_of "$1")" ]]; }
local_port() {
  case $1 in
    mariadb) echo $MARIADB_PORT ;; mysql) echo $MYSQL_PORT ;; zookeeper) echo $ZOOKEEPER_PORT ;;
    kafka) echo $KAFKA_PORT ;; opensearch) echo $OPENSEARCH_PORT ;;
    elasticsearch) echo $ELASTICSEARCH_PORT ;; opensearch-secure) echo $OPENSEARCH_SECURE_PORT ;;
    elasticsearch-painless) echo $ELASTICSEARCH_PAINLESS_PORT ;;
  esac
}
# Seconds to become healthy / to stop. A database's first start includes creating its files;
# OpenSearch's JVM takes 20 s on an idle machine and much longer beside a cargo build. A
# Kafka restarted over thousands of partitions (a developer's stack after many test runs)
# loads each partition's log before it answers: 90 s was seen to be too short.
start_deadline() {
  case $1 in
    mariadb | mysql | zookeeper) echo 90 ;;
    kafka | opensearch | elasticsearch | opensearch-secure | elasticsearch-painless) echo 240 ;;
    *) echo 90 ;;
  esac
}
stop_deadline() {
  case $1 in mariadb | mysql | opensearch | elasticsearch* | opensearch-secure) echo 60 ;; *) echo 30 ;; esac
}
# What the process' command line must contain: a pid file left from before a reboot may
# name an unrelated process by now.
proc_marker() {
  case $1 in
    mariadb) echo mariadbd ;; mysql) echo "$MYSQL_HOME/usr/sbin/mysqld" ;;
    zookeeper) echo QuorumPeerMain ;; kafka) echo kafka.Kafka ;;
    opensearch) echo org.opensearch.bootstrap.OpenSearch ;;
    elasticsearch) echo "-Des.path.home=$ELASTICSEARCH_HOME" ;;
    opensearch-secure) echo "-Dopensearch.path.home=$OPENSEARCH_SECURE_HOME" ;;
    elasticsearch-painless) echo "-Des.path.home=$ELASTICSEARCH_PAINLESS_HOME" ;;
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

# One more certificate of the stack's CA, made once: $WORK/tls/NAME.pem and NAME.key
# (PKCS#8, written last), subject CN=sluice-test-NAME, extended key usage EKU, and
# subjectAltName SAN when given. A stack made before this function keeps its CA.
stack_tls_cert() {
  local name=$1 eku=$2 san=${3:-} t=$WORK/tls
  stack_tls
  [[ -s $t/$name.key ]] && return 0
  (
    cd "$t"
    local ext="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=$eku"
    [[ -n $san ]] && ext+="\nsubjectAltName=$san"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -keyout "$name.key.tmp" -out "$name.csr" -subj "/CN=sluice-test-$name"
    openssl pkcs8 -topk8 -nocrypt -in "$name.key.tmp" -out "$name.key.p8"
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAserial ca.srl -CAcreateserial \
      -days 3650 -out "$name.pem" -extfile <(printf "$ext")
    rm -f "$name.csr" "$name.key.tmp"
    mv "$name.key.p8" "$name.key"
  ) >>"$WORK/tls.log" 2>&1 || die "cannot make the test certificate $name (openssl; see $WORK/tls.log)"
}

# --- credentials of the secured services -----------------------------------------------

# The password called NAME, made once (32 hex digits) and kept in $WORK/secrets/NAME.
secret() {
  local f=$SECRETS/$1
  if [[ ! -s $f ]]; then
    (umask 077 && mkdir -p "$SECRETS" && openssl rand -hex 16 >"$f.tmp" && mv "$f.tmp" "$f") \
      || die "cannot make the password $f"
  fi
  cat "$f"
}

# Where the secured endpoints are and the credentials to use, one KEY=value a line (values
# unquoted, never holding spaces). Only the stack's own services are described: an
# external KAFKA_BROKERS or SECURE_ES_URL comes with credentials of its own.
secure_env_lines() {
  local ca=$WORK/tls/ca.pem
  stack_tls
  if ! is_external kafka; then
    echo "SECURE_KAFKA_BROKERS=127.0.0.1:$KAFKA_SASL_PORT"
    echo "SECURE_KAFKA_SECURITY_PROTOCOL=SASL_SSL"
    echo "SECURE_KAFKA_MECHANISM=SCRAM-SHA-512"
    echo "SECURE_KAFKA_USER=$KAFKA_SCRAM_USER"
    echo "SECURE_KAFKA_PASSWORD=$(secret kafka-sluice)"
    echo "SECURE_KAFKA_CA=$ca"
  fi
  if ! is_external opensearch-secure; then
    # The admin certificate (its DN is plugins.security.authcz.admin_dn) reads and
    # rewrites the security index; the admin user has all_access otherwise.
    stack_tls_cert opensearch-admin clientAuth
    echo "SECURE_ES_URL=$DEFAULT_SECURE_ES_URL"
    echo "SECURE_ES_CA=$ca"
    echo "SECURE_ES_ETL_USER=sluice_etl"
    echo "SECURE_ES_ETL_PASSWORD=$(secret opensearch-sluice_etl)"
    echo "SECURE_ES_CENTER_USER=sluice_center"
    echo "SECURE_ES_CENTER_PASSWORD=$(secret opensearch-sluice_center)"
    echo "SECURE_ES_ADMIN_USER=admin"
    echo "SECURE_ES_ADMIN_PASSWORD=$(secret opensearch-admin)"
    echo "SECURE_ES_ADMIN_CERT=$WORK/tls/opensearch-admin.pem"
    echo "SECURE_ES_ADMIN_KEY=$WORK/tls/opensearch-admin.key"
  fi
}

# $WORK/secure.env, for the tests to read: secure_env_lines, rewritten by each `up`.
write_secure_env() {
  mkdir -p "$WORK"
  {
    echo "# Written by deploy/stack.sh up: the stack's endpoints with TLS and credentials."
    secure_env_lines
  } >"$SECURE_ENV.tmp"
  chmod 600 "$SECURE_ENV.tmp"
  mv "$SECURE_ENV.tmp" "$SECURE_ENV"
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
# SASL_PORT (the stack's broker only): a SASL_SSL listener there too, SCRAM-SHA-512 over
# TLS with DIR/broker.pem (key and certificate, PEM); the broker and its controller keep
# talking over PLAINTEXT.
kafka_properties() {
  local dir=$1 port=$2 controller=$3 sasl=${4:-}
  local listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller"
  local advertised="PLAINTEXT://127.0.0.1:$port" protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [[ -n $sasl ]]; then
    listeners+=",SASL_SSL://127.0.0.1:$sasl"
    advertised+=",SASL_SSL://127.0.0.1:$sasl"
    protocols+=",SASL_SSL:SASL_SSL"
  fi
  cat <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols
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
  if [[ -n $sasl ]]; then
    cat <<EOF
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$dir/broker.pem
EOF
  fi
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

# The SCRAM user of the SASL_SSL listener and what $d/data/.scram holds once the broker
# has its credential (a digest: the password stays in $SECRETS).
KAFKA_SCRAM_USER=sluice
kafka_scram_stamp() { printf '%s:%s' "$KAFKA_SCRAM_USER" "$(secret kafka-sluice)" | sha256sum | cut -c1-64; }

kafka_start() {
  local d; d=$(dir_of kafka)
  [[ -f $KAFKA_HOME/stamp ]] || die "kafka: $KAFKA_HOME not found (run deploy/install.sh)"
  stack_tls
  # The SASL_SSL listener's key and certificate: the stack's server certificate
  # (127.0.0.1 and localhost), as one PEM file.
  (umask 077 && cat "$WORK/tls/server.key" "$WORK/tls/server.pem" >"$d/broker.pem")
  kafka_properties "$d" $KAFKA_PORT $KAFKA_CONTROLLER_PORT $KAFKA_SASL_PORT >"$d/server.properties"
  local java; read -ra java < <(kafka_java "$d")
  # The marker is written last, so a half-finished format is redone rather than reused.
  # A fresh storage gets the SCRAM credential with the format; a stack formatted before
  # the SASL listener existed gets it from kafka_after_healthy.
  if [[ ! -e $d/data/.formatted ]]; then
    rm -rf "$d/data"
    "${java[@]}" kafka.tools.StorageTool format --standalone --cluster-id sluice-local-stack0 \
      -c "$d/server.properties" \
      --add-scram "SCRAM-SHA-512=[name=$KAFKA_SCRAM_USER,password=$(secret kafka-sluice)]" \
      >>"$(logfile kafka)" 2>&1 \
      || { tail -n 30 "$(logfile kafka)" >&2; die "kafka: formatting its storage failed"; }
    kafka_scram_stamp >"$d/data/.scram"
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
# Adds (or replaces) the SCRAM credential through the PLAINTEXT listener with Kafka's own
# kafka-configs tool, when the storage does not have this password yet: a stack formatted
# before the SASL listener existed, or a password file made anew. The credential lives in
# the metadata log, so a restart keeps it. The password goes through a file, not argv.
kafka_after_healthy() {
  is_external kafka && return 0
  local d java f; d=$(dir_of kafka)
  if ! tcp_open 127.0.0.1 $KAFKA_SASL_PORT; then
    log "kafka: no SASL_SSL listener on $KAFKA_SASL_PORT (started by an older deploy/stack.sh): \
deploy/stack.sh down kafka && deploy/stack.sh up kafka"
  fi
  [[ $(cat "$d/data/.scram" 2>/dev/null) == "$(kafka_scram_stamp)" ]] && return 0
  read -ra java < <(kafka_java "$d")
  f=$d/scram.properties
  (umask 077 && printf 'SCRAM-SHA-512=iterations=4096,password=%s\n' "$(secret kafka-sluice)" >"$f")
  if ! "${java[@]}" kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" --alter \
    --entity-type users --entity-name "$KAFKA_SCRAM_USER" --add-config-file "$f" >>"$(logfile kafka)" 2>&1; then
    rm -f "$f"
    log "kafka: adding the SCRAM credential of $KAFKA_SCRAM_USER failed (see $(logfile kafka))"
    return 1
  fi
  rm -f "$f"
  kafka_scram_stamp >"$d/data/.scram"
  log "kafka: SCRAM-SHA-512 credential of $KAFKA_SCRAM_USER added"
}

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

# The node of a search server: its own config directory (a 1 GiB heap unless $5 says
# otherwise, no disk watermarks — a test machine's disk may be fuller than a production
# node's would be allowed — no GC log or heap dump files), data and logs in the service's
# directory. $1: opensearch, elasticsearch, opensearch-secure (an OpenSearch whose
# security settings opensearch_secure_config adds) or elasticsearch-painless (an
# Elasticsearch 7.10 without x-pack, which reads JAVA_HOME); $2: its home; $3, $4: HTTP and
# transport ports.
search_start() {
  local svc=$1 home=$2 http=$3 transport=$4 heap=${5:-1g} kind=${1%-*} d
  d=$(dir_of "$svc")
  [[ -f $home/stamp ]] || die "$svc: $home not found (run deploy/install.sh)"
  mkdir -p "$d/config" "$d/data" "$d/logs" "$d/tmp"
  cp "$home/config/log4j2.properties" "$d/config/"
  local jvm="-Xms$heap
-Xmx$heap
-XX:+UseG1GC
-XX:-HeapDumpOnOutOfMemoryError
-XX:ErrorFile=$d/logs/hs_err_pid%p.log"
  if [[ $kind == opensearch ]]; then
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
    # Elasticsearch 7.10 installs a security manager, which Java 18+ allows only when
    # asked (7.17's launcher asks itself).
    [[ $svc == elasticsearch-painless ]] && echo "-Djava.security.manager=allow" >>"$d/config/jvm.options"
  fi
  cat >"$d/config/$kind.yml" <<EOF
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
  [[ $svc == opensearch-secure ]] && opensearch_secure_config "$d" "$home"
  [[ $(id -u) == 0 ]] && chown -R "$SEARCH_USER:$SEARCH_USER" "$d"
  OPENSEARCH_JAVA_HOME=$JAVA_HOME OPENSEARCH_PATH_CONF=$d/config OPENSEARCH_TMPDIR=$d/tmp \
  ES_JAVA_HOME=$JAVA_HOME JAVA_HOME=$JAVA_HOME ES_PATH_CONF=$d/config ES_TMPDIR=$d/tmp \
    launch "$svc" bash -c "$(declare -f as_search_user die); SEARCH_USER=$SEARCH_USER; \
      as_search_user \"\$@\"" _ "$home/bin/$kind"
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

# --- Elasticsearch with Painless (area updates on Elasticsearch; a small heap: the lane
# runs the relations tests only) ----------------------------------------------------------
ELASTICSEARCH_PAINLESS_HOME="$SLUICE_TOOLS/elasticsearch-painless-$ELASTICSEARCH_PAINLESS_VERSION"

elasticsearch-painless_start() {
  search_start elasticsearch-painless "$ELASTICSEARCH_PAINLESS_HOME" $ELASTICSEARCH_PAINLESS_PORT \
    $ELASTICSEARCH_PAINLESS_TRANSPORT_PORT 512m
}
elasticsearch-painless_healthy() { search_healthy elasticsearch-painless; }
elasticsearch-painless_after_healthy() { :; }

# --- OpenSearch with its security plugin (credentials and TLS on HTTP and transport) ---

OPENSEARCH_SECURE_HOME="$SLUICE_TOOLS/opensearch-secure-$OPENSEARCH_SECURE_VERSION"
OPENSEARCH_SECURE_HEAP=512m

# The bcrypt hash of password NAME for internal_users.yml, made once by the plugin's own
# tools/hash.sh (about 2 s of JVM) and kept beside the password.
secret_bcrypt() {
  local f=$SECRETS/$1.bcrypt hash
  if [[ ! -s $f || $SECRETS/$1 -nt $f ]]; then
    hash=$(PW=$(secret "$1") OPENSEARCH_JAVA_HOME=$JAVA_HOME \
      JAVA_OPTS="-Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC" \
      bash "$OPENSEARCH_SECURE_HOME/plugins/opensearch-security/tools/hash.sh" -env PW \
      | grep -E '^\$2[aby]\$') || die "opensearch-secure: hash.sh could not hash the password $1"
    (umask 077 && echo "$hash" >"$f")
  fi
  cat "$f"
}

# The security settings and the security plugin's configuration (config/opensearch-security/,
# which initialises the security index at the node's first start, and securityadmin.sh
# later when it changes: see opensearch-secure_after_healthy). Users: admin (all_access,
# for the tests' own setup and checks), sluice_etl and sluice_center with what Sluice's
# client calls (crates/elastic/src/client.rs), on every index; the security index stays
# out of their reach (system index protection, admin certificate only).
opensearch_secure_config() {
  local d=$1 home=$2 c=$1/config
  stack_tls_cert opensearch-node serverAuth,clientAuth IP:127.0.0.1,DNS:localhost
  stack_tls_cert opensearch-admin clientAuth
  # The plugin reads certificates only from the config directory.
  cp "$WORK/tls/ca.pem" "$c/ca.pem"
  cp "$WORK/tls/opensearch-node.pem" "$c/node.pem"
  cp "$WORK/tls/opensearch-node.key" "$c/node.key"
  cat >>"$c/opensearch.yml" <<EOF
plugins.security.ssl.transport.pemcert_filepath: node.pem
plugins.security.ssl.transport.pemkey_filepath: node.key
plugins.security.ssl.transport.pemtrustedcas_filepath: ca.pem
plugins.security.ssl.transport.enforce_hostname_verification: false
plugins.security.ssl.http.enabled: true
plugins.security.ssl.http.pemcert_filepath: node.pem
plugins.security.ssl.http.pemkey_filepath: node.key
plugins.security.ssl.http.pemtrustedcas_filepath: ca.pem
plugins.security.allow_default_init_securityindex: true
plugins.security.authcz.admin_dn: ["CN=sluice-test-opensearch-admin"]
plugins.security.nodes_dn: ["CN=sluice-test-opensearch-node"]
plugins.security.system_indices.enabled: true
plugins.security.restapi.roles_enabled: ["all_access"]
plugins.security.audit.type: noop
EOF
  local sc=$c/opensearch-security f
  mkdir -p "$sc"
  # The plugin's own (empty or default) files for what the stack does not use.
  for f in action_groups tenants nodes_dn allowlist whitelist; do
    cp "$home/config/opensearch-security/$f.yml" "$sc/"
  done
  cat >"$sc/config.yml" <<'EOF'
_meta:
  type: "config"
  config_version: 2
config:
  dynamic:
    http:
      anonymous_auth_enabled: false
    authc:
      basic_internal_auth_domain:
        description: "HTTP basic against the internal users"
        http_enabled: true
        transport_enabled: true
        order: 0
        http_authenticator:
          type: basic
          challenge: true
        authentication_backend:
          type: intern
EOF
  cat >"$sc/audit.yml" <<'EOF'
_meta:
  type: "audit"
  config_version: 2
config:
  enabled: false
EOF
  cat >"$sc/internal_users.yml" <<EOF
_meta:
  type: "internalusers"
  config_version: 2
admin:
  hash: "$(secret_bcrypt opensearch-admin)"
  description: "all access: the tests' own setup and checks"
sluice_etl:
  hash: "$(secret_bcrypt opensearch-sluice_etl)"
  description: "sluice-etl: writes documents, manages its indices' mappings, settings, aliases"
sluice_center:
  hash: "$(secret_bcrypt opensearch-sluice_center)"
  description: "sluice-center: builds, swaps and drops indices, reads documents"
EOF
  # Cluster level: GET / (cluster:monitor/main) and the two multi-index requests (_bulk,
  # _mget); everything else is an index permission. `_count` is a search.
  cat >"$sc/roles.yml" <<'EOF'
_meta:
  type: "roles"
  config_version: 2
sluice_etl:
  description: "what sluice-etl calls: _bulk (index, delete with external versions, scripted updates), whether Painless runs, index create, mappings, settings, aliases, searches and gets"
  cluster_permissions:
    - "cluster:monitor/main"
    - "cluster:admin/script_language/get"
    - "indices:data/write/bulk"
    - "indices:data/read/mget"
  index_permissions:
    - index_patterns: ["*"]
      allowed_actions:
        - "indices:data/write/index*"
        - "indices:data/write/update*"
        - "indices:data/write/delete*"
        - "indices:data/write/bulk*"
        - "indices:data/read/get*"
        - "indices:data/read/mget*"
        - "indices:data/read/search*"
        - "indices:admin/get"
        - "indices:admin/create"
        - "indices:admin/mapping/put"
        - "indices:admin/mappings/get"
        - "indices:monitor/settings/get"
        - "indices:admin/settings/update"
        - "indices:admin/aliases"
        - "indices:admin/aliases/get"
        - "indices:admin/refresh*"
sluice_center:
  description: "what sluice-center calls: GET /, index create and delete, settings, aliases, refresh, counts and gets, and the deletes of old tombstones"
  cluster_permissions:
    - "cluster:monitor/main"
    - "indices:data/read/mget"
    - "indices:data/write/bulk"
  index_permissions:
    - index_patterns: ["*"]
      allowed_actions:
        - "indices:data/write/delete*"
        - "indices:data/write/bulk*"
        - "indices:data/read/get*"
        - "indices:data/read/mget*"
        - "indices:data/read/search*"
        - "indices:admin/get"
        - "indices:admin/create"
        - "indices:admin/delete"
        - "indices:admin/settings/update"
        - "indices:admin/aliases"
        - "indices:admin/aliases/get"
        - "indices:admin/refresh*"
EOF
  cat >"$sc/roles_mapping.yml" <<'EOF'
_meta:
  type: "rolesmapping"
  config_version: 2
all_access:
  reserved: false
  users: ["admin"]
sluice_etl:
  users: ["sluice_etl"]
sluice_center:
  users: ["sluice_center"]
EOF
  # What the plugin asks of files holding keys and passwords.
  chmod -R go-rwx "$c"
}

opensearch-secure_start() {
  search_start opensearch-secure "$OPENSEARCH_SECURE_HOME" $OPENSEARCH_SECURE_PORT \
    $OPENSEARCH_SECURE_TRANSPORT_PORT $OPENSEARCH_SECURE_HEAP
}

# curl with the CA and the admin's credentials of the secured node (an external one's
# from SECURE_ES_CA, SECURE_ES_ADMIN_USER and SECURE_ES_ADMIN_PASSWORD), which reach curl
# on stdin, not on its command line.
secure_es_curl() {
  local ca user pw args=()
  if is_external opensearch-secure; then
    ca=${SECURE_ES_CA:-} user=${SECURE_ES_ADMIN_USER:-} pw=${SECURE_ES_ADMIN_PASSWORD:-}
  else
    ca=$WORK/tls/ca.pem user=admin pw=$(cat "$SECRETS/opensearch-admin" 2>/dev/null)
  fi
  [[ -n $ca ]] && args+=(--cacert "$ca")
  printf 'user = "%s:%s"\n' "$user" "$pw" | curl -K - -fsS --max-time 2 "${args[@]}" "$@"
}
opensearch-secure_healthy() {
  secure_es_curl "$(endpoint opensearch-secure)/_cluster/health?wait_for_status=yellow&timeout=1s" \
    >/dev/null 2>&1
}

# The digest of the security configuration the security index was last given. A node's
# first start loads config/opensearch-security/ itself; when the files change later (new
# passwords, roles edited here), securityadmin.sh with the admin certificate reloads them
# (about 7 s of JVM), so a kept data directory never serves stale users or roles.
opensearch_secure_digest() { cat "$1"/config/opensearch-security/*.yml | sha256sum | cut -c1-64; }

opensearch-secure_after_healthy() {
  is_external opensearch-secure && return 0
  local d stamp digest user; d=$(dir_of opensearch-secure)
  stamp=$d/security-config.sha256
  digest=$(opensearch_secure_digest "$d")
  if [[ -s $stamp && $(<"$stamp") != "$digest" ]]; then
    log "opensearch-secure: security configuration changed, reloading it with securityadmin.sh"
    OPENSEARCH_JAVA_HOME=$JAVA_HOME JAVA_OPTS="-Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC" \
      bash "$OPENSEARCH_SECURE_HOME/plugins/opensearch-security/tools/securityadmin.sh" \
      -cd "$d/config/opensearch-security" -icl -h 127.0.0.1 -p $OPENSEARCH_SECURE_PORT \
      -cacert "$WORK/tls/ca.pem" -cert "$WORK/tls/opensearch-admin.pem" \
      -key "$WORK/tls/opensearch-admin.key" >>"$(logfile opensearch-secure)" 2>&1 \
      || { log "opensearch-secure: securityadmin.sh failed (see $(logfile opensearch-secure))"; return 1; }
  fi
  echo "$digest" >"$stamp"
  # The services' users log in with what secure.env says.
  for user in sluice_etl sluice_center; do
    printf 'user = "%s:%s"\n' "$user" "$(secret "opensearch-$user")" \
      | curl -K - -fsS --max-time 5 --cacert "$WORK/tls/ca.pem" "$DEFAULT_SECURE_ES_URL/" >/dev/null \
      || { log "opensearch-secure: $user cannot log in with the password in $SECURE_ENV"; return 1; }
  done
}

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
    opensearch | elasticsearch | opensearch-secure | elasticsearch-painless)
      if [[ $1 == opensearch-secure ]]; then
        v=$(secure_es_curl "$(endpoint "$1")/" 2>/dev/null)
      else
        v=$(curl -fsS --max-time 2 "$(endpoint "$1")/" 2>/dev/null)
      fi
      v=$(python3 -c 'import json,sys; v=json.load(sys.stdin)["version"]; print(v.get("distribution","elasticsearch"), v["number"])' <<<"$v" 2>/dev/null) ;;
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
  write_secure_env
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
      printf '%-22s %-14s %-30s %s\n' "$svc" "$state" "$(version_of "$svc")" "$where"
    else
      printf '%-22s %-14s %-30s %s\n' "$svc" "$state" "-" "$where"
    fi
  done
  return $rc
}

cmd_env() {
  local svc v key value
  for svc in "${SERVICES[@]}"; do
    v=$(env_var "$svc")
    printf 'export %s=%q\n' "$v" "$(endpoint "$svc")"
  done
  # The secured endpoints' credentials (see secure_env_lines).
  while IFS='=' read -r key value; do
    if [[ $key != SECURE_ES_URL ]]; then printf 'export %s=%q\n' "$key" "$value"; fi
  done < <(secure_env_lines)
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
          PAINLESS_ES_URL SECURE_ES_URL, and the SECURE_* credentials of $SECURE_ENV
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
