//! Telemetry (issue 5): every service serves `/metrics`, `/healthz` and `/readyz`; the
//! metrics say what the cluster does; and every query of the Grafana dashboards and the
//! Prometheus alert rules under `deploy/` names metrics the services really export.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::{eventually, sample, Service, TestCtx};

const ROWS: u64 = 200;

fn names(m: &BTreeMap<String, f64>) -> BTreeSet<String> {
    m.keys()
        .map(|s| s.split('{').next().unwrap_or(s).to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_export_what_dashboards_and_alerts_query() {
    let ctx = TestCtx::new("telemetry").await;
    ctx.exec("CREATE TABLE parts (id BIGINT PRIMARY KEY, name VARCHAR(40))")
        .await;
    let values: Vec<String> = (1..=ROWS).map(|i| format!("({i}, 'part {i}')")).collect();
    ctx.exec(&format!("INSERT INTO parts VALUES {}", values.join(", ")))
        .await;
    let cluster = ctx.start_cluster(2, 1).await;
    let parts = ctx.add_source(&cluster, "parts", 1).await;
    cluster
        .wait_running(&[&parts], Duration::from_secs(30))
        .await;
    ctx.exec("UPDATE parts SET name = 'renamed' WHERE id = 1")
        .await;
    cluster
        .ctl(&["pipelines", "build", &parts.pipeline.alias])
        .unwrap();
    eventually("the build finishes", Duration::from_secs(90), || async {
        let s = cluster.ctl(&["pipelines", "status", &parts.pipeline.alias])?;
        if s["phase"] == "done" {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .await;
    // A consistency check, so its gauges have values.
    cluster
        .ctl(&["pipelines", "check", &parts.pipeline.alias])
        .unwrap();

    let services: Vec<&Service> = cluster
        .centers
        .iter()
        .chain(&cluster.workers)
        .chain([&cluster.etl])
        .collect();
    for s in &services {
        assert_eq!(
            s.ops("/healthz").await.unwrap().0,
            200,
            "{} /healthz",
            s.bin
        );
        assert_eq!(s.ops("/readyz").await.unwrap().0, 200, "{} /readyz", s.bin);
    }

    // What the cluster did, as the metrics tell it.
    let table = "table=\"parts\"";
    let pipeline = format!("pipeline=\"{}\"", parts.pipeline.alias);
    let source = format!("source=\"{}\"", parts.name);
    let (worker, etl) = (&cluster.workers[0], &cluster.etl);
    let exported: BTreeSet<String> = eventually(
        "the metrics tell what happened",
        Duration::from_secs(30),
        || async {
            let centers = [
                cluster.centers[0].metrics().await?,
                cluster.centers[1].metrics().await?,
            ];
            let (w, e) = (worker.metrics().await?, etl.metrics().await?);
            let leaders: f64 = centers
                .iter()
                .filter_map(|c| sample(c, "sluice_center_leader", &[]))
                .sum();
            let leader = centers
                .iter()
                .find(|c| sample(c, "sluice_center_leader", &[]) == Some(1.0))
                .ok_or("no center says it leads")?;
            let checks = [
                ("one leader", leaders == 1.0),
                (
                    "1 live worker",
                    sample(leader, "sluice_center_workers_live", &[]) == Some(1.0),
                ),
                (
                    "its task",
                    sample(leader, "sluice_center_tasks", &["worker=\"w0\""]) == Some(1.0),
                ),
                (
                    "its passes timed, its ZooKeeper writes and reads counted",
                    sample(leader, "sluice_center_reconcile_seconds_count", &[])
                        .is_some_and(|v| v >= 1.0)
                        && sample(leader, "sluice_center_zk_writes_total", &["op=\"create\""])
                            .is_some_and(|v| v >= 1.0)
                        && sample(leader, "sluice_center_zk_reads_total", &["op=\"get\""])
                            .is_some_and(|v| v >= 1.0),
                ),
                (
                    "a source's lag",
                    sample(leader, "sluice_center_source_lag_seconds", &[&source]).is_some(),
                ),
                (
                    "an available pipeline",
                    sample(leader, "sluice_center_pipelines", &["state=\"available\""])
                        == Some(1.0),
                ),
                (
                    "the build's rows",
                    sample(leader, "sluice_center_build_rows_done", &[&pipeline])
                        == Some(ROWS as f64),
                ),
                (
                    "the build is over",
                    sample(leader, "sluice_center_build_running", &[&pipeline]) == Some(0.0),
                ),
                (
                    "a check found no drift",
                    sample(
                        leader,
                        "sluice_center_check_drift",
                        &[&pipeline, "kind=\"missing\""],
                    ) == Some(0.0)
                        && sample(leader, "sluice_center_check_running", &[&pipeline]) == Some(0.0)
                        && sample(leader, "sluice_center_check_keys", &[&pipeline])
                            .is_some_and(|v| v >= 1.0),
                ),
                (
                    "the update published",
                    sample(&w, "sluice_worker_events_total", &[table, "op=\"update\""])
                        .is_some_and(|v| v >= 1.0),
                ),
                (
                    "snapshot rows",
                    sample(&w, "sluice_worker_snapshot_rows_total", &[&pipeline])
                        == Some(ROWS as f64),
                ),
                (
                    "lag in seconds",
                    sample(&w, "sluice_worker_binlog_lag_seconds", &[&source]).is_some(),
                ),
                (
                    "lag in bytes",
                    sample(&w, "sluice_worker_binlog_lag_bytes", &[&source]).is_some(),
                ),
                (
                    "a streaming task",
                    sample(&w, "sluice_worker_tasks", &["state=\"streaming\""]) == Some(1.0),
                ),
                (
                    "documents written",
                    sample(&e, "sluice_etl_documents_total", &["result=\"written\""])
                        .is_some_and(|v| v >= ROWS as f64),
                ),
                (
                    "bulk requests timed",
                    sample(&e, "sluice_etl_bulk_duration_seconds_count", &[])
                        .is_some_and(|v| v >= 1.0),
                ),
                (
                    "no dead letters",
                    sample(&e, "sluice_etl_dead_letters_total", &[&pipeline]) == Some(0.0),
                ),
                (
                    "consumer lag",
                    sample(&e, "sluice_etl_consumer_lag_messages", &[]).is_some(),
                ),
            ];
            let failed: Vec<&str> = checks
                .iter()
                .filter(|(_, ok)| !ok)
                .map(|(what, _)| *what)
                .collect();
            let exported: BTreeSet<String> =
                centers.iter().chain([&w, &e]).flat_map(names).collect();
            if failed.is_empty() {
                Ok(exported)
            } else {
                Err(format!("not yet: {failed:?}\nexported: {exported:?}"))
            }
        },
    )
    .await;

    // Every dashboard and alert query names exported metrics only.
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let queries = dashboard_and_alert_queries(&deploy);
    assert!(queries.len() >= 15, "only {} queries found", queries.len());
    let mut unknown = Vec::new();
    for (whence, expr) in &queries {
        let metrics = metric_names(expr);
        if metrics.is_empty() {
            unknown.push(format!("{whence}: `{expr}` names no metric"));
        }
        for m in metrics {
            if !exported.contains(&m) {
                unknown.push(format!("{whence}: `{m}` in `{expr}`"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics no service exports:\n{}\nexported: {exported:?}",
        unknown.join("\n")
    );

    drop(cluster);
    ctx.cleanup().await;
}

/// (where, PromQL) of every panel target of `deploy/grafana/*.json` and every rule of
/// `deploy/prometheus/*.yml`, checking the shape of each on the way.
fn dashboard_and_alert_queries(deploy: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dashboards = 0;
    for entry in std::fs::read_dir(deploy.join("grafana")).expect("deploy/grafana") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        dashboards += 1;
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            d["title"].is_string() && d["uid"].is_string(),
            "{}: title and uid",
            path.display()
        );
        let panels = d["panels"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: panels", path.display()));
        assert!(!panels.is_empty(), "{}: no panels", path.display());
        for p in panels.iter().filter(|p| p["type"] != "row") {
            let title = p["title"].as_str().unwrap_or("?");
            let targets = p["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("{}: panel `{title}` has no targets", path.display()));
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or_else(|| {
                    panic!("{}: panel `{title}`: a target without expr", path.display())
                });
                out.push((
                    format!("{} / {title}", path.file_name().unwrap().to_string_lossy()),
                    expr.to_owned(),
                ));
            }
        }
    }
    assert!(
        dashboards >= 3,
        "{dashboards} dashboards under deploy/grafana"
    );
    let mut alerts = 0;
    for entry in std::fs::read_dir(deploy.join("prometheus")).expect("deploy/prometheus") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yml" && e != "yaml") {
            continue;
        }
        let rules: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for g in rules["groups"].as_sequence().expect("groups") {
            for r in g["rules"].as_sequence().expect("rules") {
                let name = r["alert"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{}: a rule without `alert`", path.display()));
                assert!(r["for"].is_string(), "{name}: `for`");
                assert!(
                    r["labels"]["severity"].is_string(),
                    "{name}: labels.severity"
                );
                assert!(
                    r["annotations"]["summary"].is_string(),
                    "{name}: annotations.summary"
                );
                let expr = r["expr"].as_str().unwrap_or_else(|| panic!("{name}: expr"));
                out.push((format!("alert {name}"), expr.to_owned()));
                alerts += 1;
            }
        }
    }
    assert!(alerts >= 4, "{alerts} alert rules under deploy/prometheus");
    out
}

/// The metric names a PromQL expression reads: identifiers that are not functions,
/// keywords, label names (in `{}` or after by/without/on/ignoring), strings or durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Followed by a list of label names in parentheses.
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "offset",
        "bool",
        "inf",
        "nan",
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    let mut out = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut braces, mut brackets) = (0, 0, 0);
    let mut label_list = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            ')' => label_list = false,
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i + 1 < chars.len()
                    && (chars[i + 1].is_ascii_alphanumeric() || matches!(chars[i + 1], '_' | ':'))
                {
                    i += 1;
                }
                let word: String = chars[start..=i].iter().collect();
                let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
                let lower = word.to_ascii_lowercase();
                if LABEL_LISTS.contains(&lower.as_str()) {
                    label_list = next == Some(&'(');
                } else if braces == 0
                    && brackets == 0
                    && !label_list
                    && next != Some(&'(')
                    && !KEYWORDS.contains(&lower.as_str())
                {
                    out.insert(word);
                }
            }
            c if c.is_ascii_digit() => {
                // A number or a duration (`5m`): skip it whole.
                while i + 1 < chars.len() && chars[i + 1].is_ascii_alphanumeric() {
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

#[test]
fn promql_metric_names_are_found() {
    let names = metric_names(
        r#"sum by (source) (rate(sluice_worker_events_total{table="x", op=~"insert|update"}[5m])) / on(source) group_left max(sluice_worker_binlog_lag_seconds offset 1h) > 0.5"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "sluice_worker_binlog_lag_seconds",
            "sluice_worker_events_total"
        ]
    );
    assert_eq!(
        metric_names("histogram_quantile(0.99, sum by (le) (rate(sluice_etl_bulk_duration_seconds_bucket[5m])))").len(),
        1
    );
}

/// A minimal OTLP/gRPC trace collector: (service.name, span name) of every span exported.
#[derive(Clone, Default)]
struct Collector(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for Collector
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        let mut seen = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    seen.push((service.clone(), span.name));
                }
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector_when_configured() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    let ctx = TestCtx::new("otlp").await;
    ctx.exec("CREATE TABLE traced (id INT PRIMARY KEY, v INT)")
        .await;
    let pipeline = ctx.pipeline("traced");

    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    let mut etl = ctx.etl(std::slice::from_ref(&pipeline));
    let text = std::fs::read_to_string(&etl.config).unwrap().replace(
        "[telemetry]\n",
        &format!("[telemetry]\notlp_endpoint = \"http://{addr}\"\n"),
    );
    std::fs::write(&etl.config, text).unwrap();
    etl.start();
    ctx.exec("INSERT INTO traced VALUES (1, 1)").await;

    eventually(
        "the etl's spans at the collector",
        Duration::from_secs(60),
        || async {
            let seen = collector.0.lock().unwrap().clone();
            let ours = |name: &str| {
                seen.iter()
                    .any(|(service, span)| service.contains("sluice-etl") && span == name)
            };
            if ours("etl.apply") && ours("etl.bulk") {
                Ok(())
            } else {
                Err(format!("spans so far: {seen:?}"))
            }
        },
    )
    .await;
    worker.terminate(Duration::from_secs(30));
    etl.terminate(Duration::from_secs(30));
    ctx.cleanup().await;
}
