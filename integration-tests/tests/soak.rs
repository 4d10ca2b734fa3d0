//! The short chaos soak CI runs (`make soak` runs the long one): a write load on four
//! tables while every fault of the chaos loop is injected at least once — workers, the
//! etl and the leader killed or stopped past their session, connections to MySQL, Kafka
//! and ZooKeeper cut, Elasticsearch throttling and lost mid-bulk, Kafka black-holed,
//! ZooKeeper restarted — then every row of every table equals its document and no
//! confirmed position ever moved backwards. `SOAK_MINUTES` lengthens it.

use sluice_integration_tests::on_sources;
use sluice_integration_tests::soak::{self, Fault, SoakOptions};

on_sources!(every_fault_at_random_under_a_write_load_loses_and_resurrects_nothing: mariadb, mysql);
async fn every_fault_at_random_under_a_write_load_loses_and_resurrects_nothing() {
    let mut opts = SoakOptions::from_env(1.5).expect("SOAK_* settings");
    if std::env::var_os("SOAK_FAULT_EVERY").is_none() {
        opts.fault_every = std::time::Duration::from_secs(4);
    }
    if std::env::var_os("SOAK_KAFKA_OUTAGE").is_none() {
        opts.kafka_outage = std::time::Duration::from_secs(10);
    }
    let report = soak::run(&opts).await;
    if report.verdict.is_ok() {
        eprintln!("{report}"); // a failed run has printed it, before the services' logs
    }
    assert!(report.verdict.is_ok(), "{report}");
    for fault in Fault::ALL {
        assert!(
            report.faults.get(&fault).copied().unwrap_or(0) >= 1,
            "{} was never injected:\n{report}",
            fault.describe()
        );
    }
    // One probe at a time, so a long stall means few probes; a probe that never saw
    // its change would count one at most (the one cut short at the end).
    assert!(
        report.probes >= 2,
        "the lag probe saw none of its changes:\n{report}"
    );
    assert!(
        report.checkpoints_sampled > 10,
        "checkpoints hardly sampled:\n{report}"
    );
}
