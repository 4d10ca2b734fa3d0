//! Workers' reports (progress, events) are taken only from the process registered as the
//! worker a report names: the workers' token lets a caller reach the reports, and the
//! report key whose digest that worker's own registration publishes lets it speak for
//! that worker. A caller with the token but not the key — another worker, anyone who read
//! the token — cannot mark a task healthy or record an event in a worker's name, and the
//! admin token reaches no report at all (workers are not given it). The real worker's
//! reports still arrive.

use std::time::Duration;

use sluice_integration_tests::cluster::Bearer;
use sluice_integration_tests::TestCtx;
use sluice_proto::v1::worker_reports_client::WorkerReportsClient;
use sluice_proto::v1::{TaskProgress, WorkerEvent, WorkerReport};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_taken_only_from_the_worker_it_names() {
    let ctx = TestCtx::new("reports").await;
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    // The worker's own report of its task arrived.
    cluster.wait_event(&items.name, "task_started", &[]).await;

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addrs[0]))
        .unwrap()
        .connect()
        .await
        .expect("connect to the center");
    let forged = WorkerReport {
        worker: "w0".into(),
        tasks: vec![TaskProgress {
            source: items.name.clone(),
            state: "running".into(),
            lag_seconds: 0.0,
            ..Default::default()
        }],
        events: vec![WorkerEvent {
            at_ms: sluice_model::now_ms(),
            kind: "forged".into(),
            subject: items.name.clone(),
            message: "written by someone else".into(),
        }],
    };
    let send = |token: &str, key: Option<&str>| {
        let mut client = WorkerReportsClient::with_interceptor(channel.clone(), Bearer::new(token));
        let mut req = tonic::Request::new(forged.clone());
        if let Some(k) = key {
            req.metadata_mut()
                .insert(sluice_proto::REPORT_KEY_HEADER, k.parse().unwrap());
        }
        async move { client.report(req).await }
    };
    for key in [None, Some("00".repeat(32).as_str()), Some("")] {
        let refused = send(&ctx.secrets.worker_token, key).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(
            refused.message().contains("registered as it"),
            "{refused:?}"
        );
    }
    let refused = send(&cluster.token, None).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("api.worker_token"),
        "{refused:?}"
    );

    let events = cluster.ctl(&["events", "--subject", &items.name]).unwrap();
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"task_started") && !kinds.contains(&"forged"),
        "{kinds:?}"
    );

    drop(cluster);
    ctx.cleanup().await;
}
