#!/usr/bin/env bash
# The main job on a local stack with sample data:
#   a `shop.products` table, sluice-worker streaming its binlog into Kafka, sluice-etl
#   indexing it into Elasticsearch behind the alias `products`; 1000 sample rows shown
#   arriving, then a live UPDATE timed from COMMIT until it is visible in Elasticsearch.
# Endpoints: MYSQL_URL (admin), ZOOKEEPER, KAFKA_BROKERS, ES_URL, as for the tests.
# `deploy/demo.sh stop` stops the demo's worker and etl (the stack keeps running).
set -euo pipefail
work="$(cd "$(dirname "$0")/.." && pwd)/.work/demo"
source "$(dirname "$0")/common.sh"

if [ "${1:-}" = stop ]; then stop_started; exit 0; fi

stop_started
say "sample schema: shop.products"
sql -e "DROP DATABASE IF EXISTS shop; CREATE DATABASE shop;
        CREATE TABLE shop.products (id INT PRIMARY KEY, name VARCHAR(100), price DECIMAL(10,2),
          tags SET('new','sale','eco'), stock INT UNSIGNED, updated_at DATETIME(3));"
curl -fsS -X DELETE "$ES_URL/products_v1" >/dev/null 2>&1 || true

run_id="demo-$(date +%s)"
cat > "$work/worker.toml" <<TOML
[telemetry]
listen = "127.0.0.1:9464"
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
[telemetry]
listen = "127.0.0.1:9465"
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
launch worker "$bin/sluice-worker" --config "$work/worker.toml"
wait_for "the worker to start streaming" 60 grep -q "streaming" "$work/worker.log"
launch etl "$bin/sluice-etl" --config "$work/etl.toml"
wait_for "the etl to consume" 60 grep -q "etl consuming" "$work/etl.log"

say "writing 1000 sample rows"
{
  echo "INSERT INTO shop.products VALUES"
  for i in $(seq 1 1000); do
    sep=","; [ "$i" = 1000 ] && sep=";"
    echo "($i, 'product $i', $((i % 97)).$((i % 100 / 10))9, '$([ $((i % 3)) = 0 ] && echo sale || echo new)', $((i * 7 % 500)), NOW(3))$sep"
  done
} | sql
wait_for "1000 documents" 120 has_docs products 1000
echo "documents in alias products: $(doc_count products)"
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
echo "product 7 is gone from Elasticsearch; documents: $(doc_count products)"

say "demo done; worker and etl keep running (make demo-stop stops them, make stack-down the stack)"
