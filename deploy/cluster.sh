#!/usr/bin/env bash
# A local Sluice cluster on the local stack: 3 centers (one leads), 3 workers in cluster
# mode and one etl following the center's pipelines, each a separate process; then the
# sample table `shop.customers` added as a source and a pipeline with sluicectl, rows
# written, and the cluster shown with `sluicectl leader|workers|tasks|events`.
# The source and the meta database: Oracle MySQL (MYSQL_URL, an admin) or, with
# DEMO_SOURCE=mariadb, MariaDB (MARIADB_URL); ZOOKEEPER, KAFKA_BROKERS, ES_URL.
#   deploy/cluster.sh           start (or restart) the cluster
#   deploy/cluster.sh stop      stop every process of it
#   deploy/cluster.sh ctl ARGS  run sluicectl against it (e.g. `ctl tasks`)
set -euo pipefail
work="$(cd "$(dirname "$0")/.." && pwd)/.work/cluster"
source "$(dirname "$0")/common.sh"
token_file="$work/admin.token"
worker_token_file="$work/worker.token"
admin_password_file="$work/admin.password"
ports=(17070 17071 17072)

ctl() { SLUICECTL_TOKEN="$(cat "$token_file")" "$bin/sluicectl" \
          --center "http://127.0.0.1:${ports[0]},http://127.0.0.1:${ports[1]},http://127.0.0.1:${ports[2]}" "$@"; }
workers_up() { [ "$(ctl -o json workers | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = "$1" ]; }
task_running() { ctl -o json tasks | python3 -c 'import json,sys; t=json.load(sys.stdin); sys.exit(0 if t and t[0]["running_on"] else 1)'; }

case "${1:-}" in
  stop) stop_started; exit 0 ;;
  ctl) shift; ctl "$@"; exit $? ;;
esac

stop_started
run_id="cluster-$(date +%s)"
for f in "$token_file" "$worker_token_file" "$admin_password_file"; do
  [ -s "$f" ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$f"
  chmod 600 "$f"
done

say "sample schema: shop.customers; meta database sluice_meta_local"
sql -e "CREATE DATABASE IF NOT EXISTS shop;
        DROP TABLE IF EXISTS shop.customers;
        CREATE TABLE shop.customers (id INT PRIMARY KEY, name VARCHAR(100), city VARCHAR(60),
          vip BOOLEAN, joined DATE);
        DROP DATABASE IF EXISTS sluice_meta_local;"
curl -fsS -X DELETE "$ES_URL/customers_v1" >/dev/null 2>&1 || true

for n in 0 1 2; do
  cat >"$work/center-$n.toml" <<TOML
source_plaintext_hosts = ["$db_host"]
source_secrets = { env = ["SOURCE_PASSWORD"] }
[telemetry]
listen = "127.0.0.1:$((9470 + n))"
[center]
id = "center-$n"
listen = "127.0.0.1:${ports[$n]}"
dictionary_listen = "127.0.0.1:$((9460 + n))"
console_listen = "127.0.0.1:$((9450 + n))"
[zookeeper]
connect = "$ZOOKEEPER"
root = "/sluice-local/$run_id"
[meta]
host = "$db_host"
port = $db_port
user = "$db_user"
password = "$db_password"
database = "sluice_meta_local"
# Local, over loopback without TLS (see deploy/demo.sh).
allow_plaintext = true
[api]
auth = "token"
token_file = "$token_file"
worker_token_file = "$worker_token_file"
admin_password_file = "$admin_password_file"
[kafka]
brokers = "$KAFKA_BROKERS"
[topics]
rows = "sluice.$run_id.{instance}.{db}.{table}"
TOML
  cat >"$work/worker-$n.toml" <<TOML
source_plaintext_hosts = ["$db_host"]
source_secrets = { env = ["SOURCE_PASSWORD"] }
[telemetry]
listen = "127.0.0.1:$((9480 + n))"
[worker]
id = "worker-$n"
confirm_interval = "200ms"
[zookeeper]
connect = "$ZOOKEEPER"
root = "/sluice-local/$run_id"
[kafka]
brokers = "$KAFKA_BROKERS"
[topics]
rows = "sluice.$run_id.{instance}.{db}.{table}"
[center]
token_file = "$worker_token_file"
TOML
done
cat >"$work/etl.toml" <<TOML
source_plaintext_hosts = ["$db_host"]
source_secrets = { env = ["SOURCE_PASSWORD"] }
[telemetry]
listen = "127.0.0.1:9490"
[etl]
group_id = "sluice-etl-$run_id"
instance_id = "local-etl"
linger = "50ms"
[kafka]
brokers = "$KAFKA_BROKERS"
[topics]
rows = "sluice.$run_id.{instance}.{db}.{table}"
[elasticsearch]
url = "$ES_URL"
[zookeeper]
connect = "$ZOOKEEPER"
root = "/sluice-local/$run_id"
TOML

say "starting 3 centers, 3 workers and the etl (logs in .work/cluster/)"
for n in 0 1 2; do
  SOURCE_PASSWORD="$SOURCE_PASSWORD" launch "center-$n" "$bin/sluice-center" --config "$work/center-$n.toml"
done
wait_for "a leader" 60 ctl leader
for n in 0 1 2; do
  SOURCE_PASSWORD="$SOURCE_PASSWORD" launch "worker-$n" "$bin/sluice-worker" --config "$work/worker-$n.toml"
done
SOURCE_PASSWORD="$SOURCE_PASSWORD" launch etl "$bin/sluice-etl" --config "$work/etl.toml"
wait_for "3 workers" 60 workers_up 3

say "adding the source and the pipeline with sluicectl"
ctl sources put local-$DEMO_SOURCE --host "$db_host" --port "$db_port" --user "$SOURCE_USER" \
  --password-ref env:SOURCE_PASSWORD --server-id 4343 --tables shop.customers
ctl pipelines put customers --source local-$DEMO_SOURCE --database shop --table customers --replicas 0
wait_for "the task to run" 60 task_running

say "writing 500 rows"
{
  echo "INSERT INTO shop.customers VALUES"
  for i in $(seq 1 500); do
    sep=","; [ "$i" = 500 ] && sep=";"
    echo "($i, 'customer $i', 'city $((i % 17))', $((i % 5 == 0)), DATE('2024-01-01') + INTERVAL $i DAY)$sep"
  done
} | sql
wait_for "500 documents" 120 has_docs customers 500
echo "documents in alias customers: 500"

say "sluicectl leader"; ctl leader
say "sluicectl workers"; ctl workers
say "sluicectl tasks"; ctl tasks
say "sluicectl events --limit 8"; ctl events --limit 8
cat <<EOF

The console: http://127.0.0.1:9450 (each center serves one: 9450, 9451, 9452)
  log in as admin with the password in .work/cluster/admin.password

The cluster keeps running. Try:
  deploy/cluster.sh ctl tasks            # who runs what, position, lag
  kill -9 \$(cat .work/cluster/worker-0.pid); sleep 6; deploy/cluster.sh ctl tasks
  deploy/cluster.sh ctl rebalance
  make cluster-stop
EOF
