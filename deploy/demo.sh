#!/usr/bin/env bash
# The main job on a local stack with sample data:
#   a shop (`products`, their `brands` and `skus`) added with sluicectl to a center (which
#   serves the console), sluice-worker streaming its binlog into Kafka, sluice-etl
#   building one document per product — its brand as an object, its SKUs nested — behind
#   the alias `products`; 1000 sample products shown arriving, then a live change to one
#   SKU's price timed from COMMIT until it is visible inside its product's document; last,
#   the console's address and a login.
# The source is Oracle MySQL (MYSQL_URL, an admin) or, with DEMO_SOURCE=mariadb,
# MariaDB (MARIADB_URL); ZOOKEEPER, KAFKA_BROKERS, ES_URL as for the tests.
# `deploy/demo.sh stop` stops the demo's center, worker and etl (the stack keeps running).
set -euo pipefail
work="$(cd "$(dirname "$0")/.." && pwd)/.work/demo"
source "$(dirname "$0")/common.sh"

if [ "${1:-}" = stop ]; then stop_started; exit 0; fi

stop_started
say "sample schema on $(sql -e 'SELECT VERSION()'): shop.products, shop.brands, shop.skus"
sql -e "DROP DATABASE IF EXISTS shop; CREATE DATABASE shop;
        CREATE TABLE shop.brands (id INT PRIMARY KEY, name VARCHAR(100));
        CREATE TABLE shop.products (id INT PRIMARY KEY, name VARCHAR(100), brand_id INT,
          tags SET('new','sale','eco'), updated_at DATETIME(3), KEY (brand_id));
        CREATE TABLE shop.skus (id INT PRIMARY KEY, product_id INT, code VARCHAR(32),
          price DECIMAL(10,2), stock INT UNSIGNED, KEY (product_id));"
curl -fsS -X DELETE "$ES_URL/products_v1" >/dev/null 2>&1 || true

run_id="demo-$(date +%s)"
token_file="$work/admin.token"
worker_token_file="$work/worker.token"
admin_password_file="$work/admin.password"
for f in "$token_file" "$worker_token_file" "$admin_password_file"; do
  [ -s "$f" ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$f"
  chmod 600 "$f"
done
ctl() { SLUICECTL_TOKEN="$(cat "$token_file")" "$bin/sluicectl" --center http://127.0.0.1:17060 "$@"; }
task_running() { ctl -o json tasks | python3 -c 'import json,sys; t=json.load(sys.stdin); sys.exit(0 if t and t[0]["running_on"] else 1)'; }
sql -e "DROP DATABASE IF EXISTS sluice_meta_demo"

# One center (its console included), one worker and the etl, all following ZooKeeper.
common_toml="[zookeeper]
connect = \"$ZOOKEEPER\"
root = \"/sluice-demo/$run_id\"
[kafka]
brokers = \"$KAFKA_BROKERS\"
[topics]
rows = \"sluice.$run_id.{db}.{table}\""
cat > "$work/center.toml" <<TOML
# A local demo over loopback without TLS: a password then goes to whoever answers at the
# address, which this allows for the demo's own host (configure source_tls instead where
# the network is not yours). Sources may name only the SOURCE_PASSWORD variable.
source_plaintext_hosts = ["$db_host"]
source_secrets = { env = ["SOURCE_PASSWORD"] }
[telemetry]
listen = "127.0.0.1:9466"
[center]
id = "demo-center"
listen = "127.0.0.1:17060"
dictionary_listen = "127.0.0.1:9467"
console_listen = "127.0.0.1:9440"
[meta]
host = "$db_host"
port = $db_port
user = "$db_user"
password = "$db_password"
database = "sluice_meta_demo"
allow_plaintext = true
[api]
auth = "token"
token_file = "$token_file"
worker_token_file = "$worker_token_file"
admin_password_file = "$admin_password_file"
$common_toml
TOML
cat > "$work/worker.toml" <<TOML
source_plaintext_hosts = ["$db_host"]
source_secrets = { env = ["SOURCE_PASSWORD"] }
[telemetry]
listen = "127.0.0.1:9464"
[worker]
id = "demo-worker"
confirm_interval = "200ms"
[center]
token_file = "$worker_token_file"
$common_toml
TOML
cat > "$work/etl.toml" <<TOML
source_plaintext_hosts = ["$db_host"]
source_secrets = { env = ["SOURCE_PASSWORD"] }
[telemetry]
listen = "127.0.0.1:9465"
[etl]
group_id = "sluice-etl-$run_id"
instance_id = "demo-etl"
linger = "50ms"
[elasticsearch]
url = "$ES_URL"
$common_toml
TOML
# The pipeline: one document per product, its brand an object, its SKUs nested.
cat > "$work/products.toml" <<TOML
name = "products"
source = "demo"
database = "shop"
table = "products"
replicas = 0
[[relations]]
name = "brand"
kind = "one_to_one"
table = "brands"
on = { brand_id = "id" }
[[relations]]
name = "skus"
kind = "one_to_many"
table = "skus"
on = { id = "product_id" }
columns = ["code", "price", "stock"]
order_by = ["price"]
TOML

say "starting sluice-center, sluice-worker and sluice-etl (logs in .work/demo/)"
SOURCE_PASSWORD="$SOURCE_PASSWORD" launch center "$bin/sluice-center" --config "$work/center.toml"
wait_for "the center to lead" 60 ctl leader
SOURCE_PASSWORD="$SOURCE_PASSWORD" launch worker "$bin/sluice-worker" --config "$work/worker.toml"
SOURCE_PASSWORD="$SOURCE_PASSWORD" launch etl "$bin/sluice-etl" --config "$work/etl.toml"

say "adding the source and the products pipeline with sluicectl"
ctl sources put demo --host "$db_host" --port "$db_port" --user "$SOURCE_USER" \
  --password-ref env:SOURCE_PASSWORD --server-id 4242 --tables 'shop.*'
ctl pipelines put products --spec "$work/products.toml"
wait_for "the worker to stream the source" 60 task_running
wait_for "the etl to follow the pipeline" 60 grep -q "etl consuming" "$work/etl.log"

say "writing 10 brands, 1000 products, 3000 SKUs"
{
  echo "INSERT INTO shop.brands VALUES"
  for b in $(seq 1 10); do sep=","; [ "$b" = 10 ] && sep=";"; echo "($b, 'brand $b')$sep"; done
  echo "INSERT INTO shop.products VALUES"
  for i in $(seq 1 1000); do
    sep=","; [ "$i" = 1000 ] && sep=";"
    echo "($i, 'product $i', $((i % 10 + 1)), '$([ $((i % 3)) = 0 ] && echo sale || echo new)', NOW(3))$sep"
  done
  echo "INSERT INTO shop.skus VALUES"
  for i in $(seq 1 1000); do
    for k in 1 2 3; do
      sep=","; [ "$i$k" = 10003 ] && sep=";"
      echo "($((i * 10 + k)), $i, 'sku-$i-$k', $((i % 97 + k)).$((k * 3))9, $((i * k % 50)))$sep"
    done
  done
} | sql
wait_for "1000 documents" 120 has_docs products 1000
echo "documents in alias products: $(doc_count products)"
show() { curl -fsS "$ES_URL/products/_doc/$1" | python3 -c 'import json,sys; print(" ", json.dumps(json.load(sys.stdin)["_source"], ensure_ascii=False))'; }
echo "product 42, with its brand and nested SKUs:"
show 42

say "live change: the price of SKU 421, timed from COMMIT to visible inside product 42's document"
start=$(date +%s%N)
price="$((start % 9000 + 1000)).42"
# The watcher polls product 42 every 5 ms on one kept-alive connection, started
# before the change so that only the pipeline is timed (not a poller's start, nor a
# coarse poll); it writes when it first saw the new price.
seen="$work/seen-at"
rm -f "$seen" "$seen.polling"
python3 - "$ES_URL" "$price" "$seen" <<'PY' &
import http.client, sys, time, urllib.parse
url, price, out = urllib.parse.urlsplit(sys.argv[1]), '"' + sys.argv[2] + '"', sys.argv[3]
conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=5)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    conn.request("GET", "/products/_doc/42")
    body = conn.getresponse().read().decode()
    open(out + ".polling", "w").close()
    if price in body:
        open(out, "w").write(str(time.time_ns()))
        sys.exit(0)
    time.sleep(0.005)
sys.exit("the live change was not visible within 30 s")
PY
watcher=$!
wait_for "the watcher to poll" 10 test -e "$seen.polling"
sql -e "UPDATE shop.skus SET price = $price WHERE id = 421"
committed=$(date +%s%N)
wait "$watcher" || { echo "the live change was not visible within 30 s; logs:"; tail -n 20 "$work"/*.log; exit 1; }
visible=$(cat "$seen")
show 42
# The client returns a moment after its COMMIT: a change seen before that counts as 0.
after=$(( (visible - committed) / 1000000 )); (( after < 0 )) && after=0
echo "visible $after ms after COMMIT"

say "deleting product 7"
sql -e "DELETE FROM shop.products WHERE id = 7"
wait_for "the delete" 30 bash -c "! curl -fsS '$ES_URL/products/_doc/7' >/dev/null 2>&1"
# Searches see it at the index's next refresh.
wait_for "999 documents" 30 has_docs products 999
echo "product 7 is gone from Elasticsearch; documents: $(doc_count products)"

say "demo done; the center, worker and etl keep running (make demo-stop stops them, make stack-down the stack)"
cat <<EOF

The console: http://127.0.0.1:9440
  log in as admin, password $(cat "$admin_password_file") (kept in .work/demo/admin.password)
  sluicectl: SLUICECTL_TOKEN=\$(cat .work/demo/admin.token) target/debug/sluicectl --center http://127.0.0.1:17060 pipelines list
EOF
