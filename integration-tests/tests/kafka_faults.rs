//! Kafka unreachable for a long while, on a broker of the test's own behind the fault
//! proxy, while writes go on: the worker's in-flight bound turns the outage into
//! backpressure on the binlog reader (its published count stops, its memory stays flat),
//! the confirmed position does not move past anything Kafka did not take, and once the
//! broker is reachable again every change flows and the index equals the table: the
//! etl's consumer, which holds its partitions without a group session, fetches again by
//! itself.
//! `KAFKA_OUTAGE_SECS` sets the outage (default 120).

use std::time::{Duration, Instant};

use sluice_integration_tests::broker::PrivateKafka;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::proxy::Mode;
use sluice_integration_tests::{env_num, eventually, TestCtx};

const WITHIN: Duration = Duration::from_secs(180);
/// Entries (events and commit points) the worker may have in flight; the load's
/// single-row transactions take two each.
const IN_FLIGHT: f64 = 1_000.0;

on_sources!(kafka_unreachable_for_a_long_while_holds_the_position_and_memory_then_flows: mariadb, mysql);
async fn kafka_unreachable_for_a_long_while_holds_the_position_and_memory_then_flows() {
    let outage = Duration::from_secs(env_num("KAFKA_OUTAGE_SECS", 120).expect("KAFKA_OUTAGE_SECS"));
    let kafka = PrivateKafka::start().await;
    let ctx = TestCtx::new("kafkadown").await;
    ctx.route_kafka(&kafka.brokers());
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT, note VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("acct");
    let worker = ctx
        .worker()
        .with_env("SLUICE_WORKER__MAX_IN_FLIGHT", &IN_FLIGHT.to_string());
    let etl = ctx.etl(std::slice::from_ref(&pipeline));
    let run = ctx.run(worker, etl).await;
    ctx.exec(&format!(
        "INSERT INTO acct SELECT seq, seq, 'before' FROM {}",
        sluice_integration_tests::seq(1, 500)
    ))
    .await;
    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;

    let load = ctx.load(Duration::from_millis(5), |n| {
        let id = n % 2_000;
        vec![format!(
            "INSERT INTO acct VALUES ({id}, {n}, 'load{n}') ON DUPLICATE KEY UPDATE balance = {n}, note = 'up{n}'"
        )]
    });
    kafka.proxy.set(Mode::Blackhole);
    let down = Instant::now();
    let held = ctx.checkpoint().await.expect("checkpoint");
    let published_at_cut = run.worker.metric("sluice_worker_events_total", &[]).await;

    // Backpressure: the reader stops once the in-flight bound is reached (the bound
    // counts commit points too, those of other tests' transactions on the shared server
    // among them): the count stays put for 3 s while the load goes on.
    let state = std::sync::Mutex::new((f64::NAN, Instant::now(), load.rounds()));
    eventually("the worker stops publishing", WITHIN, || async {
        let n = run.worker.metric("sluice_worker_events_total", &[]).await - published_at_cut;
        let rounds = load.rounds();
        let mut s = state.lock().unwrap();
        if n != s.0 {
            *s = (n, Instant::now(), rounds);
            return Err(format!("{n} events published since the cut, still growing"));
        }
        let (still, more) = (s.1.elapsed(), rounds - s.2);
        if n > 0.0 && still >= Duration::from_secs(3) && more >= 10 {
            Ok(())
        } else {
            Err(format!(
                "{n} events published since the cut, unchanged for {still:?} over {more} load rounds"
            ))
        }
    })
    .await;
    let rss_at_bound = run.worker.rss().expect("worker RSS");
    let mut samples = 0;
    while down.elapsed() < outage {
        // The outage lasts `outage`; meanwhile, every second, what must hold does.
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples += 1;
        let cp = ctx.checkpoint().await.expect("checkpoint");
        assert_eq!(
            cp.position, held.position,
            "the confirmed position moved while Kafka was unreachable"
        );
        let n = run.worker.metric("sluice_worker_events_total", &[]).await - published_at_cut;
        assert!(
            n <= IN_FLIGHT + 100.0,
            "{n} events handed to Kafka during the outage, past the in-flight bound of {IN_FLIGHT}"
        );
    }
    let rss_late = run.worker.rss().expect("worker RSS");
    let grown = rss_late.saturating_sub(rss_at_bound) as f64 / (1 << 20) as f64;
    assert!(
        grown < 16.0,
        "the worker's memory grew {grown:.1} MiB while Kafka was unreachable ({samples} s)"
    );

    kafka.proxy.set(Mode::Open);
    let rounds = load.stop().await;
    assert!(rounds > 1_000, "writes went on throughout ({rounds})");
    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
}

/// With a bounded `kafka.message_timeout`, events Kafka does not acknowledge in time fail:
/// the task stops short of confirming them, says so, and resumes from its confirmed
/// position once Kafka is back; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_past_the_message_timeout_fail_and_the_task_resumes_from_its_confirmed_position() {
    let kafka = PrivateKafka::start().await;
    let ctx = TestCtx::new("kafkatimeout").await;
    ctx.route_kafka(&kafka.brokers());
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT)")
        .await;
    let pipeline = ctx.pipeline("acct");
    let worker = ctx.worker().with_env("SLUICE_KAFKA__MESSAGE_TIMEOUT", "3s");
    let etl = ctx.etl(std::slice::from_ref(&pipeline));
    let run = ctx.run(worker, etl).await;
    ctx.exec(&format!(
        "INSERT INTO acct SELECT seq, seq FROM {}",
        sluice_integration_tests::seq(1, 100)
    ))
    .await;
    ctx.converges(&run, &pipeline, WITHIN).await;

    let load = ctx.load(Duration::from_millis(20), |n| {
        let id = n % 500;
        vec![format!(
            "INSERT INTO acct VALUES ({id}, {n}) ON DUPLICATE KEY UPDATE balance = {n}"
        )]
    });
    kafka.proxy.set(Mode::Blackhole);
    // Acknowledgements from before the cut may still be confirmed for a while (a loaded
    // machine can hold them back longer than any quiet spell shows), but once the task
    // failed on a timed-out event, its position is final until Kafka is back: the next
    // attempt starts there and every event it publishes times out again. (A DDL of
    // another test's database, in the shared binlog, can make the first Kafka call a
    // topic creation instead, which times out as `OperationTimedOut (Local: Timed out)`.)
    let (ctx, log) = (&ctx, &run.worker.log);
    let failed = |times: usize| async move {
        eventually(
            &format!("the task fails on timed-out events {times} times"),
            WITHIN,
            || async {
                let log = std::fs::read_to_string(log).map_err(|e| e.to_string())?;
                let seen = log
                    .lines()
                    .filter(|l| l.contains("task failed") && l.to_lowercase().contains("timed out"))
                    .count();
                (seen >= times)
                    .then_some(())
                    .ok_or_else(|| format!("{seen} so far"))
            },
        )
        .await;
        ctx.checkpoint().await.expect("checkpoint")
    };
    let held = failed(1).await;
    let after_a_retry = failed(2).await;
    assert_eq!(
        after_a_retry.position, held.position,
        "the confirmed position moved past events Kafka never acknowledged"
    );

    kafka.proxy.set(Mode::Open);
    load.wait_rounds(20, WITHIN).await;
    load.stop().await;
    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
}

/// The center probes Kafka as it probes its meta database and ZooKeeper: while the
/// brokers do not answer, `sluice_center_dependency_up{dependency="kafka"}` is 0 and the
/// health of `sluice.dependency.kafka` NOT_SERVING (what the `SluiceKafkaUnreachable`
/// alert reads); once they answer, 1 and SERVING again. Its own health does not change:
/// a center serves its API without Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_center_says_whether_the_kafka_brokers_answer() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let kafka = PrivateKafka::start().await;
    let ctx = TestCtx::new("kafkaprobe").await;
    ctx.route_kafka(&kafka.brokers());
    let cluster = ctx.start_cluster(1, 0).await;
    let center = &cluster.centers[0];
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addrs[0]))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel);
    let status = |service: &'static str| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .map(|r| r.into_inner().status)
                .map_err(|e| e.to_string())
        }
    };
    // 1: SERVING, 2: NOT_SERVING.
    let says = |up: f64, serving: i32| {
        let status = &status;
        async move {
            let metric = center
                .metric("sluice_center_dependency_up", &[("dependency", "kafka")])
                .await;
            let kafka = status("sluice.dependency.kafka").await?;
            let own = status("").await?;
            if metric == up && kafka == serving && own == 1 {
                Ok(())
            } else {
                Err(format!(
                    "dependency_up {metric}, kafka's health {kafka}, the center's {own}"
                ))
            }
        }
    };
    eventually("Kafka answers the center", WITHIN, || says(1.0, 1)).await;
    kafka.proxy.set(Mode::Blackhole);
    eventually("the center says Kafka does not answer", WITHIN, || {
        says(0.0, 2)
    })
    .await;
    assert_eq!(
        center
            .metric("sluice_center_dependency_up", &[("dependency", "meta")])
            .await,
        1.0,
        "the meta database still answers"
    );
    kafka.proxy.set(Mode::Open);
    eventually("the center says Kafka answers again", WITHIN, || {
        says(1.0, 1)
    })
    .await;
}
