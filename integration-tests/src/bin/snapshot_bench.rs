//! `make bench` (second part): snapshot throughput of a build, on a local cluster (one
//! center, three workers, one etl) over the local stack.
//!
//! 1. MySQL → Kafka by the workers alone: a table of `BENCH_SNAPSHOT_ROWS` (default
//!    1,000,000) rows is built with the etl stopped (SIGSTOP, once it confirmed it writes
//!    to the new version; its session then expires and the build goes on without it), so
//!    nothing competes with the workers; timed from the build's start until every chunk
//!    is done. Its messages are then read back from the build's topic and written again
//!    by a raw producer (as many as the workers, with their producer settings, the same
//!    keys and partitions) into a scratch topic: the snapshot is to reach 0.8 of that
//!    pace. The build is then reset.
//! 2. End to end into Elasticsearch: a table of `BENCH_SNAPSHOT_E2E_ROWS` (default
//!    50,000) is built with
//!    the etl running, once the etl applies the pipeline (a streamed row is indexed; the
//!    time the etl took to take the new partitions is printed apart), timed until the alias
//!    moved to the new version — next to the raw `_bulk` ceiling of the same server for as
//!    many similar documents, with the etl's batch size and requests in flight, into an
//!    index of the same mapping and shards without refreshes (as a build writes). The
//!    ceiling is taken before and after the build and the mean is used: the server's pace
//!    drifts as its memory fills, which favoured whichever ran second. The build's seconds,
//!    `pipelines build` until the alias answers with every row, are also held against a
//!    sequential raw client (one request at a time, the etl's batch size), taken the same
//!    way: at most 15 % more.
//!
//! 3. A tree built: the sample shop (`sluice_integration_tests::shop`) with
//!    `BENCH_BUILD_PRODUCTS` products (default 20,000; about 14 rows each) in a pipeline of
//!    its own, built with the etl running (once it applies the pipeline), timed until the
//!    alias moved, next to the raw `_bulk` ceiling of the same documents (read back from
//!    the new version) into a scratch index of its shape: target 0.8 of it.
//!
//! The figures go to `target/bench/snapshot-<source>.json` (`BENCH_SOURCE`) and are
//! compared with the baseline.
//!
//! `BENCH_CHUNK_ROWS` (default 20000) sets the chunk size.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{json, Map, Value};
use sluice_elastic::BulkOp;
use sluice_integration_tests::ceiling::{
    bulk_ceiling_in_flight, documents, raw_concurrency, scratch_like,
};
use sluice_integration_tests::cpu::CpuSeconds;
use sluice_integration_tests::figures::{self, Figure, Figures};
use sluice_integration_tests::{env_num, shop, Cluster, TestCtx};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if let Err(e) = sluice_integration_tests::lane::Lane::enter_from_env("BENCH_SOURCE") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let ctx = TestCtx::new("snapbench").await;
    let outcome = run(&ctx).await;
    println!("cleanup: {}", ctx.cleanup().await);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("snapshot bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn fill(ctx: &TestCtx, table: &str, rows: u64) -> anyhow::Result<Duration> {
    ctx.exec(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, k INT, c VARCHAR(120), pad VARCHAR(60), ts DATETIME(6))"
    ))
    .await;
    let started = Instant::now();
    // The server generates the rows.
    let mut from = 1;
    while from <= rows {
        let to = (from + 99_999).min(rows);
        ctx.exec(&format!(
            "INSERT INTO {table} SELECT seq, seq % 100000, CONCAT('row ', seq, ' ', REPEAT('c', 60)), \
             REPEAT('p', 50), NOW(6) FROM {}",
            sluice_integration_tests::seq(from, to)
        ))
        .await;
        from = to + 1;
    }
    Ok(started.elapsed())
}

/// Polls `alias`'s status until `done` holds, printing each phase it sees with the time
/// since `started` (the build's start).
async fn wait_phase(
    cluster: &Cluster,
    alias: &str,
    started: Instant,
    done: impl Fn(&Value) -> bool,
    within: Duration,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + within;
    let mut phase = Value::Null;
    loop {
        let s = cluster
            .ctl(&["pipelines", "status", alias])
            .map_err(anyhow::Error::msg)?;
        if s["phase"] != phase {
            phase = s["phase"].clone();
            println!(
                "    {:>6.1} s  phase {phase}, {} rows done",
                started.elapsed().as_secs_f64(),
                s["rows_done"]
            );
        }
        if done(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("build of {alias} did not get there within {within:?}: {s}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // a poll pace
    }
}

async fn run(ctx: &TestCtx) -> anyhow::Result<()> {
    ctx.warm_up().await?;
    let rows = env_num::<u64>("BENCH_SNAPSHOT_ROWS", 1_000_000)?;
    let e2e_rows = env_num::<u64>("BENCH_SNAPSHOT_E2E_ROWS", 50_000)?;
    let chunk = env_num::<u64>("BENCH_CHUNK_ROWS", 20_000)?.to_string();
    let mut cluster = ctx.start_cluster(1, WORKERS).await;
    let workers = workers_alone(ctx, &mut cluster, rows, &chunk).await?;
    let e2e = end_to_end(ctx, &cluster, e2e_rows, &chunk).await?;
    let products = env_num::<u64>("BENCH_BUILD_PRODUCTS", 20_000)?;
    let tree = tree_build(ctx, &cluster, products, &chunk).await?;
    let mut figures = Figures::from([
        (
            "workers_rows_per_s".to_owned(),
            Figure::higher(
                workers.rate,
                "rows/s",
                Some(PRODUCER_SHARE * workers.raw_rate),
            ),
        ),
        (
            "raw_producer_messages_per_s".to_owned(),
            Figure::higher(workers.raw_rate, "messages/s", None),
        ),
        (
            "build_docs_per_s".to_owned(),
            Figure::higher(e2e.rate, "docs/s", Some(e2e.raw_rate)),
        ),
        (
            "build_s".to_owned(),
            Figure::lower(
                e2e.took.as_secs_f64(),
                "s",
                Some(SEQUENTIAL_SHARE * e2e.sequential.as_secs_f64()),
            ),
        ),
        (
            "tree_build_docs_per_s".to_owned(),
            Figure::higher(tree.rate, "docs/s", Some(TREE_SHARE * tree.raw_rate)),
        ),
        (
            "tree_raw_bulk_docs_per_s".to_owned(),
            Figure::higher(tree.raw_rate, "docs/s", None),
        ),
        (
            "new_pipeline_first_row_s".to_owned(),
            Figure::lower(e2e.joined.as_secs_f64(), "s", None),
        ),
    ]);
    let bounds = [
        (
            "workers_rows_per_s_on_full_cores",
            workers.on_full_cores,
            "rows/s",
            PRODUCER_SHARE * workers.raw_rate,
        ),
        (
            "build_docs_per_s_on_full_cores",
            e2e.on_full_cores,
            "docs/s",
            e2e.target_rate,
        ),
        (
            "tree_build_docs_per_s_on_full_cores",
            tree.on_full_cores,
            "docs/s",
            TREE_SHARE * tree.raw_rate,
        ),
    ];
    for (name, full, unit, target) in bounds {
        if let Some(full) = full {
            figures.insert(name.to_owned(), Figure::higher(full, unit, Some(target)));
        }
    }
    figures::report("snapshot", &figures);
    drop(cluster);
    Ok(())
}

/// The workers of the bench's cluster.
const WORKERS: usize = 3;

/// Part 1: a build of `rows` rows by the workers alone (the etl stopped once it confirmed
/// it writes to the new version); their rate in rows/s, and a raw producer's of the same
/// messages. Leaves nothing of it behind.
async fn workers_alone(
    ctx: &TestCtx,
    cluster: &mut Cluster,
    rows: u64,
    chunk: &str,
) -> anyhow::Result<WorkersAlone> {
    let filled = fill(ctx, "big", rows).await?;
    println!(
        "[snapshot 1/4] table big: {rows} rows written in {:.1} s",
        filled.as_secs_f64()
    );
    let big = ctx.add_source(cluster, "big", 1).await;
    cluster.wait_running(&[&big], Duration::from_secs(60)).await;
    let alias = big.pipeline.alias.clone();
    cluster
        .ctl(&["pipelines", "build", &alias, "--chunk-rows", chunk])
        .map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    let cpu = CpuSeconds::now();
    wait_phase(
        cluster,
        &alias,
        started,
        |s| s["phase"] != "waiting for etl",
        Duration::from_secs(60),
    )
    .await?;
    cluster.etl.signal("STOP");
    let s = wait_phase(
        cluster,
        &alias,
        started,
        |s| s["phase"] == "catching up" || s["phase"] == "swap",
        Duration::from_secs(3600),
    )
    .await?;
    let took = started.elapsed();
    let cpu = CpuSeconds::now().since(&cpu);
    let done = s["rows_done"].as_u64().unwrap_or(0);
    let rate = done as f64 / took.as_secs_f64();
    println!(
        "[snapshot 2/4] MySQL→Kafka by {WORKERS} workers alone: {} rows in {} chunks in {:.1} s = {rate:.0} rows/s",
        s["rows_done"],
        s["chunks"],
        took.as_secs_f64(),
    );
    say_cpu("2/4", "of the workers' snapshot", &cpu);
    let raw_rate = producer_ceiling(ctx, &alias, done).await?;
    println!(
        "[snapshot 2/4] the workers ran at {:.0} % of the raw producer (target: {:.0} %)",
        100.0 * rate / raw_rate,
        100.0 * PRODUCER_SHARE
    );
    let target = PRODUCER_SHARE * raw_rate;
    let on_full_cores = say_bound("2/4", &cpu, done as f64, rate, target, "rows/s");
    for args in [
        ["pipelines", "reset", &alias],
        ["pipelines", "delete", &alias],
        ["sources", "delete", &big.name],
    ] {
        cluster.ctl(&args).map_err(anyhow::Error::msg)?;
    }
    cluster.etl.signal("CONT");
    ctx.exec("DROP TABLE big").await;
    Ok(WorkersAlone {
        rate,
        raw_rate,
        on_full_cores,
    })
}

/// What part 1 measured: the workers' snapshot rows a second, and a raw producer's.
struct WorkersAlone {
    rate: f64,
    raw_rate: f64,
    /// The rate with every core busy at the same CPU per row.
    on_full_cores: Option<f64>,
}

/// The share of a raw producer's pace a snapshot into Kafka is to reach.
const PRODUCER_SHARE: f64 = 0.8;

/// The raw producer's ceiling of the build's own messages (at least `rows`, read back
/// from its topic): as many producers as workers, the workers' producer settings, into a
/// scratch topic of the same partitions; its messages a second.
async fn producer_ceiling(ctx: &TestCtx, pipeline: &str, rows: u64) -> anyhow::Result<f64> {
    let topic = sluice_kafka::TopicConfig::default().build_topic(pipeline);
    let records = ctx
        .read_topic(&topic, rows as usize, Duration::from_secs(600))
        .await;
    let bytes: usize = records.iter().map(|r| r.key.len() + r.payload.len()).sum();
    let cpu = CpuSeconds::now();
    let took = ctx
        .producer_ceiling(&records, &format!("{topic}_raw"), WORKERS)
        .await?;
    let raw_rate = records.len() as f64 / took.as_secs_f64();
    println!(
        "[snapshot 2/4] raw producer ceiling of the same broker: the build's {} messages ({:.0} MB) by {WORKERS} producers in {:.1} s = {raw_rate:.0} messages/s",
        records.len(),
        bytes as f64 / 1e6,
        took.as_secs_f64()
    );
    say_cpu("2/4", "of the raw producer", &CpuSeconds::now().since(&cpu));
    Ok(raw_rate)
}

/// The share of the raw `_bulk` ceiling a tree's build is to reach.
const TREE_SHARE: f64 = 0.8;

/// How much longer than a sequential raw `_bulk` client a build may take.
const SEQUENTIAL_SHARE: f64 = 1.15;

/// What part 2 measured.
struct EndToEnd {
    /// The new pipeline's first streamed row, insert to indexed.
    joined: Duration,
    /// `pipelines build` until the alias answers with every row.
    took: Duration,
    /// Documents a second, `pipelines build` to the alias moved.
    rate: f64,
    /// The raw `_bulk` ceiling's documents a second.
    raw_rate: f64,
    /// How long a sequential raw `_bulk` client took for as many documents.
    sequential: Duration,
    /// The build's documents a second with every core busy at the same CPU per document
    /// (its fixed waits, between phases, not counted out).
    on_full_cores: Option<f64>,
    /// The rate that meets the target: within [`SEQUENTIAL_SHARE`] of the sequential
    /// client.
    target_rate: f64,
}

/// Part 2: a build of `rows` rows with the etl running, next to the raw ceiling taken
/// before and after it.
async fn end_to_end(
    ctx: &TestCtx,
    cluster: &Cluster,
    rows: u64,
    chunk: &str,
) -> anyhow::Result<EndToEnd> {
    fill(ctx, "mid", rows).await?;
    let mid = ctx.add_source(cluster, "mid", 2).await;
    cluster.wait_running(&[&mid], Duration::from_secs(60)).await;
    let alias = mid.pipeline.alias.clone();
    let joined = first_streamed_row(ctx, "mid", &alias, rows + 1).await?;
    let rows = rows + 1;
    let es = &ctx.stack.es;
    let before = raw_ceiling(es, &alias, "before", rows, raw_concurrency()).await?;
    let cpu = CpuSeconds::now();
    let sequential_before = raw_ceiling(es, &alias, "before", rows, 1).await?;
    say_cpu(
        "3/4",
        "of the sequential raw client",
        &CpuSeconds::now().since(&cpu),
    );
    let bulks_before = EtlBulks::read(cluster).await;
    let (took, new, cpu) = timed_build(cluster, es, &alias, &alias, chunk, "3/4").await?;
    let docs = es.count(&alias).await?;
    let rate = docs as f64 / took.as_secs_f64();
    println!(
        "[snapshot 3/4] end to end into Elasticsearch: {docs} documents ({new}) live {:.1} s after the build started = {rate:.0} docs/s",
        took.as_secs_f64()
    );
    let bulks = EtlBulks::read(cluster).await.since(&bulks_before);
    let count = bulks.count.max(1.0);
    println!(
        "[snapshot 3/4] the etl wrote them in {count} bulks of {:.0} documents, {:.2} s each, on average",
        bulks.documents / count,
        bulks.seconds / count
    );
    if docs != rows {
        bail!("the alias holds {docs} documents, the table {rows} rows");
    }
    // The ceiling, on both sides of the build: the server's pace drifts as its memory
    // fills, so the build is compared with the mean of the two.
    let raw = (before + raw_ceiling(es, &alias, "after", rows, raw_concurrency()).await?) / 2;
    let sequential = (sequential_before + raw_ceiling(es, &alias, "after", rows, 1).await?) / 2;
    let raw_rate = rows as f64 / raw.as_secs_f64();
    println!(
        "[snapshot 3/4] raw _bulk ceiling of the same Elasticsearch ({}), mean of before and after: {rows} docs in {:.1} s = {raw_rate:.0} docs/s; the build ran at {:.0} % of it",
        sluice_integration_tests::ceiling::describe(),
        raw.as_secs_f64(),
        100.0 * rate / raw_rate
    );
    println!(
        "[snapshot 3/4] a sequential raw _bulk client (one request at a time), mean of before and after: {rows} docs in {:.1} s; the build took {:.2}× as long (target: at most {SEQUENTIAL_SHARE})",
        sequential.as_secs_f64(),
        took.as_secs_f64() / sequential.as_secs_f64()
    );
    let target = rows as f64 / (SEQUENTIAL_SHARE * sequential.as_secs_f64());
    let on_full_cores = say_bound("3/4", &cpu, docs as f64, rate, target, "docs/s");
    Ok(EndToEnd {
        joined,
        took,
        rate,
        raw_rate,
        sequential,
        on_full_cores,
        target_rate: target,
    })
}

/// Builds `pipeline` (whose alias is `alias`) in chunks of `chunk` rows: how long from
/// `pipelines build` until the alias answers from the new version, that version's index,
/// and where the CPU went meanwhile (printed with its phases).
async fn timed_build(
    cluster: &Cluster,
    es: &sluice_elastic::EsClient,
    pipeline: &str,
    alias: &str,
    chunk: &str,
    part: &str,
) -> anyhow::Result<(Duration, String, CpuSeconds)> {
    let cpu = CpuSeconds::now();
    let started = Instant::now();
    let built = cluster
        .ctl(&["pipelines", "build", pipeline, "--chunk-rows", chunk])
        .map_err(anyhow::Error::msg)?;
    let version = built["version"].as_u64().unwrap_or(0) as u32;
    let new = sluice_elastic::versioned_index(alias, version);
    let moved = tokio::spawn(alias_moves(es.clone(), alias.to_owned(), new.clone()));
    wait_phase(
        cluster,
        pipeline,
        started,
        |s| s["phase"] == "done",
        Duration::from_secs(3600),
    )
    .await?;
    let took = moved.await?? - started;
    let cpu = CpuSeconds::now().since(&cpu);
    say_cpu(part, "of the build", &cpu);
    Ok((took, new, cpu))
}

/// When `alias` points at `new` alone (the center refreshed it before the move, so it
/// answers with every document), looked at every 20 ms.
async fn alias_moves(
    es: sluice_elastic::EsClient,
    alias: String,
    new: String,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        if es.alias_targets(&alias).await? == [new.as_str()] {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{alias} did not move to {new} within an hour");
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // a poll pace
    }
}

/// A build rebuilds a pipeline the etl already applies: one row (`id`) streamed into
/// `table` shows it does. How long it took from its insert to `alias` (the etl taking a
/// new pipeline's partitions).
async fn first_streamed_row(
    ctx: &TestCtx,
    table: &str,
    alias: &str,
    id: u64,
) -> anyhow::Result<Duration> {
    let added = Instant::now();
    ctx.exec(&format!(
        "INSERT INTO {table} VALUES ({id}, 0, 'streamed', 'p', NOW(6))"
    ))
    .await;
    let es = &ctx.stack.es;
    let joined = loop {
        let _ = es.refresh(alias).await;
        if es.count(alias).await.unwrap_or(0) >= 1 {
            break added.elapsed();
        }
        if added.elapsed() > Duration::from_secs(120) {
            bail!("the etl did not index a streamed row of the new pipeline within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // a poll pace
    };
    println!(
        "[snapshot 3/4] the new pipeline's first streamed row indexed {:.1} s after its insert (the etl took its partitions, no rebalance)",
        joined.as_secs_f64()
    );
    Ok(joined)
}

/// Prints what keeps `rate` (of `items` over `cpu`'s interval) from `target`, and returns
/// the rate on full cores (see [`CpuSeconds::bound`]).
fn say_bound(
    part: &str,
    cpu: &CpuSeconds,
    items: f64,
    rate: f64,
    target: f64,
    unit: &str,
) -> Option<f64> {
    let (full, line) = cpu.bound(items, rate, target, unit)?;
    println!("[snapshot {part}] what bounds it: {line}");
    Some(full)
}

/// Prints where the CPU went during `what` (see [`CpuSeconds::describe_on_cores`]).
fn say_cpu(part: &str, what: &str, used: &CpuSeconds) {
    println!("[snapshot {part}] CPU {what}: {}", used.describe_on_cores());
}

/// The etl's bulks, by its metrics.
struct EtlBulks {
    count: f64,
    documents: f64,
    seconds: f64,
}

impl EtlBulks {
    /// The bulks so far.
    async fn read(cluster: &Cluster) -> EtlBulks {
        let metric = |name| cluster.etl.metric(name, &[]);
        EtlBulks {
            count: metric("sluice_etl_bulk_documents_count").await,
            documents: metric("sluice_etl_bulk_documents_sum").await,
            seconds: metric("sluice_etl_bulk_duration_seconds_sum").await,
        }
    }

    /// The bulks since `before`.
    fn since(&self, before: &EtlBulks) -> EtlBulks {
        EtlBulks {
            count: self.count - before.count,
            documents: self.documents - before.documents,
            seconds: self.seconds - before.seconds,
        }
    }
}

/// How long a raw `_bulk` client with `in_flight` requests at once takes to index `rows`
/// documents like the bench table's into a scratch index of the shape of `alias`'s (its
/// mapping and shards; no replicas or refreshes, as a build writes).
async fn raw_ceiling(
    es: &sluice_elastic::EsClient,
    alias: &str,
    when: &str,
    rows: u64,
    in_flight: usize,
) -> anyhow::Result<Duration> {
    let index = format!("{alias}_raw_{when}_{in_flight}");
    scratch_like(es, alias, &index).await?;
    let ops: Vec<BulkOp> = (1..=rows)
        .map(|id| {
            let mut doc = Map::new();
            doc.insert("id".into(), id.into());
            doc.insert("k".into(), (id % 100_000).into());
            doc.insert("c".into(), format!("row {id} {}", "c".repeat(60)).into());
            doc.insert("pad".into(), "p".repeat(50).into());
            doc.insert("ts".into(), "2026-11-22T00:00:00.000000".into());
            BulkOp::Index {
                index: index.clone(),
                id: id.to_string(),
                version: id,
                routing: None,
                doc: Value::Object(doc),
            }
        })
        .collect();
    let took = bulk_ceiling_in_flight(es, &index, &ops, in_flight).await?;
    println!(
        "[snapshot 3/4] raw _bulk ceiling {when} the build, {in_flight} in flight: {rows} docs in {:.1} s = {:.0} docs/s",
        took.as_secs_f64(),
        rows as f64 / took.as_secs_f64()
    );
    Ok(took)
}

/// What part 3 measured: a tree's build, documents a second, and the raw ceiling's.
struct TreeBuild {
    rate: f64,
    raw_rate: f64,
    /// The rate with every core busy at the same CPU per document.
    on_full_cores: Option<f64>,
}

/// Part 3: the shop's tree of `products` products built with the etl running, next to the
/// raw `_bulk` ceiling of the documents it built.
async fn tree_build(
    ctx: &TestCtx,
    cluster: &Cluster,
    products: u64,
    chunk: &str,
) -> anyhow::Result<TreeBuild> {
    let filled = Instant::now();
    shop::schema(ctx).await;
    shop::data(ctx, products, products / 2).await;
    let rows: u64 = shop::rows(products).iter().map(|(_, n)| n).sum();
    println!(
        "[snapshot 4/4] the shop: {products} products, {rows} rows, written in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let source = ctx.put_source(cluster, "products", 3);
    let mut spec = shop::spec(ctx);
    spec["source"] = json!(source.name);
    for (table, _) in shop::rows(products) {
        let topic = sluice_kafka::TopicConfig::default().rows_topic(&source.name, &ctx.db, table);
        ctx.clean_up_topic(topic);
    }
    let (Some(name), Some(alias)) = (spec["name"].as_str(), spec["alias"].as_str()) else {
        bail!("the shop's spec names no pipeline: {spec}");
    };
    let (name, alias) = (name.to_owned(), alias.to_owned());
    let path = ctx.dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    let file = path.to_string_lossy();
    cluster
        .ctl(&["pipelines", "put", &name, "--spec", &file])
        .map_err(anyhow::Error::msg)?;
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    // One product streamed shows the etl applies the pipeline.
    let streamed = products + 1;
    ctx.exec(&format!(
        "INSERT INTO products VALUES ({streamed}, 'streamed', 1, 1.00, 0)"
    ))
    .await;
    let es = &ctx.stack.es;
    let joined = Instant::now();
    let id = [streamed.to_string()];
    while !matches!(es.mget(&alias, &id).await.as_deref(), Ok([Some(_)])) {
        if joined.elapsed() > Duration::from_secs(120) {
            bail!("the etl did not index a streamed product of the tree within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // a poll pace
    }
    let (took, new, build_cpu) = timed_build(cluster, es, &name, &alias, chunk, "4/4").await?;
    let docs = es.count(&alias).await?;
    let rate = docs as f64 / took.as_secs_f64();
    println!(
        "[snapshot 4/4] the tree built: {docs} documents live {:.1} s after the build started = {rate:.0} docs/s",
        took.as_secs_f64()
    );
    if docs != products + 1 {
        bail!(
            "the alias holds {docs} documents, the shop {} products",
            products + 1
        );
    }
    let scratch = format!("{alias}_raw");
    scratch_like(es, &new, &scratch).await?;
    let ops: Vec<BulkOp> = documents(es, &alias, "id")
        .await?
        .into_iter()
        .map(|(id, doc)| BulkOp::Index {
            index: scratch.clone(),
            id,
            version: 1,
            routing: None,
            doc,
        })
        .collect();
    let cpu = CpuSeconds::now();
    let raw = bulk_ceiling_in_flight(es, &scratch, &ops, raw_concurrency()).await?;
    let cpu = CpuSeconds::now().since(&cpu);
    say_cpu("4/4", "of the raw client", &cpu);
    println!(
        "[snapshot 4/4] the sink's CPU per document: {} for the build's, {} for the raw client's",
        build_cpu.sink_per_item(docs as f64),
        cpu.sink_per_item(docs as f64)
    );
    let raw_rate = docs as f64 / raw.as_secs_f64();
    println!(
        "[snapshot 4/4] raw _bulk ceiling of the same documents ({}): {:.1} s = {raw_rate:.0} docs/s; the build ran at {:.0} % of it (target: {:.0} %)",
        sluice_integration_tests::ceiling::describe(),
        raw.as_secs_f64(),
        100.0 * rate / raw_rate,
        100.0 * TREE_SHARE
    );
    let target = TREE_SHARE * raw_rate;
    let on_full_cores = say_bound("4/4", &build_cpu, docs as f64, rate, target, "docs/s");
    Ok(TreeBuild {
        rate,
        raw_rate,
        on_full_cores,
    })
}
