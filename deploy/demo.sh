#!/usr/bin/env bash
# The main job on a local stack with sample data:
#   a `shop.products` table, sluice-worker streaming its binlog into Kafka, sluice-etl
#   indexing it into Elasticsearch behind the alias `products`; 1000 sample rows shown
#   arriving, then a live UPDATE timed from COMMIT until it is visible in Elasticsearch.
# Endpoints: MYSQL_URL (admin), ZOOKEEPER, KAFKA_BROKERS, ES_URL, as for the tests.
# `deploy/demo.sh stop` stops the demo's worker and etl (the stack keeps running).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$root/.work/demo"
mkdir -p "$work"

MYSQL_URL="${MYSQL_URL:-mysql://sluice_admin:sluice_admin@127.0.0.1:13306}"
ZOOKEEPER="${ZOOKEEPER:-127.0.0.1:12181}"
KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:19092}"
ES_URL="${ES_URL:-http://127.0.0.1:19200}"
SOURCE_USER="${MYSQL_SOURCE_USER:-sluice}"
SOURCE_PASSWORD="${MYSQL_SOURCE_PASSWORD:-sluice}"
bin="${CARGO_TARGET_DIR:-$root/target}/debug"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

stop() {
  for svc in worker etl; do
    if [ -f "$work/$svc.pid" ] && kill -0 "$(cat "$work/$svc.pid")" 2>/dev/null; then
      kill -TERM "$(cat "$work/$svc.pid")" || true
    fi
    rm -f "$work/$svc.pid"
  done
}
if [ "${1:-}" = stop ]; then stop; exit 0; fi

# mysql://user:pass@host:port
hostport="${MYSQL_URL#*@}"; creds="${MYSQL_URL#mysql://}"; creds="${creds%@*}"
db_host="${hostport%%:*}"; db_port="${hostport##*:}"; db_port="${db_port%%/*}"
sql() { mariadb -h"$db_host" -P"$db_port" -u"${creds%%:*}" -p"${creds#*:}" --batch --skip-column-names "$@"; }
wait_for() { # description, timeout seconds, command...
  local what=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      echo "timed out waiting for $what; logs:"; tail -n 20 "$work"/*.log; exit 1
    fi
    sleep 0.2
  done
}
count() { curl -fsS "$ES_URL/products/_count" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])' 2>/dev/null || echo 0; }

stop
say "sample schema: shop.products"
sql -e "DROP DATABASE IF EXISTS shop; CREATE DATABASE shop;
        CREATE TABLE shop.products (id INT PRIMARY KEY, name VARCHAR(100), price DECIMAL(10,2),
          tags SET('new','sale','eco'), stock INT UNSIGNED, updated_at DATETIME(3));"
curl -fsS -X DELETE "$ES_URL/products_v1" >/dev/null 2>&1 || true

run_id="demo-$(date +%s)"
cat > "$work/worker.toml" <<TOML
[worker]
id = "demo-worker"
confirm_interval = "200ms"
[zookeeper]
connect = "$ZOOKEEPER"
root = "/sluice-demo/$run_id"
[kafka]
brokers = "$KAFKA_BROKERS"
[topics]
rows = "sluice.$run_id.{db}.{table}"
[[sources]]
name = "demo"
host = "$db_host"
port = $db_port
user = "$SOURCE_USER"
password = "$SOURCE_PASSWORD"
server_id = 4242
tables = ["shop.*"]
TOML
cat > "$work/etl.toml" <<TOML
[etl]
group_id = "sluice-etl-$run_id"
instance_id = "demo-etl"
linger = "50ms"
[kafka]
brokers = "$KAFKA_BROKERS"
[topics]
rows = "sluice.$run_id.{db}.{table}"
[elasticsearch]
url = "$ES_URL"
[[pipelines]]
name = "products"
source = "demo"
database = "shop"
table = "products"
replicas = 0
TOML

say "starting sluice-worker and sluice-etl (logs in .work/demo/)"
setsid "$bin/sluice-worker" --config "$work/worker.toml" </dev/null >"$work/worker.log" 2>&1 & echo $! >"$work/worker.pid"
wait_for "the worker to start streaming" 60 grep -q "streaming" "$work/worker.log"
setsid "$bin/sluice-etl" --config "$work/etl.toml" </dev/null >"$work/etl.log" 2>&1 & echo $! >"$work/etl.pid"
wait_for "the etl to consume" 60 grep -q "etl consuming" "$work/etl.log"

say "writing 1000 sample rows"
{
  echo "INSERT INTO shop.products VALUES"
  for i in $(seq 1 1000); do
    sep=","; [ "$i" = 1000 ] && sep=";"
    echo "($i, 'product $i', $((i % 97)).$((i % 100 / 10))9, '$([ $((i % 3)) = 0 ] && echo sale || echo new)', $((i * 7 % 500)), NOW(3))$sep"
  done
} | sql
wait_for "1000 documents" 120 bash -c "[ \"\$(curl -fsS '$ES_URL/products/_count' 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"count\"])' 2>/dev/null)\" = 1000 ]"
echo "documents in alias products: $(count)"
curl -fsS "$ES_URL/products/_search?size=3&q=tags:sale" | python3 -c '
import json, sys
for hit in json.load(sys.stdin)["hits"]["hits"]:
    print(" ", hit["_id"], json.dumps(hit["_source"], ensure_ascii=False))'

say "live change: UPDATE product 42, timed from COMMIT to visible in Elasticsearch"
start=$(date +%s%N)
sql -e "UPDATE shop.products SET name = 'live change $start', price = 4242.42 WHERE id = 42"
committed=$(date +%s%N)
wait_for "the live change" 30 bash -c "curl -fsS '$ES_URL/products/_doc/42' | grep -q 'live change $start'"
visible=$(date +%s%N)
curl -fsS "$ES_URL/products/_doc/42" | python3 -c 'import json,sys; print(" ", json.dumps(json.load(sys.stdin)["_source"], ensure_ascii=False))'
echo "visible $(( (visible - committed) / 1000000 )) ms after COMMIT"

say "deleting product 7"
sql -e "DELETE FROM shop.products WHERE id = 7"
wait_for "the delete" 30 bash -c "! curl -fsS '$ES_URL/products/_doc/7' >/dev/null 2>&1"
echo "product 7 is gone from Elasticsearch; documents: $(count)"

say "demo done; worker and etl keep running (make demo-stop stops them, make stack-down the stack)"
