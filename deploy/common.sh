# Shared by deploy/demo.sh and deploy/cluster.sh (sourced; set $work first): the
# endpoints (overridable as for the tests), the admin SQL client, waiting on a condition
# with a deadline, document counts, and stopping what the script started.
# DEMO_SOURCE picks the source server: mysql (Oracle MySQL, MYSQL_URL; the default) or
# mariadb (MARIADB_URL).

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO_SOURCE="${DEMO_SOURCE:-mysql}"
case "$DEMO_SOURCE" in
  mysql) admin_url="${MYSQL_URL:-mysql://sluice_admin:sluice_admin@127.0.0.1:13307}" ;;
  mariadb) admin_url="${MARIADB_URL:-mysql://sluice_admin:sluice_admin@127.0.0.1:13306}" ;;
  *) echo "DEMO_SOURCE=$DEMO_SOURCE: mysql or mariadb" >&2; exit 2 ;;
esac
ZOOKEEPER="${ZOOKEEPER:-127.0.0.1:12181}"
KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:19092}"
ES_URL="${ES_URL:-http://127.0.0.1:19200}"
SOURCE_USER="${MYSQL_SOURCE_USER:-sluice}"
SOURCE_PASSWORD="${MYSQL_SOURCE_PASSWORD:-sluice}"
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
mkdir -p "$work"

# mysql://user:pass@host:port
hostport="${admin_url#*@}"; creds="${admin_url#mysql://}"; creds="${creds%@*}"
db_host="${hostport%%:*}"; db_port="${hostport##*:}"; db_port="${db_port%%/*}"
db_user="${creds%%:*}"; db_password="${creds#*:}"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

sql() { mariadb -h"$db_host" -P"$db_port" -u"$db_user" -p"$db_password" --batch --skip-column-names "$@"; }

# wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: polls COMMAND (quietly) until it
# succeeds; at the deadline prints the logs in $work and exits.
wait_for() {
  local what=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "timed out waiting for $what; logs:"; tail -n 20 "$work"/*.log; exit 1
    fi
    sleep 0.2
  done
}

# doc_count ALIAS: documents searchable through ALIAS (0 when it does not exist yet).
doc_count() {
  curl -fsS "$ES_URL/$1/_count" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])' 2>/dev/null || echo 0
}

# has_docs ALIAS N: ALIAS holds exactly N documents.
has_docs() { [ "$(doc_count "$1")" = "$2" ]; }

# launch NAME COMMAND...: runs COMMAND detached, output in $work/NAME.log, pid in NAME.pid.
launch() {
  local name=$1; shift
  setsid "$@" </dev/null >"$work/$name.log" 2>&1 & echo $! >"$work/$name.pid"
}

# stop_started: SIGTERM to every process this script started (its pid files in $work).
stop_started() {
  for pidfile in "$work"/*.pid; do
    [ -e "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" || true; fi
    rm -f "$pidfile"
  done
}
