//! The preflight names each setting or privilege a source lacks, with the statement that
//! fixes it, before anything streams, on a server of the test's own (its settings are
//! changed): full row metadata, GTIDs on MySQL, the privilege to read binlog positions.

use sluice_integration_tests::lane::Lane;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::private_source::PrivateSource;
use sluice_mysql::MysqlError;

on_sources!(a_source_that_cannot_be_streamed_is_told_every_fix: mariadb, mysql);
async fn a_source_that_cannot_be_streamed_is_told_every_fix() {
    let server = PrivateSource::start(7401).await;
    let mysql = Lane::current().flavor() == Lane::MySql;
    server.root("SET GLOBAL binlog_row_metadata = MINIMAL");
    if mysql {
        // GTIDs are turned off step by step; one step down is enough to be refused.
        server.root("SET GLOBAL gtid_mode = ON_PERMISSIVE");
    }
    server.root(
        "SET SESSION sql_log_bin = 0; CREATE USER 'thin'@'%' IDENTIFIED BY 'thin';\
         GRANT SELECT, REPLICATION SLAVE ON *.* TO 'thin'@'%';",
    );
    let (host, port) = server
        .addr()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_owned(), p.parse().unwrap()))
        .unwrap();
    let src = sluice_mysql::SourceConfig {
        name: "thin".into(),
        host,
        port,
        user: "thin".into(),
        password: sluice_model::Secret::new("thin"),
        server_id: 7499,
        tables: vec![],
        shards: Vec::new(),
        tls: None,
        allow_plaintext: true,
    };
    let problems = match sluice_mysql::preflight(&src, None).await {
        Err(MysqlError::Preflight { problems, .. }) => problems,
        other => panic!("the preflight must refuse: {other:?}"),
    };
    let said = problems.join("\n");
    let wants: &[(&str, &str)] = &[
        (
            "binlog_row_metadata is MINIMAL",
            "SET GLOBAL binlog_row_metadata=FULL",
        ),
        (
            "lacks REPLICATION CLIENT",
            "GRANT REPLICATION CLIENT ON *.*",
        ),
    ];
    for (what, fix) in wants {
        assert!(
            problems.iter().any(|p| p.contains(what) && p.contains(fix)),
            "a problem saying `{what}` with `{fix}`:\n{said}"
        );
    }
    if mysql {
        assert!(
            problems
                .iter()
                .any(|p| p.contains("gtid_mode is ON_PERMISSIVE")
                    && p.contains("SET PERSIST gtid_mode = ON")),
            "a problem naming gtid_mode and its fix:\n{said}"
        );
    }
    assert_eq!(
        problems.len(),
        if mysql { 3 } else { 2 },
        "nothing else:\n{said}"
    );

    // Put right, the same source passes.
    server.root(
        "SET GLOBAL binlog_row_metadata = FULL; GRANT REPLICATION CLIENT ON *.* TO 'thin'@'%'",
    );
    if mysql {
        server.root("SET GLOBAL gtid_mode = ON");
    }
    let info = sluice_mysql::preflight(&src, None)
        .await
        .unwrap_or_else(|e| panic!("put right, the source passes: {e}"));
    assert_eq!(info.server.flavor == sluice_mysql::Flavor::MySql, mysql);
}
