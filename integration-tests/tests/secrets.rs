//! A whole cluster runs with every secret set (the meta database's and the source's
//! MySQL passwords, the admin and the workers' API tokens, ZooKeeper's digest credential,
//! Elasticsearch's and Kafka's passwords), streams, builds and refuses a wrong token; none
//! of the secrets is then found in any line any service logged, even at debug level, nor
//! in any service's `/metrics`.

use std::time::Duration;

use sluice_integration_tests::stack::{random_hex, OwnAccounts};
use sluice_integration_tests::{Stack, TestCtx};

/// Sluice's own crates at debug, the rest at the shipped default.
const VERBOSE: &str = "info,librdkafka=warn,zookeeper_async=error,sluice_center=debug,sluice_worker=debug,sluice_etl=debug,sluice_zk=debug,sluice_kafka=debug,sluice_mysql=debug,sluice_elastic=debug,sluice_model=debug";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_metrics() {
    // MySQL accounts of this test's own, with passwords found nowhere else.
    let accounts = OwnAccounts::create(&Stack::connect().await, "").await;
    let ctx = TestCtx::on("secrets", accounts.stack.clone()).await;
    let es_pw = format!("es-{}", random_hex());
    let kafka_pw = format!("kafka-{}", random_hex());
    for bin in ["sluice-center", "sluice-worker", "sluice-etl"] {
        ctx.env_for(bin, "RUST_LOG", VERBOSE);
        ctx.env_for(bin, "SLUICE_KAFKA__SASL_PASSWORD", &kafka_pw);
    }
    for bin in ["sluice-center", "sluice-etl"] {
        ctx.env_for(bin, "SLUICE_ELASTICSEARCH__USERNAME", "sluice");
        ctx.env_for(bin, "SLUICE_ELASTICSEARCH__PASSWORD", &es_pw);
    }
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one'), (2, 'two')")
        .await;
    let cluster = ctx.start_cluster(2, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    cluster
        .ctl(&["pipelines", "build", &items.pipeline.alias])
        .unwrap();
    cluster
        .wait_built(&items.pipeline.alias, Duration::from_secs(120))
        .await;
    ctx.exec("INSERT INTO items VALUES (3, 'three')").await;
    ctx.exec("UPDATE items SET name = 'uno' WHERE id = 1").await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    // A caller with a wrong token is refused (and the refusal logged nowhere with a token).
    let wrong = format!("not-{}", ctx.secrets.api_token);
    let (ok, _) = cluster.ctl_as(Some(&wrong), &["sources", "list"]);
    assert!(!ok);

    let mut secrets: Vec<(&str, &str)> = vec![
        ("the meta database's password", &accounts.admin_password),
        ("the source's password", &accounts.reader_password),
        ("Elasticsearch's password", &es_pw),
        ("Kafka's SASL password", &kafka_pw),
    ];
    let ours = ctx.secrets.values();
    secrets.extend(
        [
            "the admin token",
            "the workers' token",
            "ZooKeeper's password",
        ]
        .into_iter()
        .zip(ours.iter().copied()),
    );
    let mut scanned = 0;
    for entry in std::fs::read_dir(&ctx.dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap();
            scanned += text.lines().count();
            for (what, value) in &secrets {
                if let Some(line) = text.lines().find(|l| l.contains(value)) {
                    panic!("{what} is in {}: {line}", path.display());
                }
            }
        }
    }
    assert!(
        scanned > 100,
        "the services logged {scanned} lines: too few to mean anything"
    );
    for service in cluster
        .centers
        .iter()
        .chain(&cluster.workers)
        .chain([&cluster.etl])
    {
        let (status, body) = service.ops("/metrics").await.unwrap();
        assert_eq!(status, 200);
        for (what, value) in &secrets {
            assert!(
                !body.contains(value),
                "{what} is in {}'s /metrics",
                service.bin
            );
        }
    }
    drop(cluster);
    ctx.cleanup().await;
    accounts.remove().await;
}
