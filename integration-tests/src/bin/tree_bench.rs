//! `make bench` (third part): documents built from several tables — the sample shop
//! (`sluice_integration_tests::shop`: products → brand, SKUs → prices, 5 newest tags).
//!
//! 1. Streaming rebuilds: the shop's rows (`BENCH_TREE_PRODUCTS` products, default 5000,
//!    about 14 rows each) are streamed into Kafka with the etl stopped; an etl is then
//!    timed until its group committed every topic. Printed: the documents it read back per
//!    second, the MySQL queries per rebuilt document, and rows per second.
//! 2. The ceiling: the index's final documents `_bulk`-indexed straight into a scratch
//!    index of the same server (the etl's batch size and requests in flight), then again
//!    with newer versions (a rebuild replaces a document that exists); the rebuild rate as
//!    a share of the second.
//! 3. A brand renamed under `BENCH_TREE_BRAND` documents (default 2000), five times: the
//!    median seconds from COMMIT until every one of them shows the new name, against the
//!    target of one second.
//!
//! The figures go to `target/bench/tree-<source>.json` (`BENCH_SOURCE`), judged against
//! the committed baseline. `BENCH_TREE_READ_CONCURRENCY` sets the etl's
//! `read_concurrency` (default: the etl's own).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::json;
use sluice_elastic::BulkOp;
use sluice_integration_tests::ceiling::bulk_ceiling;
use sluice_integration_tests::figures::{self, Figure, Figures};
use sluice_integration_tests::{env_num, kafka, shop, TestCtx};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if let Err(e) = sluice_integration_tests::lane::Lane::enter_from_env("BENCH_SOURCE") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let ctx = TestCtx::new("treebench").await;
    let outcome = run(&ctx).await;
    println!("cleanup: {}", ctx.cleanup().await);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tree bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Renames timed; the figure is their median.
const RENAMES: u32 = 5;
/// The rename's target: every document shows it within a second (p50).
const RENAME_TARGET_S: f64 = 1.0;

async fn run(ctx: &TestCtx) -> anyhow::Result<()> {
    let products = env_num::<u64>("BENCH_TREE_PRODUCTS", 5000)?;
    let brand = env_num::<u64>("BENCH_TREE_BRAND", 2000)?.min(products);
    if products > 9000 {
        bail!("BENCH_TREE_PRODUCTS: at most 9000 (the ceiling reads the index in one search)");
    }
    shop::schema(ctx).await;
    let spec = shop::spec(ctx);
    let alias = spec["alias"].as_str().context("alias")?.to_owned();
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    shop::data(ctx, products, brand).await;
    ctx.wait_streamed(&worker).await;
    // Every topic's end, from what each table received.
    let mut ends = Vec::new();
    let mut events = 0;
    for (table, rows) in shop::rows(products) {
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
    let pipeline = [("pipeline", alias.as_str())];
    let read = etl
        .metric_sum("sluice_etl_documents_read_total", &pipeline)
        .await
        .map_err(anyhow::Error::msg)?;
    let queries = etl
        .metric_sum("sluice_etl_source_queries_total", &pipeline)
        .await
        .map_err(anyhow::Error::msg)?;
    let rate = read / took.as_secs_f64();
    println!(
        "[tree 1/3] {products} products from {events} row events: the etl read back {read:.0} documents in {:.1} s = {rate:.0} docs/s ({:.0} events/s, {:.0} products/s; each read back {:.1} times while its tables' rows arrived), {:.3} MySQL queries per document",
        took.as_secs_f64(),
        events as f64 / took.as_secs_f64(),
        products as f64 / took.as_secs_f64(),
        read / products as f64,
        queries / read.max(1.0)
    );

    // The ceiling: the same documents, straight into a scratch index.
    let es = &ctx.stack.es;
    es.refresh(&alias).await?;
    let found = es
        .search(&alias, &json!({"query": {"match_all": {}}, "size": 10000}))
        .await?;
    let hits = found["hits"]["hits"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let index = format!("{alias}_ceiling");
    let mapping = es.get_mapping(&format!("{alias}_v1")).await?;
    es.create_index(
        &index,
        &json!({"settings": {"number_of_replicas": 0}, "mappings": mapping[format!("{alias}_v1")]["mappings"]}),
    )
    .await?;
    let ops = |version: u64| -> Vec<BulkOp> {
        hits.iter()
            .map(|h| BulkOp::Index {
                index: index.clone(),
                id: h["_id"].as_str().unwrap_or_default().to_owned(),
                version,
                routing: None,
                doc: h["_source"].clone(),
            })
            .collect()
    };
    // Rebuilds replace documents that exist: time that too (a second pass, newer versions).
    let created = Instant::now();
    for chunk in ops(1).chunks(sluice_integration_tests::ceiling::raw_batch()) {
        es.bulk(chunk).await?;
    }
    let created = created.elapsed();
    let overwrite = ops(2);
    let raw = bulk_ceiling(es, &index, &overwrite).await?;
    let raw_rate = overwrite.len() as f64 / raw.as_secs_f64();
    println!(
        "[tree 2/3] raw _bulk ceiling of the same Elasticsearch: {} documents in {:.1} s = {raw_rate:.0} docs/s replacing existing ones ({:.0} docs/s creating them); the rebuilds ran at {:.0} % of it",
        overwrite.len(),
        raw.as_secs_f64(),
        overwrite.len() as f64 / created.as_secs_f64(),
        100.0 * rate / raw_rate
    );

    // A brand renamed under `brand` documents, RENAMES times.
    let mut renames = Vec::new();
    for r in 1..=RENAMES {
        let (seen, in_bulk, queries) = rename(ctx, &etl, &alias, brand, r).await?;
        println!(
            "[tree 3/3] a brand renamed under {brand} documents ({r} of {RENAMES}): all of them show it {:.2} s after COMMIT ({in_bulk:.2} s of it in Elasticsearch _bulk requests; {queries:.0} MySQL queries)",
            seen.as_secs_f64()
        );
        renames.push(seen.as_secs_f64());
    }
    renames.sort_by(f64::total_cmp);
    let rename_p50 = renames[renames.len() / 2];
    let mut f = Figures::new();
    f.insert(
        "rebuild_docs_per_s".into(),
        Figure::higher(rate, "docs/s", Some(raw_rate)),
    );
    f.insert(
        "reads_per_product".into(),
        Figure::lower(read / products as f64, "reads", None),
    );
    f.insert(
        "products_per_s".into(),
        Figure::higher(products as f64 / took.as_secs_f64(), "products/s", None),
    );
    f.insert(
        "brand_rename_s".into(),
        Figure::lower(rename_p50, "s", Some(RENAME_TARGET_S)),
    );
    figures::report("tree", &f);
    drop(etl);
    drop(worker);
    Ok(())
}

/// Renames brand 1 (under `brand` documents) to `renamed brand <round>`: how long from
/// COMMIT until every document shows it, the seconds the etl spent in `_bulk` requests
/// meanwhile, and the MySQL queries it made.
async fn rename(
    ctx: &TestCtx,
    etl: &sluice_integration_tests::Service,
    alias: &str,
    brand: u64,
    round: u32,
) -> anyhow::Result<(Duration, f64, f64)> {
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
    let queries_before = etl
        .metric_sum("sluice_etl_source_queries_total", &[("pipeline", alias)])
        .await
        .unwrap_or(0.0);
    let name = format!("renamed brand {round}");
    let committed = Instant::now();
    ctx.exec(&format!("UPDATE brands SET name = '{name}' WHERE id = 1"))
        .await;
    let seen = loop {
        es.refresh(alias).await?;
        let n = es
            .search(
                alias,
                &json!({"query": {"match_phrase": {"brand.name": name}}, "size": 0, "track_total_hits": true}),
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
    let queries = etl
        .metric_sum("sluice_etl_source_queries_total", &[("pipeline", alias)])
        .await
        .unwrap_or(0.0)
        - queries_before;
    Ok((seen, in_bulk, queries))
}
