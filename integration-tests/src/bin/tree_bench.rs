//! `make bench` (third part): documents built from several tables, for two trees of
//! different shapes (`BENCH_TREES`, default both): the sample shop
//! (`sluice_integration_tests::shop`: products → brand, SKUs → prices, 5 newest tags) and
//! the blog (`sluice_integration_tests::blog`: articles → author, comments → commenter,
//! tags many-to-many through a link table).
//!
//! 1. Streaming rebuilds: the tree's rows (`BENCH_TREE_PRODUCTS` roots, default 5000,
//!    7 to 14 rows each, loaded table by table) are streamed into Kafka with the etl
//!    stopped; an etl is then timed until its group committed every topic. Printed: the
//!    documents made current per second (each document once, whether written whole or
//!    patched), how many times each was read back from MySQL (target: at most 1.5), the
//!    MySQL queries per document read and the rows they returned per row event.
//! 2. The ceiling: the index's final documents `_bulk`-indexed straight into a scratch
//!    index of the same server (the etl's batch size and requests in flight), then again
//!    with newer versions (a rebuild replaces a document that exists); the documents'
//!    rate as a share of the second (target: 0.8).
//! 3. A lookup row under `BENCH_TREE_BRAND` documents (default 2000) renamed five times
//!    (the shop's brand; the blog's tag, two levels down through the link table): the
//!    median seconds from COMMIT until every one of them shows the new name, against the
//!    target of one second, and the MySQL queries and rows read for it.
//! 4. A change deep in the tree (the shop: a SKU's price; the blog: a comment's text) in
//!    single-row transactions at `BENCH_TREE_LATENCY_RATE` a second (default 1,000),
//!    `BENCH_TREE_LATENCY_SAMPLES` times (5,000), each on a random root: commit to
//!    searchable (a real-time GET of the root's document shows it), p99 against 100 ms,
//!    and the MySQL queries and rows read per change (written in parts, one relation's
//!    rows and the walk up to the root; whole, the entire document); then the sink's own floor at the rate reached: one writer replacing as many of the
//!    index's documents, a bulk every 100 ms, with nothing else running (each bulk's
//!    answer time, p99 against the same 100 ms).
//!
//! The figures go to `target/bench/tree-<source>.json` and `tree-blog-<source>.json`
//! (`BENCH_SOURCE`), judged against the committed baseline. `BENCH_TREE_READ_CONCURRENCY`
//! sets the etl's `read_concurrency` (default: the etl's own); `BENCH_TREE_AREA_UPDATES=0`
//! writes the documents whole (the spec's `area_updates = false`), to compare.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use mysql_async::prelude::*;
use serde_json::{json, Value};
use sluice_elastic::BulkOp;
use sluice_integration_tests::ceiling::{bulk_all, bulk_ceiling, documents, scratch_like};
use sluice_integration_tests::cpu::CpuSeconds;
use sluice_integration_tests::figures::{self, Figure, Figures};
use sluice_integration_tests::probe::{Check, Latency, Probe};
use sluice_integration_tests::{blog, env_num, kafka, shop, stages, TestCtx};
use tokio::sync::mpsc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if let Err(e) = sluice_integration_tests::lane::Lane::enter_from_env("BENCH_SOURCE") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let trees = std::env::var("BENCH_TREES").unwrap_or_else(|_| "shop blog".into());
    for name in trees.split_whitespace() {
        let Some(tree) = Tree::named(name) else {
            eprintln!("BENCH_TREES: `{name}` is not a tree (shop, blog)");
            return ExitCode::from(2);
        };
        let ctx = TestCtx::new(&format!("{name}bench")).await;
        let outcome = run(&ctx, tree).await;
        println!("cleanup: {}", ctx.cleanup().await);
        if let Err(e) = outcome {
            eprintln!("tree bench ({name}) failed: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// A tree the bench runs.
#[derive(Clone, Copy)]
enum Tree {
    Shop,
    Blog,
}

impl Tree {
    fn named(name: &str) -> Option<Tree> {
        match name {
            "shop" => Some(Tree::Shop),
            "blog" => Some(Tree::Blog),
            _ => None,
        }
    }

    /// Its figures' benchmark name (the shop's kept from before the blog came).
    fn bench(self) -> &'static str {
        match self {
            Tree::Shop => "tree",
            Tree::Blog => "tree-blog",
        }
    }

    /// What its root rows are called.
    fn roots(self) -> &'static str {
        match self {
            Tree::Shop => "products",
            Tree::Blog => "articles",
        }
    }

    async fn schema(self, ctx: &TestCtx) {
        match self {
            Tree::Shop => shop::schema(ctx).await,
            Tree::Blog => blog::schema(ctx).await,
        }
    }

    fn spec(self, ctx: &TestCtx) -> serde_json::Value {
        match self {
            Tree::Shop => shop::spec(ctx),
            Tree::Blog => blog::spec(ctx),
        }
    }

    /// `roots` roots, the first `renamed` of them under the lookup row [`Self::rename`]
    /// renames.
    async fn data(self, ctx: &TestCtx, roots: u64, renamed: u64) {
        match self {
            Tree::Shop => shop::data(ctx, roots, renamed).await,
            Tree::Blog => blog::data(ctx, roots, renamed).await,
        }
    }

    fn rows(self, roots: u64) -> [(&'static str, u64); 6] {
        match self {
            Tree::Shop => shop::rows(roots),
            Tree::Blog => blog::rows(roots),
        }
    }

    /// The lookup row renamed to `name`, and the document field that then shows it.
    fn rename(self, name: &str) -> (String, &'static str) {
        match self {
            Tree::Shop => (
                format!("UPDATE brands SET name = '{name}' WHERE id = 1"),
                "brand.name",
            ),
            Tree::Blog => (
                format!("UPDATE tags SET name = '{name}' WHERE id = 1"),
                "tags.tag.name",
            ),
        }
    }

    /// Change `n` deep in the tree, of one of `roots` roots: the root, the statement,
    /// and what the root's document shows once it is applied (the shop: a SKU's price,
    /// two levels down; the blog: a comment's text). Each row changes once in the first
    /// `roots` × 3 changes, so none is overwritten while it is being watched.
    fn deep_change(self, roots: u64, n: u64) -> (u64, String, Check) {
        // A stride prime to `roots` visits every root once in `roots` changes.
        let stride = (1..).map(|k| 7919 * k + 1).find(|s| gcd(*s, roots) == 1);
        let root = 1 + (n * stride.unwrap_or(1)) % roots;
        let row = n / roots;
        match self {
            Tree::Shop => {
                // `shop::data` gives each product 2 SKUs of 2 prices, ids counted up in
                // that order from 1.
                let id = (root - 1) * 4 + 1 + row % 4;
                let amount = format!("{}.25", 1000 + n);
                let sql = format!("UPDATE sku_prices SET amount = {amount} WHERE id = {id}");
                let check: Check = Arc::new(move |doc: &Value| {
                    let skus = doc["skus"].as_array().into_iter().flatten();
                    let prices = skus.flat_map(|s| s["prices"].as_array().into_iter().flatten());
                    prices
                        .into_iter()
                        .any(|p| same_number(&p["amount"], &amount))
                });
                (root, sql, check)
            }
            Tree::Blog => {
                let id = root * 10 + row % 3;
                let text = format!("edit {n}");
                let sql = format!("UPDATE comments SET text = '{text}' WHERE id = {id}");
                let check: Check = Arc::new(move |doc: &Value| {
                    let comments = doc["comments"].as_array().into_iter().flatten();
                    comments.into_iter().any(|c| c["text"] == text.as_str())
                });
                (root, sql, check)
            }
        }
    }

    /// What [`Self::deep_change`] changes, in the bench's lines.
    fn deep(self) -> &'static str {
        match self {
            Tree::Shop => "a SKU's price",
            Tree::Blog => "a comment's text",
        }
    }

    /// What the renamed row is, in the bench's lines.
    fn lookup(self) -> &'static str {
        match self {
            Tree::Shop => "a brand",
            Tree::Blog => "a tag (through the link table)",
        }
    }
}

/// Renames timed; the figure is their median.
const RENAMES: u32 = 5;
/// The rename's target: every document shows it within a second (p50).
const RENAME_TARGET_S: f64 = 1.0;
/// Documents made current per second, as a share of a raw `_bulk` of the same documents.
const CEILING_SHARE: f64 = 0.8;
/// Times a document may be read back from MySQL while a backlog of its rows streams in.
const READS_TARGET: f64 = 1.5;
/// The deep changes' target: commit to searchable within this, p99.
const LATENCY_TARGET_MS: f64 = 100.0;
/// Connections the deep changes commit on, in turn (one cannot hold 1,000/s).
const CONNECTIONS: usize = 4;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `v` (a decimal, as a string or a number) is `text`.
fn same_number(v: &Value, text: &str) -> bool {
    v.as_str() == Some(text)
        || v.as_f64()
            .zip(text.parse::<f64>().ok())
            .is_some_and(|(a, b)| a == b)
}

async fn run(ctx: &TestCtx, tree: Tree) -> anyhow::Result<()> {
    ctx.warm_up().await?;
    let products = env_num::<u64>("BENCH_TREE_PRODUCTS", 5000)?;
    let brand = env_num::<u64>("BENCH_TREE_BRAND", 2000)?.min(products);
    tree.schema(ctx).await;
    let mut spec = tree.spec(ctx);
    if env_num::<u8>("BENCH_TREE_AREA_UPDATES", 1)? == 0 {
        spec["area_updates"] = json!(false);
    }
    let alias = spec["alias"].as_str().context("alias")?.to_owned();
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    tree.data(ctx, products, brand).await;
    ctx.wait_streamed(&worker).await;
    // Every topic's end, from what each table received.
    let mut ends = Vec::new();
    let mut events = 0;
    for (table, rows) in tree.rows(products) {
        let topic = ctx.topic(table);
        let records = ctx
            .read_topic(&topic, rows as usize, Duration::from_secs(300))
            .await;
        events += records.len();
        ends.push((topic, kafka::ends(&records)));
    }

    // The etl's default unless the run says otherwise (to compare settings).
    let reads = env_num::<u64>("BENCH_TREE_READ_CONCURRENCY", 0)?;
    if reads > 0 {
        ctx.env_for(
            "sluice-etl",
            "SLUICE_ETL__READ_CONCURRENCY",
            &reads.to_string(),
        );
    }
    let mut etl = ctx.etl_with(std::slice::from_ref(&spec));
    let cpu = CpuSeconds::now();
    let started = Instant::now();
    etl.start();
    let deadline = started + Duration::from_secs(1800);
    'wait: loop {
        if Instant::now() > deadline {
            bail!(
                "the etl did not commit every topic within 30 min\n{}",
                etl.log_tail()
            );
        }
        for (topic, end) in &ends {
            if ctx.etl_committed_up_to(topic, end).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await; // a poll pace
                continue 'wait;
            }
        }
        break;
    }
    let took = started.elapsed();
    let cpu = CpuSeconds::now().since(&cpu);
    let pipeline = [("pipeline", alias.as_str())];
    let read = etl
        .metric_sum("sluice_etl_documents_read_total", &pipeline)
        .await
        .map_err(anyhow::Error::msg)?;
    let (queries, rows) = source_reads(&etl, &alias).await;
    let rate = products as f64 / took.as_secs_f64();
    let roots = tree.roots();
    println!(
        "[{roots} 1/4] {products} {roots} from {events} row events: {:.1} s = {rate:.0} documents/s ({:.0} events/s; the etl read back {read:.0} documents, each {:.2} times while its tables' rows arrived, {:.0}/s), {:.3} MySQL queries per document read, {:.2} rows read per row event",
        took.as_secs_f64(),
        events as f64 / took.as_secs_f64(),
        read / products as f64,
        read / took.as_secs_f64(),
        queries / read.max(1.0),
        rows / events.max(1) as f64,
    );
    println!(
        "[{roots} 1/4] CPU of it: {}; the sink's per document made current: {}",
        cpu.describe_on_cores(),
        cpu.sink_per_item(products as f64)
    );
    let raw_rate = ceiling(ctx, &alias, roots).await?;
    println!(
        "[{roots} 2/4] the documents were made current at {:.0} % of it",
        100.0 * rate / raw_rate
    );
    let target = CEILING_SHARE * raw_rate;
    let on_full_cores = cpu.bound(products as f64, rate, target, "docs/s");
    if let Some((_, line)) = &on_full_cores {
        println!("[{roots} 2/4] what bounds it: {line}");
    }

    // A lookup row under `brand` documents renamed, RENAMES times.
    let mut renames = Vec::new();
    for r in 1..=RENAMES {
        let (seen, in_bulk, (queries, rows)) = rename(ctx, &etl, &alias, tree, brand, r).await?;
        println!(
            "[{roots} 3/4] {} renamed under {brand} documents ({r} of {RENAMES}): all of them show it {:.2} s after COMMIT ({in_bulk:.2} s of it in Elasticsearch _bulk requests; {queries:.0} MySQL queries, {rows:.0} rows read)",
            tree.lookup(),
            seen.as_secs_f64()
        );
        renames.push(seen.as_secs_f64());
    }
    renames.sort_by(f64::total_cmp);
    let rename_p50 = renames[renames.len() / 2];
    let samples = env_num::<u64>("BENCH_TREE_LATENCY_SAMPLES", 5000)?;
    let pace = env_num::<f64>("BENCH_TREE_LATENCY_RATE", 1000.0)?;
    let before = source_reads(&etl, &alias).await;
    let stages_before = stages::scrape([&worker, &etl]).await;
    let deep_cpu = CpuSeconds::now();
    let deep = deep_latency(ctx, &alias, tree, products, samples, pace).await?;
    let deep_cpu = CpuSeconds::now().since(&deep_cpu);
    let stages_after = stages::scrape([&worker, &etl]).await;
    // Every change was seen applied; the etl counts a read's queries when it ends.
    let after = source_reads(&etl, &alias).await;
    let n = samples.max(1) as f64;
    let (deep_queries, deep_rows) = ((after.0 - before.0) / n, (after.1 - before.1) / n);
    println!(
        "[{roots} 4/4] a change deep in the tree ({}), single-row transactions: commit→searchable {}; {deep_queries:.2} MySQL queries and {deep_rows:.1} rows read per change",
        tree.deep(),
        deep.describe()
    );
    println!(
        "[{roots} 4/4] its stages, by the services' histograms: {}",
        stages::describe(&stages_before, &stages_after)
    );
    println!("[{roots} 4/4] CPU of it: {}", deep_cpu.describe_on_cores());
    let floor = sink_floor(ctx, &alias, samples as usize, deep.sent_rate).await?;
    println!(
        "[{roots} 4/4] the sink's own floor at that rate (one writer, the same documents, a bulk every 100 ms, nothing else running): each bulk answered in {}",
        floor.describe_bulks()
    );
    let mut f = Figures::new();
    f.insert(
        "deep_latency_p50_ms".into(),
        Figure::lower(deep.pct(50.0), "ms", None),
    );
    f.insert(
        "deep_latency_p99_ms".into(),
        Figure::lower(deep.pct(99.0), "ms", Some(LATENCY_TARGET_MS)),
    );
    f.insert(
        "deep_queries_per_change".into(),
        Figure::lower(deep_queries, "queries", None),
    );
    f.insert(
        "deep_rows_per_change".into(),
        Figure::lower(deep_rows, "rows", None),
    );
    f.insert(
        "deep_sink_floor_p99_ms".into(),
        Figure::lower(floor.pct(99.0), "ms", Some(LATENCY_TARGET_MS)),
    );
    f.insert(
        "documents_per_s".into(),
        Figure::higher(rate, "docs/s", Some(CEILING_SHARE * raw_rate)),
    );
    f.insert(
        "raw_bulk_docs_per_s".into(),
        Figure::higher(raw_rate, "docs/s", None),
    );
    if let Some((full, _)) = on_full_cores {
        f.insert(
            "documents_per_s_on_full_cores".into(),
            Figure::higher(full, "docs/s", Some(target)),
        );
    }
    f.insert(
        "reads_per_document".into(),
        Figure::lower(read / products as f64, "reads", Some(READS_TARGET)),
    );
    f.insert(
        "rename_s".into(),
        Figure::lower(rename_p50, "s", Some(RENAME_TARGET_S)),
    );
    figures::report(tree.bench(), &f);
    drop(etl);
    drop(worker);
    Ok(())
}

/// `samples` changes deep in the tree at `rate` a second, each a single-row transaction
/// on another root, timed from its COMMIT until a real-time GET of the root's document
/// shows it.
async fn deep_latency(
    ctx: &TestCtx,
    alias: &str,
    tree: Tree,
    roots: u64,
    samples: u64,
    rate: f64,
) -> anyhow::Result<Latency> {
    let probe = Probe::start(ctx.stack.es.clone(), alias.to_owned());
    let (free, mut idle) = mpsc::unbounded_channel();
    for _ in 0..CONNECTIONS {
        let mut conn = ctx.stack.conn().await;
        conn.query_drop(format!("USE `{}`", ctx.db)).await?;
        let _ = free.send(conn);
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut commits = tokio::task::JoinSet::new();
    let started = Instant::now();
    for n in 0..samples {
        tick.tick().await;
        let mut conn = idle.recv().await.context("no connection")?;
        let (root, sql, check) = tree.deep_change(roots, n);
        let (free, watch) = (free.clone(), probe.watcher());
        commits.spawn(async move {
            conn.query_drop(sql).await?;
            watch.until(root.to_string(), Instant::now(), check);
            let _ = free.send(conn);
            anyhow::Ok(())
        });
        while let Some(done) = commits.try_join_next() {
            done??;
        }
    }
    while let Some(done) = commits.join_next().await {
        done??;
    }
    probe.finish(samples as usize, started).await
}

/// The floor of part 4: the sink alone, one writer replacing `samples` of the index's
/// documents (round and round) at `rate` a second, a bulk every 100 ms, in a scratch index
/// of the same shape that holds them all. Each bulk's answer time. No pipeline makes a
/// change searchable faster than the sink answers the bulk that carries it.
async fn sink_floor(
    ctx: &TestCtx,
    alias: &str,
    samples: usize,
    rate: f64,
) -> anyhow::Result<Latency> {
    let es = &ctx.stack.es;
    let docs = documents(es, alias, "id").await?;
    if docs.is_empty() {
        bail!("{alias} holds no documents to write again");
    }
    let index = format!("{alias}_floor");
    scratch_like(es, &format!("{alias}_v1"), &index).await?;
    es.update_settings(&index, &json!({"index": {"refresh_interval": null}}))
        .await?;
    let op = |n: usize, version: u64| {
        let (id, doc) = &docs[n % docs.len()];
        BulkOp::Index {
            index: index.clone(),
            id: id.clone(),
            version,
            routing: None,
            doc: doc.clone(),
        }
    };
    let created: Vec<BulkOp> = (0..docs.len()).map(|n| op(n, 1)).collect();
    bulk_all(es, &created).await?;
    let ops: Vec<BulkOp> = (0..samples).map(|n| op(n, 2 + n as u64)).collect();
    let every = Duration::from_millis(100);
    let per_bulk = (rate * every.as_secs_f64()).round().max(1.0) as usize;
    let (sorted_ms, kept) =
        sluice_integration_tests::ceiling::paced_bulks(es, &ops, per_bulk, every).await?;
    es.delete_index(&index).await?;
    Ok(Latency::of_bulks(sorted_ms, kept))
}

/// The ceiling: the index's documents, straight into a scratch index of the same server
/// with a raw `_bulk` client, created, then replaced with newer versions (as a rebuild
/// replaces documents that exist); the second pass's documents per second.
async fn ceiling(ctx: &TestCtx, alias: &str, roots: &str) -> anyhow::Result<f64> {
    let es = &ctx.stack.es;
    es.refresh(alias).await?;
    let hits = documents(es, alias, "id").await?;
    let index = format!("{alias}_ceiling");
    scratch_like(es, &format!("{alias}_v1"), &index).await?;
    let ops = |version: u64| -> Vec<BulkOp> {
        hits.iter()
            .map(|(id, doc)| BulkOp::Index {
                index: index.clone(),
                id: id.clone(),
                version,
                routing: None,
                doc: doc.clone(),
            })
            .collect()
    };
    // Rebuilds replace documents that exist: time that too (a second pass, newer versions).
    let created = Instant::now();
    bulk_all(es, &ops(1)).await?;
    let created = created.elapsed();
    let overwrite = ops(2);
    let cpu = CpuSeconds::now();
    let raw = bulk_ceiling(es, &index, &overwrite).await?;
    let cpu = CpuSeconds::now().since(&cpu);
    let raw_rate = overwrite.len() as f64 / raw.as_secs_f64();
    println!(
        "[{roots} 2/4] raw _bulk ceiling of the same Elasticsearch: {} documents in {:.1} s = {raw_rate:.0} docs/s replacing existing ones ({:.0} docs/s creating them)",
        overwrite.len(),
        raw.as_secs_f64(),
        overwrite.len() as f64 / created.as_secs_f64(),
    );
    println!(
        "[{roots} 2/4] CPU of it: {}; the sink's per document: {}",
        cpu.describe_on_cores(),
        cpu.sink_per_item(overwrite.len() as f64)
    );
    Ok(raw_rate)
}

/// Renames the tree's lookup row (under `brand` documents) to `renamed <round>`: how
/// long from COMMIT until every document shows it, the seconds the etl spent in `_bulk`
/// requests meanwhile, and the MySQL queries it made and rows it read.
async fn rename(
    ctx: &TestCtx,
    etl: &sluice_integration_tests::Service,
    alias: &str,
    tree: Tree,
    brand: u64,
    round: u32,
) -> anyhow::Result<(Duration, f64, (f64, f64))> {
    let es = &ctx.stack.es;
    let bulk = async |etl: &sluice_integration_tests::Service| {
        etl.metric_sum("sluice_etl_bulk_duration_seconds_sum", &[])
            .await
            .unwrap_or(0.0)
    };
    let settled = async |etl: &sluice_integration_tests::Service| {
        etl.metric_sum("sluice_etl_documents_total", &[])
            .await
            .unwrap_or(0.0)
    };
    let bulk_before = bulk(etl).await;
    let settled_before = settled(etl).await;
    let reads_before = source_reads(etl, alias).await;
    let name = format!("renamed {round}");
    let (update, field) = tree.rename(&name);
    let committed = Instant::now();
    ctx.exec(&update).await;
    let seen = loop {
        es.refresh(alias).await?;
        let n = es
            .search(
                alias,
                &json!({"query": {"match_phrase": {field: name}}, "size": 0, "track_total_hits": true}),
            )
            .await?["hits"]["total"]["value"]
            .as_u64()
            .unwrap_or(0);
        if n >= brand {
            break committed.elapsed();
        }
        if committed.elapsed() > Duration::from_secs(600) {
            bail!("the rename reached {n} of {brand} documents in 10 min");
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // a poll pace
    };
    // The etl counts each written (or stale) document once its _bulk returned, right
    // after timing the request: wait until it counted them all.
    while settled(etl).await - settled_before < brand as f64 {
        if committed.elapsed() > Duration::from_secs(600) {
            bail!("the etl did not count the rename's writes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // a poll pace
    }
    let in_bulk = bulk(etl).await - bulk_before;
    let reads = source_reads(etl, alias).await;
    let reads = (reads.0 - reads_before.0, reads.1 - reads_before.1);
    Ok((seen, in_bulk, reads))
}

/// The MySQL queries the etl ran, and the rows they returned, for pipeline `alias` so far.
async fn source_reads(etl: &sluice_integration_tests::Service, alias: &str) -> (f64, f64) {
    let pipeline = [("pipeline", alias)];
    let sum = async |name: &str| etl.metric_sum(name, &pipeline).await.unwrap_or(0.0);
    (
        sum("sluice_etl_source_queries_total").await,
        sum("sluice_etl_source_rows_total").await,
    )
}
