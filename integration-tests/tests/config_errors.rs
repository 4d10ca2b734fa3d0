//! A config file with a wrong key fails at start, naming that key.

use std::time::Duration;

use sluice_integration_tests::TestCtx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_key_stops_each_service_at_start_and_is_named() {
    let ctx = TestCtx::new("cfg").await;
    let pipeline = ctx.pipeline("x");

    let worker = ctx.worker();
    let text = std::fs::read_to_string(&worker.config)
        .unwrap()
        .replace("confirm_interval", "confirm_intervall");
    std::fs::write(&worker.config, text).unwrap();
    let (status, out) = worker.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "worker started with a bad key:\n{out}");
    assert!(
        out.contains("worker.confirm_intervall"),
        "the error must name the key:\n{out}"
    );

    // A TLS file that cannot be read stops the service at start, named by its key, rather
    // than failing its first connection in the driver's words.
    let worker = ctx
        .worker()
        .with_env("SLUICE_SOURCE_TLS__CA", "/nonexistent/sluice-ca.pem");
    let (status, out) = worker.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "worker started without its CA:\n{out}");
    assert!(
        out.contains("source_tls.ca: cannot read /nonexistent/sluice-ca.pem"),
        "the error must name the key:\n{out}"
    );

    let etl = ctx.etl(&[ctx.pipeline("x")]);
    let etl = etl.with_env(
        "SLUICE_ELASTICSEARCH__TLS__CA",
        "/nonexistent/sluice-ca.pem",
    );
    let (status, out) = etl.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "etl took TLS settings for http:\n{out}");
    assert!(
        out.contains("elasticsearch.tls: set only for an https elasticsearch.url"),
        "the error must name the key:\n{out}"
    );

    let etl = ctx.etl(&[pipeline]);
    let text = std::fs::read_to_string(&etl.config)
        .unwrap()
        .replace("replicas = 0", "replica = 0");
    std::fs::write(&etl.config, text).unwrap();
    let (status, out) = etl.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "etl started with a bad key:\n{out}");
    assert!(
        out.contains("pipelines[0].replica"),
        "the error must name the key:\n{out}"
    );

    // Values are checked too, all problems at once, before any connection is made.
    let etl = ctx.etl(&[ctx.pipeline("Bad Alias")]);
    let text = std::fs::read_to_string(&etl.config).unwrap().replace(
        "linger = \"50ms\"",
        "linger = \"50ms\"\nmax_batch_docs = 0\ndead_letter_topic = \"old.dlq\"",
    );
    std::fs::write(&etl.config, text).unwrap();
    let (status, out) = etl.run_to_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        out.contains("etl.max_batch_docs") && out.contains("pipelines[0].alias"),
        "{out}"
    );
    assert!(
        out.contains("etl.dead_letter_topic: moved to topics.dead_letter"),
        "a key that moved says where to: {out}"
    );

    // The center: an unknown key, then a token authentication without a token.
    let center = ctx.center_with_api(0, 1, "[api]\nauth = \"token\"\ntoken = \"t\"\n");
    let text = std::fs::read_to_string(&center.config)
        .unwrap()
        .replace("settle = ", "setle = ");
    std::fs::write(&center.config, text).unwrap();
    let (status, out) = center.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "center started with a bad key:\n{out}");
    assert!(
        out.contains("balance.setle"),
        "the error must name the key:\n{out}"
    );

    let center = ctx.center_with_api(1, 1, "[api]\nauth = \"token\"\n");
    let (status, out) = center.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "center started without a token:\n{out}");
    assert!(
        out.contains("api.token"),
        "the error must name the key:\n{out}"
    );
}
