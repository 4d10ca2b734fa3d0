//! TLS to MySQL with a custom CA and client certificates: the source's and the meta
//! database's accounts are created `REQUIRE X509`, so the server refuses any connection
//! that is not TLS with a certificate its CA signed; a cluster configured with
//! `[source_tls]` and `[meta.tls]` streams through them all the same.

use std::path::PathBuf;
use std::time::Duration;

use sluice_integration_tests::services::OwnAccounts;
use sluice_integration_tests::{Stack, TestCtx};
use sluice_mysql::MysqlTls;

/// The CA and client certificate the local stack's MariaDB was set up with
/// (`deploy/stack.sh`), or those in `MYSQL_TLS_DIR` for a server of one's own.
fn tls_dir() -> PathBuf {
    let dir = std::env::var_os("MYSQL_TLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.work/stack/mariadb/tls")
        });
    assert!(
        dir.join("ca.pem").exists() && dir.join("client.pem").exists(),
        "no MySQL TLS certificates in {}: start the local stack with `make stack-up` (its \
         MariaDB serves TLS with them), or set MYSQL_TLS_DIR to a directory holding ca.pem, \
         client.pem and client.key for your server",
        dir.display()
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_and_the_meta_database_over_tls_with_client_certificates() {
    let dir = tls_dir();
    let tls = MysqlTls {
        ca: Some(dir.join("ca.pem")),
        cert: Some(dir.join("client.pem")),
        key: Some(dir.join("client.key")),
        skip_hostname_check: false,
    };
    let base = Stack::connect().await;
    let accounts = OwnAccounts::create(&base, "REQUIRE X509").await;

    // The accounts admit nothing but TLS with a client certificate.
    let source = |tls: Option<MysqlTls>| sluice_mysql::SourceConfig {
        name: "probe".into(),
        host: base.mysql_host.clone(),
        port: base.mysql_port,
        user: accounts.reader.clone(),
        password: sluice_core::Secret::new(&accounts.reader_password),
        server_id: 1,
        tables: Vec::new(),
        tls,
    };
    let connects = |cfg: sluice_mysql::SourceConfig| async move {
        mysql_async::Conn::new(cfg.opts())
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let plain = connects(source(None)).await;
    assert!(plain.is_err(), "a plain connection was admitted");
    let no_cert = MysqlTls {
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
    let files = [("CA", &tls.ca), ("CERT", &tls.cert), ("KEY", &tls.key)];
    for bin in ["sluice-center", "sluice-worker", "sluice-etl"] {
        for (key, path) in files {
            let path = path.as_ref().unwrap().to_str().unwrap();
            ctx.env_for(bin, &format!("SLUICE_SOURCE_TLS__{key}"), path);
            if bin == "sluice-center" {
                ctx.env_for(bin, &format!("SLUICE_META__TLS__{key}"), path);
            }
        }
    }
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one'), (2, 'two')")
        .await;
    ctx.exec("UPDATE items SET name = 'uno' WHERE id = 1").await;
    ctx.exec("DELETE FROM items WHERE id = 2").await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;

    drop(cluster);
    ctx.cleanup().await;
    accounts.remove().await;
}
