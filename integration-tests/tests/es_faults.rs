//! Elasticsearch misbehaving between the etl and its index, through the fault proxy:
//! bursts of 429 (retried with backoff and counted as throttling, not as failures), 503
//! answers, a `_bulk` lost before the server had it whole and one lost after the server
//! applied it. While a bulk keeps failing, no Kafka offset passes its items; an etl killed
//! then, once Elasticsearch is back, writes them. Every phase ends with the checker. And
//! with several bulks in flight, one held back holds every offset behind it; documents
//! read back from MySQL, written in several bulks at once, meet the same faults.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_integration_tests::proxy::{HttpFault, HttpProxy};
use sluice_integration_tests::{
    check_documents, eventually, shop, Pipeline, Running, Service, TestCtx,
};

const WITHIN: Duration = Duration::from_secs(90);

async fn bulk_errors(etl: &Service, class: &str) -> f64 {
    etl.metric("sluice_etl_bulk_errors_total", &[("class", class)])
        .await
}

async fn stale_documents(etl: &Service) -> f64 {
    etl.metric("sluice_etl_documents_total", &[("result", "stale")])
        .await
}

/// A test's context with table `item`, its pipeline, and the fault proxy between the
/// services and Elasticsearch's `_bulk`.
async fn item_behind_proxy(name: &str) -> (TestCtx, HttpProxy, Pipeline) {
    let ctx = TestCtx::new(name).await;
    ctx.exec("CREATE TABLE item (id INT PRIMARY KEY, qty INT, note VARCHAR(40))")
        .await;
    let proxy = HttpProxy::start(&ctx.stack.es_url, "_bulk").await;
    ctx.route_elasticsearch(&proxy.url());
    let pipeline = ctx.pipeline("item");
    (ctx, proxy, pipeline)
}

/// Inserts, updates and deletes on `item`, different for each `round`.
async fn change(ctx: &TestCtx, round: u32) {
    let base = round * 100;
    let values: Vec<String> = (base..base + 20)
        .map(|id| format!("({id}, {round}, 'r{round}')"))
        .collect();
    ctx.exec(&format!("INSERT INTO item VALUES {}", values.join(", ")))
        .await;
    ctx.exec(&format!(
        "UPDATE item SET qty = qty + 1, note = 'u{round}' WHERE id % 3 = {}",
        round % 3
    ))
    .await;
    ctx.exec(&format!(
        "DELETE FROM item WHERE id BETWEEN {base} AND {}",
        base + 4
    ))
    .await;
}

async fn served(proxy: &HttpProxy, run: &Running) {
    eventually("the injected faults served", WITHIN, || async {
        match proxy.pending() {
            0 => Ok(()),
            n => Err(format!("{n} faults still queued\n{}", run.logs())),
        }
    })
    .await;
}

/// Waits until at least `n` bulk requests reached the proxy since it had seen `seen`.
async fn retried(proxy: &HttpProxy, seen: u64, n: u64) {
    eventually("the etl retried the failing bulks", WITHIN, || async {
        match proxy.requests() - seen {
            got if got >= n => Ok(()),
            got => Err(format!("{got} bulk requests since the changes")),
        }
    })
    .await;
}

/// Waits until the etl committed everything the worker published to `topic` so far;
/// where each partition ends.
async fn all_committed(ctx: &TestCtx, run: &Running, topic: &str) -> BTreeMap<i32, i64> {
    ctx.wait_streamed(&run.worker).await;
    let ends = sluice_integration_tests::kafka::ends(&ctx.read_topic(topic, 1, WITHIN).await);
    eventually("the etl committed all it applied", WITHIN, || async {
        ctx.etl_committed_up_to(topic, &ends).await
    })
    .await;
    ends
}

/// Kills the etl with `kill -9`, lets Elasticsearch answer again (`heal`), restarts the
/// etl and waits until the index equals the table.
async fn restart_converges(
    ctx: &TestCtx,
    run: &mut Running,
    pipeline: &Pipeline,
    heal: impl FnOnce(),
) {
    run.etl.kill9();
    heal();
    run.etl.start();
    ctx.converges(run, pipeline, WITHIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_errors_and_lost_bulks_lose_nothing_and_pass_no_offset() {
    let (ctx, proxy, pipeline) = item_behind_proxy("esfault").await;
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;
    change(&ctx, 1).await;
    ctx.converges(&run, &pipeline, WITHIN).await;

    // A burst of 429s: retried with backoff, counted as throttling and not as failures.
    let (throttled, failed) = (
        bulk_errors(&run.etl, "throttled").await,
        bulk_errors(&run.etl, "request").await,
    );
    let mark = run.etl.log_mark();
    proxy.inject(HttpFault::Answer(429), 4);
    change(&ctx, 2).await;
    served(&proxy, &run).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
    // ...and fewer bulks are sent at once while it lasts.
    run.etl
        .logged_since(
            mark,
            &["Elasticsearch is throttling: fewer bulks in flight"],
        )
        .expect("a throttled batch halves the bulks in flight");
    assert!(
        bulk_errors(&run.etl, "throttled").await >= throttled + 4.0,
        "4 answers of 429 are counted as throttling"
    );
    assert_eq!(
        bulk_errors(&run.etl, "request").await,
        failed,
        "a 429 is not counted as a failed request"
    );

    // 503s are failures, retried.
    proxy.inject(HttpFault::Answer(503), 3);
    change(&ctx, 3).await;
    served(&proxy, &run).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
    assert!(bulk_errors(&run.etl, "request").await >= failed + 3.0);

    // A bulk that keeps failing: its items' offsets are never committed. Everything so
    // far is committed first.
    let topic = ctx.topic("item");
    let ends = all_committed(&ctx, &run, &topic).await;
    proxy.inject(HttpFault::Answer(503), 100_000);
    let seen = proxy.requests();
    change(&ctx, 4).await;
    ctx.wait_streamed(&run.worker).await;
    retried(&proxy, seen, 3).await;
    assert_eq!(
        ctx.committed(&topic).await,
        ends,
        "no offset passes items neither applied nor dead-lettered"
    );
    // Killed while retrying, restarted once Elasticsearch answers again: the items come
    // again from the committed offsets.
    restart_converges(&ctx, &mut run, &pipeline, || proxy.clear()).await;

    // A bulk lost before the server had all of it, then one lost after it was applied
    // (the retry finds its items already there: stale, harmless).
    proxy.inject(HttpFault::DropBeforeForward, 2);
    change(&ctx, 5).await;
    served(&proxy, &run).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
    let stale_before = stale_documents(&run.etl).await;
    proxy.inject(HttpFault::DropAfterForward, 2);
    change(&ctx, 6).await;
    served(&proxy, &run).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
    // The documents are there from the first attempt; the etl learns it on its retry.
    eventually(
        "the unheard bulk sent again and found stale",
        WITHIN,
        || async {
            match stale_documents(&run.etl).await - stale_before {
                n if n > 0.0 => Ok(()),
                _ => Err(format!("no stale item since\n{}", run.logs())),
            }
        },
    )
    .await;

    let dead = run.etl.metric("sluice_etl_dead_letters_total", &[]).await;
    assert_eq!(dead, 0.0, "nothing was dead-lettered\n{}", run.logs());
}

/// Several batches are written at once, and they land in the order they were consumed:
/// while the oldest batch's bulk is held, later batches are written, up to twice the
/// limit of bulks in flight, but no offset is committed; an etl killed then replays from
/// the last commit and loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_bulk_lets_later_batches_through_and_holds_every_offset_behind_it() {
    let (ctx, proxy, pipeline) = item_behind_proxy("esflight").await;
    let etl = ctx
        .etl(std::slice::from_ref(&pipeline))
        .with_env("SLUICE_ETL__MAX_BATCH_DOCS", "100")
        .with_env("SLUICE_ETL__MAX_IN_FLIGHT", "4");
    let mut run = ctx.run(ctx.worker(), etl).await;
    change(&ctx, 1).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
    let topic = ctx.topic("item");
    let ends = all_committed(&ctx, &run, &topic).await;
    let (es, alias) = (&ctx.stack.es, &pipeline.alias);
    let indexed = || async {
        let _ = es.refresh(alias).await;
        es.count(alias).await.unwrap_or(0)
    };
    let before = indexed().await;

    // The next bulk is held: a lone row's, so that the held batch is the oldest (bulks
    // of batches in flight together may reach the server in any order). 1,000 new rows
    // follow, in transactions of 100.
    proxy.inject(HttpFault::Hold, 1);
    ctx.exec("INSERT INTO item VALUES (9999, 0, 'held')").await;
    eventually("the lone row's bulk held", WITHIN, || async {
        match proxy.held() {
            1 => Ok(()),
            n => Err(format!("{n} bulks held\n{}", run.logs())),
        }
    })
    .await;
    for t in 0..10 {
        let values: Vec<String> = (0..100)
            .map(|i| 10_000 + t * 100 + i)
            .map(|id| format!("({id}, {t}, 'flight')"))
            .collect();
        ctx.exec(&format!("INSERT INTO item VALUES {}", values.join(", ")))
            .await;
    }
    ctx.wait_streamed(&run.worker).await;
    // Later batches are written while the oldest waits...
    eventually(
        "later batches written past the held one",
        WITHIN,
        || async {
            match indexed().await - before {
                n if n >= 100 => Ok(()),
                n => Err(format!("{n} new documents\n{}", run.logs())),
            }
        },
    )
    .await;
    // ...until as many batches wait to land as may: twice the limit of 4, less the held one.
    eventually(
        "batches waiting behind the held one up to the cap",
        WITHIN,
        || async {
            match run.etl.metric("sluice_etl_batches_waiting", &[]).await {
                7.0 => Ok(()),
                n => Err(format!("{n} batches waiting\n{}", run.logs())),
            }
        },
    )
    .await;
    let written = indexed().await - before;
    eprintln!("held bulk: {written} documents written behind it, 7 batches waiting");
    assert!(
        (100..=700).contains(&written),
        "seven batches of at most 100 documents are written behind the held one, and no more ({written} new documents)"
    );
    // ...and none of them commits: the oldest is not finished.
    assert_eq!(
        ctx.committed(&topic).await,
        ends,
        "no offset passes the held batch, in any partition"
    );

    // Killed with the bulk still held: the restarted etl replays every uncommitted batch.
    restart_converges(&ctx, &mut run, &pipeline, || proxy.release()).await;
    let dead = run.etl.metric("sluice_etl_dead_letters_total", &[]).await;
    assert_eq!(dead, 0.0, "nothing was dead-lettered\n{}", run.logs());
    drop(run);
    ctx.cleanup().await;
}

/// `log` without the terminal colours (`ESC [ … m`) the services write.
fn without_colours(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut rest = log;
    while let Some(at) = rest.find('\x1b') {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once('m').map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out
}

/// The pauses the etl logged before retrying a failed bulk request (`retry_in=`, as
/// `Debug` prints a `Duration`), in order.
fn retry_pauses(log: &str) -> Vec<Duration> {
    without_colours(log)
        .lines()
        .filter(|l| l.contains("bulk request failed; retrying"))
        .filter_map(|l| l.split_once("retry_in=")?.1.split_whitespace().next())
        .map(|d| {
            let (number, unit) = d.split_at(d.find(|c: char| c.is_alphabetic()).unwrap_or(d.len()));
            let n: f64 = number.parse().unwrap_or_else(|_| panic!("a pause: {d}"));
            let scale = match unit {
                "s" => 1.0,
                "ms" => 1e-3,
                "µs" => 1e-6,
                "ns" => 1e-9,
                other => panic!("unit {other} in {d}"),
            };
            Duration::from_secs_f64(n * scale)
        })
        .collect()
}

/// A bulk refused again and again waits at most `etl.retry_backoff_max` between its
/// attempts, so that once the server answers again the writes behind it wait no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_refused_again_and_again_waits_at_most_the_longest_pause() {
    let (ctx, proxy, pipeline) = item_behind_proxy("esbackoff").await;
    let etl = ctx
        .etl(std::slice::from_ref(&pipeline))
        .with_env("SLUICE_ETL__RETRY_BACKOFF", "200ms")
        .with_env("SLUICE_ETL__RETRY_BACKOFF_MAX", "400ms");
    let run = ctx.run(ctx.worker(), etl).await;
    change(&ctx, 1).await;
    ctx.converges(&run, &pipeline, WITHIN).await;

    // One row, so one bulk: it meets six 429s in a row.
    let mark = run.etl.log_mark();
    proxy.inject(HttpFault::Answer(429), 6);
    ctx.exec("INSERT INTO item VALUES (9999, 0, 'refused')")
        .await;
    served(&proxy, &run).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
    // Each pause is jittered between half and all of its nominal length, which doubles
    // from etl.retry_backoff up to etl.retry_backoff_max and no further.
    let pauses = retry_pauses(&run.etl.log_since(mark));
    let nominal = [200, 400, 400, 400, 400, 400].map(Duration::from_millis);
    assert_eq!(pauses.len(), nominal.len(), "{pauses:?}\n{}", run.logs());
    for (pause, n) in pauses.iter().zip(nominal) {
        assert!(
            *pause >= n / 2 && *pause <= n,
            "a pause of {pause:?} where {n:?} was due, jittered to no less than half: {pauses:?}\n{}",
            run.logs()
        );
    }
}

/// Documents read back from MySQL go out in several bulks at once: a rename under 500
/// documents, in bulks of 100, through 429s and bulks lost before and after the server
/// applied them, loses nothing; while such a bulk keeps failing, no offset passes the
/// change behind it, and an etl killed then writes it once Elasticsearch is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_read_back_in_several_bulks_lose_nothing_and_pass_no_offset() {
    let ctx = TestCtx::new("esfaulttree").await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let proxy = HttpProxy::start(&ctx.stack.es_url, "_bulk").await;
    ctx.route_elasticsearch(&proxy.url());
    let etl = ctx
        .etl_with(std::slice::from_ref(&spec))
        .with_env("SLUICE_ETL__MAX_BATCH_DOCS", "100")
        .with_env("SLUICE_ETL__MAX_IN_FLIGHT", "4");
    let mut run = ctx.run(ctx.worker(), etl).await;
    shop::data(&ctx, 500, 500).await;
    let converged = async |run: &Running, what: &str| {
        eventually(what, WITHIN, || async {
            check_documents(&ctx, &spec)
                .await
                .map_err(|e| format!("{e}\n{}", run.logs()))
        })
        .await
    };
    converged(&run, "the shop indexed").await;

    proxy.inject(HttpFault::Answer(429), 3);
    proxy.inject(HttpFault::DropBeforeForward, 2);
    proxy.inject(HttpFault::DropAfterForward, 2);
    ctx.exec("UPDATE brands SET name = 'renamed once' WHERE id = 1")
        .await;
    served(&proxy, &run).await;
    converged(&run, "the rename through the faults").await;

    let topic = ctx.topic("brands");
    let ends = all_committed(&ctx, &run, &topic).await;
    proxy.inject(HttpFault::Answer(503), 100_000);
    let seen = proxy.requests();
    ctx.exec("UPDATE brands SET name = 'renamed twice' WHERE id = 1")
        .await;
    ctx.wait_streamed(&run.worker).await;
    retried(&proxy, seen, 8).await;
    assert_eq!(
        ctx.committed(&topic).await,
        ends,
        "no offset passes a change whose documents are not written"
    );
    run.etl.kill9();
    proxy.clear();
    run.etl.start();
    converged(&run, "the second rename after a restart").await;

    let dead = run.etl.metric("sluice_etl_dead_letters_total", &[]).await;
    assert_eq!(dead, 0.0, "nothing was dead-lettered\n{}", run.logs());
}
