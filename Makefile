# ----- local stack of real services (deploy/stack.sh) -------------------------------
# MariaDB :13306, Oracle MySQL :13307, ZooKeeper :12181, Apache Kafka :19092, OpenSearch
# :19200, Elasticsearch :19201, state in .work/stack/. Set MARIADB_URL / MYSQL_URL /
# ZOOKEEPER / KAFKA_BROKERS / ES_URL / ELASTICSEARCH_URL to use external services.
.PHONY: install stack-up stack-down stack-clean stack-status

install:
	deploy/install.sh

stack-up: install
	deploy/stack.sh up

stack-down:
	deploy/stack.sh down

stack-clean:
	deploy/stack.sh clean

stack-status:
	deploy/stack.sh status
# ----- end local stack --------------------------------------------------------------

# ----- benchmark (integration-tests/src/bin/bench.rs) --------------------------------
# Release builds of the services and the bench; sizes: BENCH_ROWS, BENCH_WORKER_EVENTS, BENCH_BIG_TXN_ROWS,
# BENCH_LATENCY_SAMPLES, BENCH_LOADED_SAMPLES (the latency under load, at BENCH_LOADED_RATE).
.PHONY: bench

# Then snapshot throughput of a build (integration-tests/src/bin/snapshot_bench.rs):
# BENCH_SNAPSHOT_ROWS, BENCH_SNAPSHOT_E2E_ROWS, BENCH_BUILD_PRODUCTS, BENCH_CHUNK_ROWS; then documents built from
# several tables (integration-tests/src/bin/tree_bench.rs): BENCH_TREES, BENCH_TREE_PRODUCTS,
# BENCH_TREE_BRAND, BENCH_TREE_LATENCY_SAMPLES/_RATE, BENCH_TREE_AREA_UPDATES=0 (whole writes, to compare); then the worker against Debezium's MySQL
# connector on the same binlog (integration-tests/src/bin/peer_bench.rs; Debezium is installed
# from Maven Central on first use by integration-tests/debezium/run.sh): BENCH_PEER_EVENTS.
# Each runs on every source of BENCH_SOURCES (default: mariadb mysql): figures in
# target/bench/<bench>-<source>.json.
bench: stack-up
	cargo build --release --bins -p sluice-worker -p sluice-etl -p sluice-center -p sluicectl -p sluice-integration-tests
	for source in $${BENCH_SOURCES:-mariadb mysql}; do \
	  for b in bench snapshot_bench tree_bench peer_bench; do \
	    BENCH_SOURCE=$$source SLUICE_BIN_DIR=$${CARGO_TARGET_DIR:-target}/release \
	      $${CARGO_TARGET_DIR:-target}/release/$$b || exit 1; \
	  done; \
	done

# ----- images (deploy/images.sh) ---------------------------------------------------------
# The four images (sluice-center, sluice-worker, sluice-etl, sluicectl) built with podman
# from the Dockerfile on a Debian base made by debootstrap (no registry needed), from the
# ship profile's stripped binaries, tagged with the workspace's version. To push one:
#   podman push localhost/sluice-center:0.1.0 REGISTRY/sluice-center:0.1.0
.PHONY: images
images:
	cargo build --profile ship --bins -p sluice-center -p sluice-worker -p sluice-etl -p sluicectl
	deploy/images.sh $${CARGO_TARGET_DIR:-target}/ship

# ----- scale (integration-tests/src/bin/scale_bench.rs) ------------------------------
# 200 sources on 20 workers and 2 centers, the sources on 4 MySQL servers of the bench's
# own: registration, the leader's reconcile pass (p99 < 100 ms) and its ZooKeeper writes
# (none while nothing changes, a few for one source added), a worker killed (its tasks
# run elsewhere within the session timeout + 2 s, no other moves), the leader restarted
# (no task moves). SCALE_SOURCES, SCALE_WORKERS, SCALE_CENTERS, SCALE_SERVERS,
# SCALE_STEADY_PASSES, SCALE_RESYNC; BENCH_SOURCE (mariadb or mysql); SCALE_PROFILE (debug,
# the default, or release: which build of the services runs). Figures in
# target/bench/scale-<source>.json. Not part of `make test`.
.PHONY: scale
SCALE_PROFILE ?= debug
scale: stack-up
	cargo build $(if $(filter release,$(SCALE_PROFILE)),--release) --bins -p sluice-worker -p sluice-center -p sluicectl -p sluice-integration-tests
	BENCH_SOURCE=$${BENCH_SOURCE:-mariadb} SLUICE_BIN_DIR=$${CARGO_TARGET_DIR:-target}/$(SCALE_PROFILE) \
	  $${CARGO_TARGET_DIR:-target}/$(SCALE_PROFILE)/scale_bench

# ----- chaos soak (integration-tests/src/soak.rs) ------------------------------------
# A write load on several tables while faults are injected at random, then the checker,
# on each source of SOAK_SOURCES (default: mariadb mysql, one after the other):
# SOAK_MINUTES (default 10), SOAK_TABLES, SOAK_ROWS, SOAK_TPS, SOAK_FAULT_EVERY, SOAK_SEED.
.PHONY: soak
soak: stack-up
	cargo build --bins
	for source in $${SOAK_SOURCES:-mariadb mysql}; do \
	  SOAK_SOURCE=$$source $${CARGO_TARGET_DIR:-target}/debug/soak || exit 1; \
	done

# ----- build, test, demo -------------------------------------------------------------
.PHONY: build test lint demo demo-stop cluster cluster-stop

build:
	cargo build --bins

# Every test: formatting, lints, unit tests and the end-to-end tests on the real stack
# (OpenSearch the sink), then the Elasticsearch lane: the sink client's own tests and the
# end-to-end tests of ES_LANE again, with Elasticsearch the sink; then the secured lane:
# the cluster tests of SECURED again through Kafka's SASL_SSL listener (SCRAM) and the
# OpenSearch with its security plugin (TLS, least-privilege users for the etl and centers).
# Elasticsearch 7.17 from Maven Central runs no scripts (its Painless module is not
# published there): there, trees are written whole. The Painless lane runs documents
# written in parts (area updates) on Elasticsearch 7.10.2, the newest whose Painless
# module Maven Central serves: the sink's script tests, the relations and retention tests.
PAINLESS_LANE = (binary(server) & test(/^the_sink_runs_scripts/)) | (binary(e2e) & test(/^(relations|retention)::/))
ES_LANE = (binary(server) & !test(the_sink_runs_scripts)) | (test(/^(dml::|relations::a_shop_tree|relations_cluster::parent_child|cluster_build::a_build_under_load|replay::)/) & test(/::mariadb$$/))
SECURED = test(/^(cluster_build::a_build_under_load_and_a_worker_kill_swaps_to_a_complete_index::mariadb$$|dead_letter::dead_letters_are_listed|consistency::a_check_finds_exactly_what_was_corrupted_and_repair_puts_it_right::mariadb$$|cluster_admin::sources_and_pipelines_added_at_runtime)/)
test: stack-up
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo build --bins
	# The images of the debug binaries, for the test that runs the services as containers;
	# containers a killed run of it left behind go.
	deploy/images.sh $${CARGO_TARGET_DIR:-target}/debug it
	CONTAINERS_CONF=$${SLUICE_IMAGE_CACHE:-/var/cache/sluice-images}/containers.conf \
	  podman --runtime runc --cgroup-manager=cgroupfs rm --force --filter label=sluice-it >/dev/null
	# Debezium's connectors (the Debezium-input tests' producer), once, before tests run at once.
	integration-tests/debezium/run.sh install mysql
	integration-tests/debezium/run.sh install mariadb
	cargo nextest run --workspace
	ES_URL=$${ELASTICSEARCH_URL:-http://127.0.0.1:19201} cargo nextest run --workspace -E '$(ES_LANE)'
	ES_URL=$${PAINLESS_ES_URL:-http://127.0.0.1:19203} cargo nextest run --workspace -E '$(PAINLESS_LANE)'
	SECURED_LANE=1 cargo nextest run --workspace -E '$(SECURED)'

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

# The main job on the local stack with sample data: see deploy/demo.sh. It compiles the
# services and sluicectl while the servers it needs are installed and started (their output
# is shown once both are done), so a fresh machine waits for the longer of the two.
DEMO_SERVICES = $(if $(filter mariadb,$(DEMO_SOURCE)),mariadb,mysql) zookeeper kafka opensearch
demo:
	deploy/install.sh packages
	mkdir -p .work
	{ deploy/install.sh demo && deploy/stack.sh up $(DEMO_SERVICES); } >.work/demo-stack.log 2>&1 & \
	  stack=$$!; cargo build -p sluice-worker -p sluice-etl -p sluice-center -p sluicectl; built=$$?; \
	  wait $$stack; up=$$?; cat .work/demo-stack.log; [ $$built = 0 ] && [ $$up = 0 ]
	deploy/demo.sh

demo-stop:
	deploy/demo.sh stop

# A local cluster (3 centers, 3 workers, etl) driven by sluicectl: see deploy/cluster.sh.
cluster: stack-up build
	deploy/cluster.sh

cluster-stop:
	deploy/cluster.sh stop
