//! `make bench`: throughput, latency and memory of MySQL → sluice-worker → Kafka →
//! sluice-etl → Elasticsearch on the local stack, with the harness of the end-to-end tests.
//!
//! 1. binlog → Kafka: a generated load (multi-row INSERTs in ~1000-row transactions, each
//!    also updating and deleting 10 % of its rows) is written while the worker is stopped,
//!    into the table the etl then indexes and into a second table that brings the binlog
//!    to `BENCH_WORKER_EVENTS` row events; the restarted worker is timed until its
//!    confirmed checkpoint reaches the binlog end.
//! 2. Kafka → Elasticsearch: an etl with a fresh consumer group is timed until the index
//!    holds every row and the group has committed the whole topic.
//! 3. The ceiling: as many similar documents `_bulk`-indexed straight into a scratch index
//!    of the same server, with the etl's default batch size and requests in flight.
//! 4. Commit-to-indexed latency: single-row transactions at a steady rate (autocommitted
//!    INSERTs on four connections in turn), each polled by id (a real-time read) until it
//!    is visible; once light (20/s), once under load (1,000/s). Its ceiling under load:
//!    as many documents at the same rate handed straight to a raw `_bulk` writer on the
//!    same server, probed the same way; and the floor: the sink alone, one writer sending
//!    those documents in a bulk every 100 ms, nothing probing, each bulk's answer timed.
//! 5. One transaction of `BENCH_BIG_TXN_ROWS` rows (100,000), timed until indexed; then the
//!    peak RSS (`VmHWM`) of the worker, the etl and the stack's services, which therefore
//!    covers that transaction; and the most RSS the worker and the etl showed while
//!    streaming the latency under load (the worker's steady figure).
//!
//! Environment: `BENCH_ROWS` (default 50000), `BENCH_WORKER_EVENTS` (1000000),
//! `BENCH_BIG_TXN_ROWS` (100000),
//! `BENCH_LATENCY_SAMPLES` (200),
//! `BENCH_LATENCY_RATE` (rows/s, 20), `BENCH_LOADED_SAMPLES` (10000), `BENCH_LOADED_RATE`
//! (rows/s, 1000), `SLUICE_BIN_DIR` (which build of the services runs),
//! and the stack endpoints the tests use (`MARIADB_URL`, `ZOOKEEPER`, `KAFKA_BROKERS`, `ES_URL`).

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context as _};
use futures::FutureExt as _;
use mysql_async::prelude::*;
use serde_json::{Map, Value};
use sluice_elastic::BulkOp;
use sluice_integration_tests::context::Pipeline;
use sluice_integration_tests::{env_num, kafka, Service, TestCtx, Xorshift};
use sluice_model::{BinlogPosition, Checkpoint};
use tokio::sync::mpsc;

const TABLE: &str = "bench";
/// The table that brings the worker's share of the run to `BENCH_WORKER_EVENTS`.
const FILLER: &str = "bench_worker";
const ROWS_PER_TXN: u64 = 1000;
use sluice_integration_tests::ceiling;
use sluice_integration_tests::cpu::CpuSeconds;
use sluice_integration_tests::figures::{self, Figure, Figures};
use sluice_integration_tests::probe::{Latency, Probe};
use sluice_integration_tests::stages;
const POLL: Duration = Duration::from_millis(50);
/// Connections the latency runs commit their single-row transactions on, in turn.
const LATENCY_CONNECTIONS: usize = 4;

struct Settings {
    rows: u64,
    /// Row events the worker is timed over (the etl's table's, and a second table's).
    worker_events: u64,
    latency_samples: usize,
    latency_rate: f64,
    /// The latency under load: single-row transactions at this rate.
    loaded_samples: usize,
    loaded_rate: f64,
    /// Rows of the one big transaction (0: none).
    big_txn_rows: u64,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let s = Settings {
            rows: env_num("BENCH_ROWS", 50_000)?,
            worker_events: env_num("BENCH_WORKER_EVENTS", 1_000_000)?,
            latency_samples: env_num("BENCH_LATENCY_SAMPLES", 200)?,
            latency_rate: env_num("BENCH_LATENCY_RATE", 20.0)?,
            loaded_samples: env_num("BENCH_LOADED_SAMPLES", 10_000)?,
            loaded_rate: env_num("BENCH_LOADED_RATE", 1000.0)?,
            big_txn_rows: env_num("BENCH_BIG_TXN_ROWS", 100_000)?,
        };
        if s.rows == 0
            || s.latency_samples == 0
            || s.latency_rate <= 0.0
            || s.loaded_samples == 0
            || s.loaded_rate <= 0.0
        {
            bail!("BENCH_ROWS, BENCH_LATENCY_SAMPLES, BENCH_LATENCY_RATE, BENCH_LOADED_SAMPLES and BENCH_LOADED_RATE must be positive");
        }
        Ok(s)
    }
}

struct LoadStats {
    inserted: u64,
    updated: u64,
    deleted: u64,
    transactions: u64,
    elapsed: Duration,
}

impl LoadStats {
    fn events(&self) -> u64 {
        self.inserted + self.updated + self.deleted
    }
}

struct Throughput {
    count: u64,
    total: Duration,
    /// Until the first sign of progress (process start, connections, partitions taken...).
    startup: Option<Duration>,
}

impl Throughput {
    fn rate(&self) -> f64 {
        self.count as f64 / self.total.as_secs_f64()
    }

    fn steady_rate(&self) -> Option<f64> {
        let s = self.startup?;
        let rest = self.total.checked_sub(s)?.as_secs_f64();
        (rest > 0.0).then(|| self.count as f64 / rest)
    }
}

struct Rss {
    name: String,
    pid: Option<u32>,
    peak_kb: Option<u64>,
    now_kb: Option<u64>,
    /// The most `VmRSS` sampled while streaming the latency under load: the steady
    /// figure, apart from the bursts of the catch-up and the big transaction.
    streaming_kb: Option<u64>,
    note: &'static str,
}

/// The share of the raw `_bulk` client's pace the etl is to reach.
const ETL_SHARE: f64 = 0.9;

struct Report {
    bin_dir: String,
    load: LoadStats,
    kafka_events: i64,
    worker: Throughput,
    etl: Throughput,
    /// The etl's documents a second with every core busy at the same CPU per document.
    etl_on_full_cores: Option<f64>,
    etl_docs: u64,
    raw: Throughput,
    latency: Latency,
    loaded: Latency,
    /// The same load's documents written straight to the same server.
    loaded_raw: Latency,
    /// Each bulk's answer time when one writer alone hands the sink the load's rate.
    sink_alone: Latency,
    rss: Vec<Rss>,
}

struct Bench {
    ctx: TestCtx,
    pipeline: Pipeline,
    topic: String,
    settings: Settings,
    worker: Option<Service>,
    etl: Option<Service>,
    raw_index: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if let Err(e) = sluice_integration_tests::lane::Lane::enter_from_env("BENCH_SOURCE") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let ctx = TestCtx::new("bench").await;
    let pipeline = ctx.pipeline(TABLE);
    let topic = sluice_kafka::TopicConfig::default().rows_topic(&ctx.instance, &ctx.db, TABLE);
    let mut bench = Bench {
        ctx,
        pipeline,
        topic,
        settings,
        worker: None,
        etl: None,
        raw_index: None,
    };
    let outcome = AssertUnwindSafe(bench.run()).catch_unwind().await;
    bench.cleanup().await;
    match outcome {
        Ok(Ok(report)) => {
            report.print();
            report.judge();
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("bench failed (panic above)");
            ExitCode::FAILURE
        }
    }
}

impl Bench {
    async fn run(&mut self) -> anyhow::Result<Report> {
        let bin_dir = Service::binary("sluice-worker")
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        println!(
            "bench: {} rows, services from {bin_dir}, logs in {}",
            self.settings.rows,
            self.ctx.dir.display()
        );
        if !bin_dir.contains("release") {
            println!("bench: WARNING: not a release build; set SLUICE_BIN_DIR=target/release");
        }
        self.ctx.warm_up().await?;
        for table in [TABLE, FILLER] {
            self.ctx
                .exec(&format!(
                    "CREATE TABLE {table} (id BIGINT PRIMARY KEY AUTO_INCREMENT, k INT, \
                     c VARCHAR(120), pad VARCHAR(60), ts DATETIME(6))"
                ))
                .await;
        }

        // The worker's first start records the binlog end as its start; stop it, write the
        // load, and time the restarted worker through it.
        let mut worker = self.ctx.worker();
        worker.start();
        self.ctx.wait_worker_ready(&worker).await;
        worker.terminate(Duration::from_secs(30));
        self.worker = Some(worker);

        let load = self
            .load(TABLE, self.settings.rows, 0x5eed_1234_abcd_0001)
            .await?;
        // The rest of the worker's events, in a table the etl does not index: each
        // 1,000-row transaction makes 1,200 events.
        let more = self.settings.worker_events.saturating_sub(load.events());
        let filler = self
            .load(FILLER, more.div_ceil(1200) * 1000, 0x5eed_1234_abcd_0003)
            .await?;
        let end = self.binlog_end().await?;
        for (table, l) in [(TABLE, &load), (FILLER, &filler)] {
            println!(
                "[1/5] load into {table}: {} transactions, {} inserts + {} updates + {} deletes = {} events written in {:.2} s",
                l.transactions,
                l.inserted,
                l.updated,
                l.deleted,
                l.events(),
                l.elapsed.as_secs_f64()
            );
        }
        let worker_events = load.events() + filler.events();
        let (mut worker_tp, started) = self.time_worker(&end, worker_events).await?;
        // The topic read back: the events it holds, where each partition ends, and when
        // the worker published its first event (the producer's timestamp; the etl's
        // table was loaded first).
        let records = self
            .ctx
            .read_topic(
                &self.topic,
                load.events() as usize,
                Duration::from_secs(60 + load.events() / 1000),
            )
            .await;
        let filler_topic = sluice_kafka::TopicConfig::default().rows_topic(
            &self.ctx.instance,
            &self.ctx.db,
            FILLER,
        );
        self.ctx.clean_up_topic(filler_topic.clone());
        let mut watermarks: i64 = 0;
        for topic in [&self.topic, &filler_topic] {
            watermarks += self.ctx.watermarks(topic).await.values().sum::<i64>();
        }
        let kafka_events = records.len() as i64;
        worker_tp.startup = records
            .iter()
            .filter_map(|r| r.ts_ms)
            .min()
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64))
            .and_then(|t| t.duration_since(started).ok());
        println!(
            "[1/5] binlog→Kafka (worker alone): {} events confirmed {:.2} s after the start = {:.0} events/s \
             (first event published at {:.2} s: {:.0} events/s from there); the etl's topic holds {kafka_events} events{}, both topics {watermarks}{}",
            worker_tp.count,
            worker_tp.total.as_secs_f64(),
            worker_tp.rate(),
            worker_tp.startup.unwrap_or_default().as_secs_f64(),
            worker_tp.steady_rate().unwrap_or(f64::NAN),
            if kafka_events == load.events() as i64 {
                String::new()
            } else {
                format!(" — MISMATCH: {} expected", load.events())
            },
            if watermarks == worker_events as i64 {
                String::new()
            } else {
                // Some brokers report watermarks a little behind what they serve.
                format!(" by the broker's high watermarks ({worker_events} written)")
            }
        );
        let ends = kafka::ends(&records);
        drop(records);

        let rows = self.mysql_rows().await?;
        let (etl_tp, etl_cpu) = self.time_etl(&ends, rows, load.inserted).await?;
        println!(
            "[2/5] Kafka→Elasticsearch (etl): {kafka_events} events → {rows} documents; {} documents written in {:.2} s = {:.0} docs/s \
             ({:.0} events/s; first bulk answered at {:.2} s (start, partitions taken); {:.0} docs/s after that)",
            etl_tp.count,
            etl_tp.total.as_secs_f64(),
            etl_tp.rate(),
            kafka_events as f64 / etl_tp.total.as_secs_f64(),
            etl_tp.startup.unwrap_or_default().as_secs_f64(),
            etl_tp.steady_rate().unwrap_or(f64::NAN),
        );

        let raw_cpu = CpuSeconds::now();
        let raw = self.raw_bulk(load.inserted).await?;
        let raw_cpu = CpuSeconds::now().since(&raw_cpu);
        println!(
            "[3/5] raw _bulk ceiling (same Elasticsearch, {}): {} docs in {:.2} s = {:.0} docs/s",
            ceiling::describe(),
            raw.count,
            raw.total.as_secs_f64(),
            raw.rate()
        );
        println!(
            "[2/5] CPU of the etl's run: {}",
            etl_cpu.describe_on_cores()
        );
        println!(
            "[3/5] CPU of the raw client: {}",
            raw_cpu.describe_on_cores()
        );
        println!(
            "[3/5] the sink's CPU per document: {} for the etl's, {} for the raw client's",
            etl_cpu.sink_per_item(etl_tp.count as f64),
            raw_cpu.sink_per_item(raw.count as f64),
        );
        let etl_target = ETL_SHARE * raw.rate();
        let etl_on_full_cores = etl_cpu
            .bound(etl_tp.count as f64, etl_tp.rate(), etl_target, "docs/s")
            .map(|(full, line)| {
                println!("[3/5] what bounds the etl against {ETL_SHARE} of it: {line}");
                full
            });

        let s = &self.settings;
        let (loaded_samples, loaded_rate, big_txn_rows) =
            (s.loaded_samples, s.loaded_rate, s.big_txn_rows);
        let latency = self
            .latency("light", s.latency_samples, s.latency_rate)
            .await?;
        let before = self.stage_samples().await;
        let streaming = RssWatch::start([&self.worker, &self.etl]);
        let loaded = self
            .latency("under load", loaded_samples, loaded_rate)
            .await?;
        let streaming = streaming.finish().await;
        let after = self.stage_samples().await;
        println!(
            "[4/5] the stages under load, by the services' histograms: {}",
            stages::describe(&before, &after)
        );
        let loaded_raw = self.raw_latency(loaded_samples, loaded_rate).await?;
        let sink_alone = self.sink_alone(loaded_samples, loaded_rate).await?;

        if big_txn_rows > 0 {
            let rows = big_txn_rows;
            let took = self.big_transaction(rows).await?;
            println!(
                "[5/5] one transaction of {rows} rows: indexed {:.2} s after its commit",
                took.as_secs_f64()
            );
        }
        let rss = self.rss(&streaming);
        println!(
            "[5/5] peak RSS: {}",
            rss.iter()
                .map(|r| format!("{} {}", r.name, fmt_kb(r.peak_kb)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for s in [&mut self.worker, &mut self.etl].into_iter().flatten() {
            if !s.is_running() {
                bail!("{} exited during the run:\n{}", s.bin, s.log_tail());
            }
        }

        Ok(Report {
            bin_dir,
            load,
            kafka_events,
            worker: worker_tp,
            etl: etl_tp,
            etl_on_full_cores,
            etl_docs: rows,
            raw,
            latency,
            loaded,
            loaded_raw,
            sink_alone,
            rss,
        })
    }

    async fn conn(&self) -> anyhow::Result<mysql_async::Conn> {
        let mut conn = self.ctx.stack.conn().await;
        conn.query_drop(format!("USE `{}`", self.ctx.db)).await?;
        Ok(conn)
    }

    /// ~1000-row transactions: a multi-row INSERT, then an UPDATE of a tenth and a DELETE
    /// of another tenth of those rows.
    async fn load(&self, table: &str, rows: u64, seed: u64) -> anyhow::Result<LoadStats> {
        let mut conn = self.conn().await?;
        let mut rng = Xorshift(seed);
        let started = Instant::now();
        let mut stats = LoadStats {
            inserted: 0,
            updated: 0,
            deleted: 0,
            transactions: 0,
            elapsed: Duration::ZERO,
        };
        let mut remaining = rows;
        while remaining > 0 {
            let n = remaining.min(ROWS_PER_TXN);
            remaining -= n;
            let mut sql = String::with_capacity(n as usize * 200);
            sql.push_str(&format!("INSERT INTO {table} (k, c, pad, ts) VALUES "));
            for i in 0..n {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!(
                    "({}, '{}', '{}', NOW(6))",
                    rng.below(1_000_000),
                    rng.text(60, 100),
                    rng.text(40, 60)
                ));
            }
            let mut tx = conn
                .start_transaction(mysql_async::TxOpts::default())
                .await?;
            tx.query_drop(&sql).await?;
            stats.inserted += tx.affected_rows();
            let first = tx.last_insert_id().context("no insert id")?;
            let last = first + n - 1;
            tx.query_drop(format!(
                "UPDATE {table} SET k = k + 1, c = CONCAT('updated ', LEFT(c, 100)) \
                 WHERE id BETWEEN {first} AND {last} AND id % 10 = 1"
            ))
            .await?;
            stats.updated += tx.affected_rows();
            tx.query_drop(format!(
                "DELETE FROM {table} WHERE id BETWEEN {first} AND {last} AND id % 10 = 2"
            ))
            .await?;
            stats.deleted += tx.affected_rows();
            tx.commit().await?;
            stats.transactions += 1;
        }
        stats.elapsed = started.elapsed();
        Ok(stats)
    }

    async fn binlog_end(&self) -> anyhow::Result<BinlogPosition> {
        let mut conn = self.ctx.stack.conn().await;
        sluice_integration_tests::stack::binlog_end(&mut conn)
            .await
            .map_err(|e| anyhow::anyhow!(e))
    }

    /// The worker's and the etl's `/metrics` (empty when unreadable).
    async fn stage_samples(&self) -> BTreeMap<String, f64> {
        stages::scrape([&self.worker, &self.etl].into_iter().flatten()).await
    }

    /// Inserts `rows` rows in one statement (one transaction) and waits until the index
    /// holds every row of the table; how long that took from the commit.
    async fn big_transaction(&self, rows: u64) -> anyhow::Result<Duration> {
        let mut conn = self.conn().await?;
        conn.query_drop(format!(
            "INSERT INTO {TABLE} (k, c, pad, ts) SELECT seq % 1000, CONCAT('big ', seq), \
             REPEAT('p', 60), NOW(6) FROM {}",
            sluice_integration_tests::seq(1, rows)
        ))
        .await?;
        let committed = Instant::now();
        let want = self.mysql_rows().await?;
        let (es, alias) = (&self.ctx.stack.es, &self.pipeline.alias);
        let deadline = Duration::from_secs(120 + rows / 200);
        loop {
            es.refresh(alias).await?;
            let count = es.count(alias).await?;
            if count == want {
                return Ok(committed.elapsed());
            }
            if committed.elapsed() > deadline {
                let etl = self.etl.as_ref().map(|e| e.log_tail()).unwrap_or_default();
                bail!("the index holds {count} of {want} rows {deadline:?} after the big transaction:\n{etl}");
            }
            tokio::time::sleep(POLL * 2).await;
        }
    }

    async fn mysql_rows(&self) -> anyhow::Result<u64> {
        let mut conn = self.conn().await?;
        let n: Option<u64> = conn.query_first("SELECT COUNT(*) FROM bench").await?;
        Ok(n.unwrap_or(0))
    }

    /// Restarts the worker and waits until its confirmed checkpoint reaches `end`.
    async fn time_worker(
        &mut self,
        end: &BinlogPosition,
        events: u64,
    ) -> anyhow::Result<(Throughput, SystemTime)> {
        let coord = sluice_zk::Coordinator::connect(&self.ctx.zk_config()).await?;
        let deadline = Duration::from_secs(60 + events / 200);
        let worker = self.worker.as_mut().context("worker")?;
        let started_at = SystemTime::now();
        let started = Instant::now();
        worker.start();
        let result = loop {
            let cp = coord
                .read_checkpoint(&self.ctx.instance)
                .await?
                .filter(|b| !b.is_empty())
                .map(|b| Checkpoint::from_json(&b))
                .transpose()?;
            let at = started.elapsed();
            if let Some(cp) = cp {
                if cp.position >= *end {
                    let tp = Throughput {
                        count: events,
                        total: at,
                        startup: None,
                    };
                    break Ok((tp, started_at));
                }
                if at > deadline {
                    break Err(anyhow!(
                        "the worker's checkpoint is at {} after {at:?}, short of {end}:\n{}",
                        cp.position,
                        worker.log_tail()
                    ));
                }
            }
            if !worker.is_running() {
                break Err(anyhow!("the worker exited:\n{}", worker.log_tail()));
            }
            tokio::time::sleep(POLL).await;
        };
        coord.close().await;
        result
    }

    /// Starts the etl (its group is new: it reads the whole topic) and waits until the
    /// index holds `rows` documents and the group has committed up to `ends`; where the
    /// machine's CPU went meanwhile.
    async fn time_etl(
        &mut self,
        ends: &BTreeMap<i32, i64>,
        rows: u64,
        docs_written: u64,
    ) -> anyhow::Result<(Throughput, CpuSeconds)> {
        let es = self.ctx.stack.es.clone();
        let alias = self.pipeline.alias.clone();
        let deadline = Duration::from_secs(120 + rows / 100);
        let mut etl = self.ctx.etl(std::slice::from_ref(&self.pipeline));
        let cpu = CpuSeconds::now();
        let started = Instant::now();
        etl.start();
        let etl = self.etl.insert(etl);
        let mut startup = None;
        // Progress is seen in the etl's metrics and its group's offsets, not by refreshing
        // the index meanwhile: a refresh every poll made segments the raw client's run
        // never made, and the sink spent its CPU merging them.
        loop {
            let at = started.elapsed();
            if startup.is_none()
                && etl
                    .metric_sum("sluice_etl_bulk_documents_count", &[])
                    .await
                    .is_ok_and(|bulks| bulks > 0.0)
            {
                startup = Some(at);
            }
            match self.ctx.etl_committed_up_to(&self.topic, ends).await {
                Ok(()) => {
                    let took = Throughput {
                        count: docs_written,
                        total: started.elapsed(),
                        startup,
                    };
                    let cpu = CpuSeconds::now().since(&cpu);
                    es.refresh(&alias).await?;
                    let count = es.count(&alias).await?;
                    if count != rows {
                        bail!(
                            "the etl's group committed the topic, but the index holds {count} of {rows} documents:\n{}",
                            etl.log_tail()
                        );
                    }
                    return Ok((took, cpu));
                }
                Err(behind) if at > deadline => {
                    bail!(
                        "the etl's group has not committed the topic after {at:?}: {behind}\n{}",
                        etl.log_tail()
                    )
                }
                Err(_) => {}
            }
            if !etl.is_running() {
                bail!("the etl exited:\n{}", etl.log_tail());
            }
            tokio::time::sleep(POLL * 2).await;
        }
    }

    /// A scratch index `<name>_<suffix>` mapped as the etl maps the bench's table (deleted
    /// at cleanup if the run stops before it is).
    async fn scratch_index(&mut self, name: &str) -> anyhow::Result<String> {
        let index = format!("{name}_{}", self.ctx.suffix).to_ascii_lowercase();
        let props: Map<String, Value> = [
            ("id", "bigint"),
            ("k", "int"),
            ("c", "varchar(120)"),
            ("pad", "varchar(60)"),
            ("ts", "datetime(6)"),
        ]
        .into_iter()
        .map(|(name, ty)| (name.to_owned(), sluice_etl::field_mapping(ty)))
        .collect();
        self.raw_index = Some(index.clone());
        let settings = sluice_etl::IndexSettings {
            shards: 1,
            replicas: 0,
            tombstone_retention: "60s".into(),
            refresh_interval: String::new(),
        };
        self.ctx
            .stack
            .es
            .create_index(&index, &sluice_etl::index_body(props, &settings))
            .await?;
        Ok(index)
    }

    /// `docs` documents shaped like the etl's, `_bulk`-indexed into a scratch index.
    async fn raw_bulk(&mut self, docs: u64) -> anyhow::Result<Throughput> {
        let es = self.ctx.stack.es.clone();
        let index = self.scratch_index("bench_raw").await?;
        let mut rng = Xorshift(0x5eed_1234_abcd_0002);
        let ops: Vec<BulkOp> = (1..=docs)
            .map(|id| bench_doc(&mut rng, &index, id))
            .collect();
        let total = ceiling::bulk_ceiling(&es, &index, &ops).await?;
        self.raw_index = None;
        Ok(Throughput {
            count: docs,
            total,
            startup: None,
        })
    }

    /// `samples` single-row transactions at `rate` a second, each timed from its commit
    /// until a real-time GET through the alias finds it (before any refresh); printed as
    /// the latency `what`.
    async fn latency(&self, what: &str, samples: usize, rate: f64) -> anyhow::Result<Latency> {
        let probe = Probe::start(self.ctx.stack.es.clone(), self.pipeline.alias.clone());
        // Each INSERT autocommits (a single-row transaction). Commits take a millisecond
        // or more here, so one connection cannot hold 1,000/s: a few take turns, and
        // a tick's transaction goes to the next one free.
        let (free, mut idle) = mpsc::unbounded_channel();
        for _ in 0..LATENCY_CONNECTIONS {
            let _ = free.send(self.conn().await?);
        }
        let mut rng = Xorshift(0x5eed_1234_abcd_0003);
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut inserts = tokio::task::JoinSet::new();
        let started = Instant::now();
        for _ in 0..samples {
            tick.tick().await;
            let mut conn = idle.recv().await.context("no connection")?;
            let (free, watch) = (free.clone(), probe.watcher());
            let row = (rng.below(1_000_000), rng.text(60, 100), rng.text(40, 60));
            inserts.spawn(async move {
                conn.exec_drop(
                    "INSERT INTO bench (k, c, pad, ts) VALUES (?, ?, ?, NOW(6))",
                    row,
                )
                .await?;
                let id = conn.last_insert_id().context("no insert id")?;
                watch.since(id.to_string(), Instant::now());
                let _ = free.send(conn);
                anyhow::Ok(())
            });
            while let Some(done) = inserts.try_join_next() {
                done??;
            }
        }
        while let Some(done) = inserts.join_next().await {
            done??;
        }
        let latency = probe.finish(samples, started).await?;
        println!(
            "[4/5] commit→indexed latency, {what}: {}",
            latency.describe()
        );
        Ok(latency)
    }

    /// The latency's ceiling under load: documents like the bench's handed at `rate` a
    /// second straight to a raw `_bulk` writer (whatever is queued goes in the next
    /// request, with the etl's batch size and requests in flight) on a scratch index of the
    /// same server, each probed the same way from the moment it is handed over.
    async fn raw_latency(&mut self, samples: usize, rate: f64) -> anyhow::Result<Latency> {
        let es = self.ctx.stack.es.clone();
        let index = self.scratch_index("bench_rawlat").await?;
        let (docs, writes) = mpsc::unbounded_channel::<BulkOp>();
        let writer = tokio::spawn(ceiling::raw_writer(es.clone(), writes));
        let probe = Probe::start(es.clone(), index.clone());
        let mut rng = Xorshift(0x5eed_1234_abcd_0004);
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        for n in 1..=samples as u64 {
            tick.tick().await;
            if docs.send(bench_doc(&mut rng, &index, n)).is_err() {
                break;
            }
            probe.watch(n.to_string());
        }
        drop(docs);
        let latency = probe.finish(samples, started).await?;
        writer.await??;
        es.delete_index(&index).await?;
        self.raw_index = None;
        println!(
            "[4/5] handed-to-indexed latency of a raw _bulk writer, same load (ceiling): {}",
            latency.describe()
        );
        Ok(latency)
    }

    /// The latency's floor under load: the sink alone, one writer handing it `samples`
    /// documents like the bench's at `rate` a second, a bulk every 100 ms, with no probe
    /// and nothing else running. Each bulk's answer time, and the rate kept.
    async fn sink_alone(&mut self, samples: usize, rate: f64) -> anyhow::Result<Latency> {
        let es = self.ctx.stack.es.clone();
        let index = self.scratch_index("bench_pace").await?;
        let mut rng = Xorshift(0x5eed_1234_abcd_0005);
        let ops: Vec<BulkOp> = (1..=samples as u64)
            .map(|id| bench_doc(&mut rng, &index, id))
            .collect();
        let every = Duration::from_millis(100);
        let per_bulk = (rate * every.as_secs_f64()).round().max(1.0) as usize;
        let (sorted_ms, kept) = ceiling::paced_bulks(&es, &ops, per_bulk, every).await?;
        es.delete_index(&index).await?;
        self.raw_index = None;
        let alone = Latency::of_bulks(sorted_ms, kept);
        println!(
            "[4/5] the sink alone, one writer, {per_bulk} documents every 100 ms: each bulk answered in {}",
            alone.describe_bulks()
        );
        Ok(alone)
    }

    /// Every process's memory; the services' with the most sampled while `streaming`.
    fn rss(&self, streaming: &BTreeMap<u32, u64>) -> Vec<Rss> {
        let mut out = Vec::new();
        for s in [&self.worker, &self.etl].into_iter().flatten() {
            let (peak_kb, now_kb) = s.pid().map(proc_rss).unwrap_or_default();
            out.push(Rss {
                name: s.bin.to_owned(),
                pid: s.pid(),
                peak_kb,
                now_kb,
                streaming_kb: s.pid().and_then(|pid| streaming.get(&pid).copied()),
                note: "this run",
            });
        }
        let stack = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.work/stack");
        for (svc, marker) in [
            ("mariadb", "mariadbd"),
            ("mysql", "mysqld"),
            ("zookeeper", "QuorumPeerMain"),
            ("kafka", "kafka.Kafka"),
            ("opensearch", "org.opensearch.bootstrap.OpenSearch"),
        ] {
            let pid = std::fs::read_to_string(stack.join(svc).join(format!("{svc}.pid")))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|c| String::from_utf8_lossy(&c).contains(marker))
                        .unwrap_or(false)
                });
            let (peak_kb, now_kb) = pid.map(proc_rss).unwrap_or_default();
            out.push(Rss {
                name: svc.to_owned(),
                pid,
                peak_kb,
                now_kb,
                streaming_kb: None,
                note: if pid.is_some() {
                    "since the stack started"
                } else {
                    "not a local stack process"
                },
            });
        }
        out
    }

    /// Stops the services and removes what the run created: the database, the indexes,
    /// the topics, the ZK root.
    async fn cleanup(&mut self) {
        for s in [&mut self.etl, &mut self.worker].into_iter().flatten() {
            if s.is_running() {
                s.terminate(Duration::from_secs(30));
            }
        }
        if let Some(index) = self.raw_index.take() {
            if let Err(e) = self.ctx.stack.es.delete_index(&index).await {
                println!("cleanup: cannot delete index {index}: {e}");
            }
        }
        let removed = self.ctx.cleanup().await;
        let zk_note = match delete_zk_root(&self.ctx.stack.zookeeper, &self.ctx.zk_root).await {
            Ok(()) => format!("ZooKeeper {} deleted", self.ctx.zk_root),
            Err(e) => format!("ZooKeeper {} left ({e})", self.ctx.zk_root),
        };
        println!("cleanup: services stopped, {removed}, {zk_note}");
    }
}

/// Polls `alias` by id (`_mget`, a real-time read, one request for every id in flight)
/// for each id it is told to watch, from that moment until it is visible or 30 s passed.
/// Document `id` of `index`, shaped like the etl's documents of the bench's table.
fn bench_doc(rng: &mut Xorshift, index: &str, id: u64) -> BulkOp {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let mut doc = Map::new();
    doc.insert("id".into(), id.into());
    doc.insert("k".into(), rng.below(1_000_000).into());
    doc.insert("c".into(), rng.text(60, 100).into());
    doc.insert("pad".into(), rng.text(40, 60).into());
    doc.insert(
        "ts".into(),
        format!(
            "{}.{:06}",
            sluice_mysql::decode::utc_datetime(now - rng.below(3600) as i64),
            rng.below(1_000_000)
        )
        .into(),
    );
    BulkOp::Index {
        index: index.to_owned(),
        id: id.to_string(),
        version: id,
        routing: None,
        doc: Value::Object(doc),
    }
}

/// Samples the `VmRSS` of services every 100 ms until finished: the most of each, by pid.
struct RssWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<BTreeMap<u32, u64>>,
}

impl RssWatch {
    fn start<'a>(services: impl IntoIterator<Item = &'a Option<Service>>) -> RssWatch {
        let pids: Vec<u32> = services
            .into_iter()
            .flatten()
            .filter_map(Service::pid)
            .collect();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut most = BTreeMap::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                for &pid in &pids {
                    if let (_, Some(kb)) = proc_rss(pid) {
                        let m = most.entry(pid).or_insert(0);
                        *m = kb.max(*m);
                    }
                }
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = &mut stopped => return most,
                }
            }
        });
        RssWatch { stop, task }
    }

    async fn finish(self) -> BTreeMap<u32, u64> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// (`VmHWM`, `VmRSS`) in kB.
fn proc_rss(pid: u32) -> (Option<u64>, Option<u64>) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn fmt_kb(kb: Option<u64>) -> String {
    match kb {
        Some(kb) => format!("{:.1} MiB", kb as f64 / 1024.0),
        None => "n/a".into(),
    }
}

/// `deleteall` with the ZooKeeper CLI the local stack runs on (best effort).
async fn delete_zk_root(connect: &str, root: &str) -> anyhow::Result<()> {
    let server = connect.split('/').next().unwrap_or(connect);
    let run = tokio::process::Command::new("java")
        .args([
            "-cp",
            "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-nop.jar",
            "org.apache.zookeeper.ZooKeeperMain",
            "-server",
            server,
            "deleteall",
            root,
        ])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .context("zookeeper CLI timed out")?
        .context("cannot run the zookeeper CLI (java)")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || text.contains("Exception") {
        bail!("zookeeper CLI: {}", text.lines().last().unwrap_or("failed"));
    }
    Ok(())
}

impl Report {
    /// The figures, each with its ceiling where the run measured one or the issue set one
    /// (100 ms p99 latency; 64 MiB for the worker while streaming and 128 MiB for the etl
    /// at its peak).
    fn figures(&self) -> Figures {
        let mut f = Figures::new();
        f.insert(
            "worker_events_per_s".into(),
            // The target for one worker on one core.
            Figure::higher(self.worker.rate(), "events/s", Some(150_000.0)),
        );
        f.insert(
            "etl_docs_per_s".into(),
            Figure::higher(self.etl.rate(), "docs/s", Some(self.raw.rate())),
        );
        if let Some(full) = self.etl_on_full_cores {
            f.insert(
                "etl_docs_per_s_on_full_cores".into(),
                Figure::higher(full, "docs/s", Some(ETL_SHARE * self.raw.rate())),
            );
        }
        for (name, l) in [
            ("light", &self.latency),
            ("loaded", &self.loaded),
            ("loaded_raw", &self.loaded_raw),
        ] {
            f.insert(
                format!("latency_{name}_p50_ms"),
                Figure::lower(l.pct(50.0), "ms", None),
            );
            f.insert(
                format!("latency_{name}_p99_ms"),
                Figure::lower(l.pct(99.0), "ms", Some(100.0)),
            );
        }
        // No pipeline's p99 at this rate can be below the sink's own answer time.
        f.insert(
            "sink_alone_bulk_p99_ms".into(),
            Figure::lower(self.sink_alone.pct(99.0), "ms", Some(100.0)),
        );
        // The bounds: the worker's steady memory (while streaming), and the etl's
        // peak, which covers the big transaction.
        let rss = |name: &str| self.rss.iter().find(|r| r.name == name);
        if let Some(r) = rss("sluice-worker") {
            if let Some(kb) = r.streaming_kb {
                f.insert(
                    "rss_worker_streaming_mib".into(),
                    Figure::lower(kb as f64 / 1024.0, "MiB", Some(64.0)),
                );
            }
            if let Some(kb) = r.peak_kb {
                f.insert(
                    "rss_worker_mib".into(),
                    Figure::lower(kb as f64 / 1024.0, "MiB", None),
                );
            }
        }
        if let Some(kb) = rss("sluice-etl").and_then(|r| r.peak_kb) {
            f.insert(
                "rss_etl_mib".into(),
                Figure::lower(kb as f64 / 1024.0, "MiB", Some(128.0)),
            );
        }
        f
    }

    /// Prints each ratio, writes the figures under `target/bench/`, and says loudly which
    /// ratios fell against the committed baseline.
    fn judge(&self) {
        figures::report("bench", &self.figures());
    }

    fn print(&self) {
        let l = &self.load;
        println!();
        println!(
            "== sluice bench: {} transactions ({} inserts, {} updates, {} deletes = {} events; {} rows remain), binaries from {} ==",
            l.transactions,
            l.inserted,
            l.updated,
            l.deleted,
            l.events(),
            self.etl_docs,
            self.bin_dir
        );
        let rows: Vec<(String, String)> = vec![
            (
                "binlog→Kafka (worker alone)".into(),
                format!(
                    "{:>8.0} events/s   ({} events confirmed in {:.2} s from the worker's start; \
                     first published at {:.2} s, {:.0}/s from there)",
                    self.worker.rate(),
                    self.worker.count,
                    self.worker.total.as_secs_f64(),
                    self.worker.startup.unwrap_or_default().as_secs_f64(),
                    self.worker.steady_rate().unwrap_or(f64::NAN)
                ),
            ),
            (
                "Kafka→Elasticsearch (etl)".into(),
                format!(
                    "{:>8.0} docs/s     ({} docs / {} events in {:.2} s; first bulk answered at {:.2} s; {:.0}/s after that)",
                    self.etl.rate(),
                    self.etl.count,
                    self.kafka_events,
                    self.etl.total.as_secs_f64(),
                    self.etl.startup.unwrap_or_default().as_secs_f64(),
                    self.etl.steady_rate().unwrap_or(f64::NAN)
                ),
            ),
            (
                "raw _bulk, same ES (ceiling)".into(),
                format!(
                    "{:>8.0} docs/s     ({} docs in {:.2} s, {}); etl at {:.0} % of it",
                    self.raw.rate(),
                    self.raw.count,
                    self.raw.total.as_secs_f64(),
                    ceiling::describe(),
                    100.0 * self.etl.rate() / self.raw.rate()
                ),
            ),
            ("commit→indexed latency, light".into(), self.latency.describe()),
            (
                "commit→indexed, under load".into(),
                self.loaded.describe(),
            ),
            (
                "same load, raw _bulk (ceiling)".into(),
                self.loaded_raw.describe(),
            ),
            (
                "same rate, the sink alone".into(),
                format!("a bulk answered in {}", self.sink_alone.describe_bulks()),
            ),
        ];
        for (name, value) in rows {
            println!("{name:<30} {value}");
        }
        println!(
            "{:<30} {:>10} {:>10} {:>10}  {:>8}",
            "RSS (peak = VmHWM)", "peak", "streaming", "now", "pid"
        );
        for r in &self.rss {
            println!(
                "  {:<28} {:>10} {:>10} {:>10}  {:>8}  {}",
                r.name,
                fmt_kb(r.peak_kb),
                fmt_kb(r.streaming_kb),
                fmt_kb(r.now_kb),
                r.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                r.note
            );
        }
    }
}
