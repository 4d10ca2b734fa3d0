//! A config file with a wrong key fails at start, naming that key.

use std::time::Duration;

use sluice_integration_tests::ports::free_center_port;
use sluice_integration_tests::{eventually, Service, TestCtx};

/// `service`'s config file with `from` replaced by `to`.
fn edited(service: Service, from: &str, to: &str) -> Service {
    let text = std::fs::read_to_string(&service.config)
        .unwrap()
        .replace(from, to);
    std::fs::write(&service.config, text).unwrap();
    service
}

/// Runs `service`, which must stop at start with an error holding each of `named`; returns
/// what it said.
fn stops_naming(service: &Service, why: &str, named: &[&str]) -> String {
    let (status, out) = service.run_to_exit(Duration::from_secs(30));
    assert!(!status.success(), "{} started {why}:\n{out}", service.bin);
    for name in named {
        assert!(out.contains(name), "the error must name `{name}`:\n{out}");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_key_stops_each_service_at_start_and_is_named() {
    let ctx = TestCtx::new("cfg").await;

    let worker = edited(ctx.worker(), "confirm_interval", "confirm_intervall");
    stops_naming(&worker, "with a bad key", &["worker.confirm_intervall"]);

    // A TLS file that cannot be read stops the service at start, named by its key, rather
    // than failing its first connection in the driver's words.
    let worker = ctx
        .worker()
        .with_env("SLUICE_SOURCE_TLS__CA", "/nonexistent/sluice-ca.pem");
    stops_naming(
        &worker,
        "without its CA",
        &["source_tls.ca: cannot read /nonexistent/sluice-ca.pem"],
    );

    let etl = ctx.etl(&[ctx.pipeline("x")]).with_env(
        "SLUICE_ELASTICSEARCH__TLS__CA",
        "/nonexistent/sluice-ca.pem",
    );
    stops_naming(
        &etl,
        "with TLS settings for http",
        &["elasticsearch.tls: set only for an https elasticsearch.url"],
    );

    let etl = edited(ctx.etl(&[ctx.pipeline("x")]), "replicas = 0", "replica = 0");
    stops_naming(&etl, "with a bad key", &["pipelines[0].replica"]);

    // Values are checked too, all problems at once, before any connection is made; a key
    // that moved says where to.
    let etl = edited(
        ctx.etl(&[ctx.pipeline("Bad Alias")]),
        "linger = \"50ms\"",
        "linger = \"50ms\"\nmax_batch_docs = 0\ndead_letter_topic = \"old.dlq\"\nretry_backoff_max = \"100ms\"",
    );
    stops_naming(
        &etl,
        "with bad values",
        &[
            "etl.max_batch_docs",
            "etl.retry_backoff_max: must be at least etl.retry_backoff (200ms)",
            "pipelines[0].alias",
            "etl.dead_letter_topic: moved to topics.dead_letter",
        ],
    );

    // The center: an unknown key, then a token authentication without a token.
    let center = edited(
        ctx.center_with_api(
            0,
            1,
            "[api]\nauth = \"token\"\ntoken = \"t\"\nworker_token = \"w\"\n",
        ),
        "settle = ",
        "setle = ",
    );
    stops_naming(&center, "with a bad key", &["balance.setle"]);

    let center = ctx.center_with_api(1, 1, "[api]\nauth = \"token\"\n");
    stops_naming(
        &center,
        "without a token",
        &["api.token", "api.worker_token"],
    );
}

/// Credentials never cross a network in clear by default: a center whose listeners carry
/// tokens, passwords or cookies on an address other than loopback without TLS stops at
/// start naming each listener and the key that would allow it, and `auth = "none"` stops
/// off loopback whatever is allowed; with `api.allow_plaintext` the first starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_clear_off_loopback_stop_a_center_at_start() {
    let ctx = TestCtx::new("plainapi").await;
    let token = "[api]\nauth = \"token\"\ntoken = \"t\"\nworker_token = \"w\"\n";
    let everywhere = |service: Service| {
        let service = edited(service, "listen = \"127.0.0.1:", "listen = \"0.0.0.0:");
        edited(
            service,
            "console_listen = \"127.0.0.1:",
            "console_listen = \"0.0.0.0:",
        )
    };
    let said = stops_naming(
        &everywhere(ctx.center_with_api(0, 1, token)),
        "with tokens in clear on every address",
        &[
            "center.listen: 0.0.0.0:",
            "center.console_listen: 0.0.0.0:",
            "api.allow_plaintext",
        ],
    );
    assert!(said.contains("api.tls_cert"), "{said}");
    stops_naming(
        &everywhere(ctx.center_with_api(1, 1, "[api]\nauth = \"none\"\nallow_plaintext = true\n")),
        "open to every caller on every address",
        &["api.auth: `none` makes every caller an admin, so center.listen must be a loopback address"],
    );
    let allowed = format!("{token}allow_plaintext = true\n");
    let mut center = everywhere(ctx.center_with_api(2, free_center_port(), &allowed));
    center.start();
    eventually(
        "the center allowed to serve in clear is ready",
        Duration::from_secs(60),
        || async {
            match center.ops("/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}\n{}", center.log_tail())),
            }
        },
    )
    .await;
    drop(center);
    ctx.cleanup().await;
}
