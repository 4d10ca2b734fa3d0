#!/usr/bin/env bash
# The local stack of real services Sluice is tested against: MariaDB (binlog source),
# ZooKeeper (coordination), tansu (Kafka protocol) and osmem-server (Elasticsearch API).
#
#   deploy/stack.sh up|down|clean|status|env|logs [-f]
#
# Each service runs on a private port with its state under <repo>/.work/stack/<service>/.
# Point MYSQL_URL, ZOOKEEPER, KAFKA_BROKERS or ES_URL at another endpoint and `up` leaves
# that service alone and only health-checks it. A value equal to the default counts as
# local, so `eval "$(deploy/stack.sh env)"; deploy/stack.sh up` still starts everything.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK="$ROOT/.work/stack"

DEFAULT_MYSQL_URL="mysql://sluice_admin:sluice_admin@127.0.0.1:13306"
DEFAULT_ZOOKEEPER="127.0.0.1:12181"
DEFAULT_KAFKA_BROKERS="127.0.0.1:19092"
DEFAULT_ES_URL="http://127.0.0.1:19200"

MARIADB_PORT=13306
ZOOKEEPER_PORT=12181
TANSU_PORT=19092
OSMEM_PORT=19200

SERVICES=(mariadb zookeeper tansu osmem)

log() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

# --- per-service facts -------------------------------------------------------------

env_var() {
  case $1 in
    mariadb) echo MYSQL_URL ;; zookeeper) echo ZOOKEEPER ;;
    tansu) echo KAFKA_BROKERS ;; osmem) echo ES_URL ;;
  esac
}
default_of() { local v; v="DEFAULT_$(env_var "$1")"; echo "${!v}"; }
endpoint() { local v; v=$(env_var "$1"); echo "${!v:-$(default_of "$1")}"; }
is_external() { local v; v=$(env_var "$1"); [[ -n "${!v:-}" && "${!v}" != "$(default_of "$1")" ]]; }
local_port() {
  case $1 in
    mariadb) echo $MARIADB_PORT ;; zookeeper) echo $ZOOKEEPER_PORT ;;
    tansu) echo $TANSU_PORT ;; osmem) echo $OSMEM_PORT ;;
  esac
}
# Seconds to become healthy / to stop. MariaDB's first start includes InnoDB creating its files.
start_deadline() { case $1 in mariadb) echo 90 ;; zookeeper) echo 45 ;; *) echo 30 ;; esac; }
stop_deadline() { case $1 in mariadb) echo 60 ;; *) echo 15 ;; esac; }
# What the process' command line must contain: a pid file left from before a reboot may
# name an unrelated process by now.
proc_marker() {
  case $1 in
    mariadb) echo mariadbd ;; zookeeper) echo QuorumPeerMain ;;
    tansu) echo tansu ;; osmem) echo osmem-server ;;
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
# stdin from /dev/null (osmem exits on stdin EOF otherwise), and no inherited fds beyond
# 0-2, so a caller reading our stdout through a pipe is not kept waiting for EOF forever.
launch() {
  local svc=$1; shift
  local out; out=$(logfile "$svc")
  printf '\n===== %s: starting %s =====\n' "$svc" "$(date -Is)" >>"$out"
  (
    # cwd = the service's directory: JVM crash files land there, and tansu's dotenv
    # (which reads .env from its cwd upwards) no longer sees the caller's directory.
    cd "$(dir_of "$svc")"
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid "$@" </dev/null >>"$out" 2>&1
  ) &
  echo $! >"$(pidfile "$svc")"
}

# --- MariaDB -----------------------------------------------------------------------

mariadb_sock() { echo "$WORK/mariadb/mariadb.sock"; }
mariadb_root() { mariadb --no-defaults --socket="$(mariadb_sock)" -uroot --batch --skip-column-names "$@"; }

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

# Connects over TCP with the credentials of MYSQL_URL: what the tests will do.
mariadb_url_ok() {
  local user pass host port
  IFS=$'\t' read -r user pass host port < <(parse_mysql_url "$(endpoint mariadb)")
  MYSQL_PWD=$pass mariadb --no-defaults --protocol=TCP -h "$host" -P "$port" -u "$user" \
    --connect-timeout=2 --batch --skip-column-names -e 'SELECT 1' >/dev/null 2>&1
}

# A CA, a server certificate for 127.0.0.1 and a client certificate, made once: the server
# offers TLS (plain connections still work), and the TLS tests connect with them.
mariadb_tls() {
  local t; t=$(dir_of mariadb)/tls
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
  ) >>"$(logfile mariadb)" 2>&1 || die "mariadb: cannot make the test TLS certificates (openssl)"
}

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
ssl-ca=$d/tls/ca.pem
ssl-cert=$d/tls/server.pem
ssl-key=$d/tls/server.key
EOF
}

mariadb_start() {
  local d; d=$(dir_of mariadb)
  mariadb_tls
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
  if is_external mariadb; then mariadb_url_ok; else mariadb_root -e 'SELECT 1' >/dev/null 2>&1; fi
}

# Idempotent; grants only add, so re-running while tests are connected disturbs nothing.
# On 10.11 REPLICATION CLIENT is an alias of BINLOG MONITOR, which is what SHOW MASTER
# STATUS / SHOW BINARY LOGS need.
mariadb_users() {
  mariadb_root <<'SQL'
SET SESSION sql_log_bin = 0;
CREATE USER IF NOT EXISTS 'sluice'@'%' IDENTIFIED BY 'sluice';
CREATE USER IF NOT EXISTS 'sluice'@'localhost' IDENTIFIED BY 'sluice';
GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'sluice'@'%';
GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'sluice'@'localhost';
CREATE USER IF NOT EXISTS 'sluice_admin'@'%' IDENTIFIED BY 'sluice_admin';
CREATE USER IF NOT EXISTS 'sluice_admin'@'localhost' IDENTIFIED BY 'sluice_admin';
GRANT ALL PRIVILEGES ON *.* TO 'sluice_admin'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'sluice_admin'@'localhost' WITH GRANT OPTION;
SQL
}

mariadb_after_healthy() {
  is_external mariadb && return 0
  mariadb_users || return 1
  mariadb_url_ok || { log "mariadb: TCP login with MYSQL_URL credentials failed"; return 1; }
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

# --- tansu (Kafka protocol) ------------------------------------------------------------

# deploy/install.sh builds tansu with our patch to its fetch (see the script) into
# ~/.local/lib/sluice-tansu; an unpatched tansu loses messages for consumers now and then,
# so no other is taken unless TANSU_BIN names it.
tansu_bin() {
  if [[ -n ${TANSU_BIN:-} ]]; then echo "$TANSU_BIN"
  else echo "${TANSU_HOME:-$HOME/.local/lib/sluice-tansu}/bin/tansu"; fi
}

tansu_start() {
  local bin; bin=$(tansu_bin)
  [[ -x $bin ]] || die "tansu: $bin not found (run deploy/install.sh)"
  # Every flag is explicit: tansu also reads CLUSTER_ID, LISTENER_URL, STORAGE_ENGINE...
  # from the environment, which must not leak in from the caller. memory:// storage: every
  # broker restart starts empty (tansu's memory engine).
  launch tansu "$bin" broker \
    --cluster-id sluice \
    --listener-url "tcp://127.0.0.1:$TANSU_PORT" \
    --advertised-listener-url "tcp://127.0.0.1:$TANSU_PORT" \
    --storage-engine memory://tansu/
}

# A Metadata request through librdkafka proves the broker speaks Kafka, not just TCP.
kafka_metadata_ok() {
  timeout 10 python3 - "$(endpoint tansu)" 2>/dev/null <<'PY'
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=3)
sys.exit(0 if md.brokers else 1)
PY
}

tansu_healthy() {
  local hp; hp=$(first_hostport "$(endpoint tansu)")
  tcp_open "${hp%:*}" "${hp##*:}" || return 1
  if python3 -c 'import confluent_kafka' 2>/dev/null; then kafka_metadata_ok; fi
}
tansu_after_healthy() {
  python3 -c 'import confluent_kafka' 2>/dev/null \
    || log "tansu: confluent-kafka missing, checked TCP only (run deploy/install.sh)"
}

# --- osmem-server (Elasticsearch API) --------------------------------------------------

osmem_start() {
  local bin
  bin=$(python3 -c 'import osmem_server; print(osmem_server.resolve_binary())') \
    || die "osmem: python package osmem-server missing (run deploy/install.sh)"
  launch osmem "$bin" -addr "127.0.0.1:$OSMEM_PORT" -no-stdin-watch
}
osmem_healthy() { curl -fsS --max-time 2 "$(endpoint osmem)/" >/dev/null 2>&1; }
osmem_after_healthy() { :; }

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
    if ! is_external "$svc" && ! running_pid "$svc" >/dev/null; then
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
  local svc pid state rc=0
  for svc in "${SERVICES[@]}"; do
    if is_external "$svc"; then
      if "${svc}_healthy"; then state="external up"; else state="external DOWN"; rc=1; fi
      printf '%-10s %-14s %s\n' "$svc" "$state" "$(endpoint "$svc")"
      continue
    fi
    if pid=$(running_pid "$svc"); then
      if "${svc}_healthy"; then state=up; else state=unhealthy; rc=1; fi
      printf '%-10s %-14s %-22s pid %s\n' "$svc" "$state" "127.0.0.1:$(local_port "$svc")" "$pid"
    else
      printf '%-10s %-14s %s\n' "$svc" down "127.0.0.1:$(local_port "$svc")"
      rc=1
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
usage: $0 up|down|status [SERVICE...] | clean | env | logs [-f]
  services: ${SERVICES[*]}
  up      start missing local services, wait until all are healthy
  down    stop local services (SIGTERM, then SIGKILL after a deadline)
  clean   down, then delete $WORK
  status  each service up/down with its endpoint; non-zero if any is not up
  env     export lines for MYSQL_URL ZOOKEEPER KAFKA_BROKERS ES_URL
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
  *) usage ;;
esac
