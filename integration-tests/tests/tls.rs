//! TLS with a custom CA and client certificates.
//! - To MySQL: the source's and the meta database's accounts are created `REQUIRE X509`,
//!   so the server refuses any connection that is not TLS with a certificate its CA
//!   signed; a cluster configured with `[source_tls]` and `[meta.tls]` streams through
//!   them all the same.
//! - To Elasticsearch: the local one speaks no TLS, so a TLS front
//!   ([`sluice_faultproxy::TlsFront`]) serves it with the stack's server certificate and
//!   admits only clients with a certificate of the stack's CA; the etl and the center,
//!   configured with `[elasticsearch.tls]`, stream and build through it.

use std::path::PathBuf;
use std::time::Duration;

use sluice_elastic::EsSection;
use sluice_faultproxy::TlsFront;
use sluice_integration_tests::cluster::{Cluster, ClusterSource};
use sluice_integration_tests::on_sources;
use sluice_integration_tests::stack::OwnAccounts;
use sluice_integration_tests::{eventually, Stack, TestCtx};
use sluice_model::TlsFiles;

/// The CA and client certificate the local stack's databases were set up with
/// (`deploy/stack.sh`), or those in `MYSQL_TLS_DIR` for a server of one's own.
fn tls_dir() -> PathBuf {
    let dir = std::env::var_os("MYSQL_TLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.work/stack/tls"));
    assert!(
        dir.join("ca.pem").exists() && dir.join("client.pem").exists(),
        "no MySQL TLS certificates in {}: start the local stack with `make stack-up` (its \
         databases serve TLS with them), or set MYSQL_TLS_DIR to a directory holding ca.pem, \
         client.pem and client.key for your server",
        dir.display()
    );
    dir
}

/// The stack CA, and the client certificate it signed.
fn client_files(dir: &std::path::Path) -> TlsFiles {
    TlsFiles {
        ca: Some(dir.join("ca.pem")),
        cert: Some(dir.join("client.pem")),
        key: Some(dir.join("client.key")),
        skip_hostname_check: false,
    }
}

/// Each service of `bins` configured from now on gets `files` under `prefix` (an
/// environment prefix such as `SLUICE_SOURCE_TLS`).
fn tls_env(ctx: &TestCtx, bins: &[&'static str], prefix: &str, files: &TlsFiles) {
    let named = [
        ("CA", &files.ca),
        ("CERT", &files.cert),
        ("KEY", &files.key),
    ];
    for bin in bins {
        for (key, path) in named {
            let path = path
                .as_ref()
                .expect("every file set")
                .to_str()
                .expect("UTF-8");
            ctx.env_for(bin, &format!("{prefix}__{key}"), path);
        }
    }
}

/// A one-worker cluster streams inserts, an update and a delete of a new table into its
/// index.
async fn streams_a_table(ctx: &TestCtx) -> (Cluster, ClusterSource) {
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three')")
        .await;
    ctx.exec("UPDATE items SET name = 'uno' WHERE id = 1").await;
    ctx.exec("DELETE FROM items WHERE id = 2").await;
    cluster
        .converges(ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    (cluster, items)
}

on_sources!(sources_and_the_meta_database_over_tls_with_client_certificates: mariadb, mysql);
async fn sources_and_the_meta_database_over_tls_with_client_certificates() {
    let tls = client_files(&tls_dir());
    let base = Stack::connect().await;
    let accounts = OwnAccounts::create(&base, "REQUIRE X509").await;

    // The accounts admit nothing but TLS with a client certificate.
    let source = |tls: Option<TlsFiles>| sluice_mysql::SourceConfig {
        name: "probe".into(),
        host: base.mysql_host.clone(),
        port: base.mysql_port,
        user: accounts.reader.clone(),
        password: sluice_model::Secret::new(&accounts.reader_password),
        server_id: 1,
        tables: Vec::new(),
        shards: Vec::new(),
        tls,
        allow_plaintext: false,
    };
    let connects = |cfg: sluice_mysql::SourceConfig| async move {
        mysql_async::Conn::new(cfg.opts())
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let plain = connects(source(None)).await;
    assert!(plain.is_err(), "a plain connection was admitted");
    let no_cert = TlsFiles {
        cert: None,
        key: None,
        ..tls.clone()
    };
    assert!(
        connects(source(Some(no_cert))).await.is_err(),
        "TLS without a client certificate was admitted"
    );
    connects(source(Some(tls.clone()))).await.unwrap();

    let ctx = TestCtx::on("tls", accounts.stack.clone()).await;
    let every = ["sluice-center", "sluice-worker", "sluice-etl"];
    tls_env(&ctx, &every, "SLUICE_SOURCE_TLS", &tls);
    tls_env(&ctx, &["sluice-center"], "SLUICE_META__TLS", &tls);
    let (cluster, _items) = streams_a_table(&ctx).await;

    drop(cluster);
    ctx.cleanup().await;
    accounts.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elasticsearch_over_tls_with_a_custom_ca_and_a_client_certificate() {
    let dir = tls_dir();
    let tls = client_files(&dir);
    let stack = Stack::connect().await;
    let upstream = stack
        .es_url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let front = TlsFront::start(
        upstream,
        &dir.join("server.pem"),
        &dir.join("server.key"),
        &dir.join("ca.pem"),
    )
    .await;
    let section = |tls: Option<TlsFiles>| EsSection {
        url: front.url().parse().expect("a URL"),
        username: None,
        password: None,
        request_timeout: Duration::from_secs(10),
        tls,
    };
    let pings = |tls: Option<TlsFiles>| {
        let client = section(tls).client().expect("a client");
        async move { client.ping().await.map(drop).map_err(|e| e.to_string()) }
    };

    // Refused at the handshake: without a client certificate, and trusting the system's
    // roots (which do not know the stack's CA), and with neither.
    let no_cert = TlsFiles {
        cert: None,
        key: None,
        ..tls.clone()
    };
    let no_ca = TlsFiles {
        ca: None,
        ..tls.clone()
    };
    // Refused, each, and the error shows the cause where the client finds it (an unknown
    // CA), so an operator knows which side to fix. Without a certificate, TLS 1.3 has the
    // server refuse after the client's side of the handshake is done: the client sees an
    // alert or a closed connection, by timing; the front counts the refusal.
    for (what, files, cause) in [
        ("no client certificate", Some(no_cert), None),
        ("the system's roots", Some(no_ca), Some("UnknownIssuer")),
        ("no TLS settings", None, Some("UnknownIssuer")),
    ] {
        let refused = pings(files).await.expect_err(what);
        if let Some(cause) = cause {
            assert!(refused.contains(cause), "{what}: {refused}");
        }
    }
    eventually(
        "the front counts three refused handshakes",
        Duration::from_secs(10),
        || async {
            match front.refused() {
                3 => Ok(()),
                n => Err(format!("{n} refused")),
            }
        },
    )
    .await;
    pings(Some(tls.clone()))
        .await
        .expect("the CA and the client certificate admit");

    // A file that cannot be read is named by its key before any connection.
    let absent = TlsFiles {
        key: Some(dir.join("absent.key")),
        ..tls.clone()
    };
    let err = section(Some(absent)).client().unwrap_err().to_string();
    assert!(err.contains("elasticsearch.tls.key: cannot read"), "{err}");

    // The etl writes and the center builds through the front.
    let ctx = TestCtx::on("estls", stack.clone()).await;
    ctx.route_elasticsearch(&front.url());
    tls_env(
        &ctx,
        &["sluice-center", "sluice-etl", "sluice-worker"],
        "SLUICE_ELASTICSEARCH__TLS",
        &tls,
    );
    let (cluster, items) = streams_a_table(&ctx).await;
    let alias = &items.pipeline.alias;
    let before = stack.es.alias_targets(alias).await.expect("the alias");
    cluster
        .ctl(&["pipelines", "build", alias])
        .expect("a build starts");
    cluster.wait_built(alias, Duration::from_secs(90)).await;
    let after = stack.es.alias_targets(alias).await.expect("the alias");
    assert_ne!(before, after, "the build moved the alias through the front");
    ctx.exec("INSERT INTO items VALUES (4, 'four')").await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    assert_eq!(
        front.refused(),
        3,
        "a service's connection was refused:\n{}",
        cluster.logs()
    );

    drop(cluster);
    ctx.cleanup().await;
}

// Over plain TCP a password reaches whoever answers at the address (in clear inside an
// RSA exchange with a key the server hands out, or as a scramble anyone can test guesses
// against), and the server picks which. So a worker without TLS is refused before it
// connects, naming the settings, and with `allow_plaintext` it streams; the meta database
// likewise stops a center at start unless `meta.allow_plaintext`.
on_sources!(a_plain_connection_to_mysql_sends_no_password_unless_allowed: mariadb, mysql);
async fn a_plain_connection_to_mysql_sends_no_password_unless_allowed() {
    let ctx = TestCtx::new("plain").await;
    ctx.allow_plaintext(false);
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("items");
    let mut worker = ctx.worker();
    worker.start();
    eventually(
        "the worker refuses to send the password",
        Duration::from_secs(60),
        || async {
            let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
            if log.contains("configure TLS to it") && log.contains("allow_plaintext") {
                Ok(())
            } else {
                Err(worker.log_tail())
            }
        },
    )
    .await;
    drop(worker);

    let mut center = ctx.center_with_api(
        0,
        sluice_integration_tests::ports::free_port(),
        "[api]\nauth = \"none\"\n",
    );
    center.start();
    let status = center
        .wait_exit(Duration::from_secs(60))
        .expect("the center stops at start");
    assert!(!status.success());
    let log = std::fs::read_to_string(&center.log).unwrap_or_default();
    assert!(
        log.contains("the meta database ([meta]") && log.contains("meta.allow_plaintext"),
        "{log}"
    );

    ctx.allow_plaintext(true);
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;
    ctx.exec("INSERT INTO items VALUES (1, 'one')").await;
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;
}
