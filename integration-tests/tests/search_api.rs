//! The search API for applications (README, "Searching from applications"), served by a
//! center over a real cluster: an application searches an alias through a template and
//! reads its own writes — 1,000 rounds of commit-then-search under a background write
//! load find every write (and the same rounds without waiting find stale answers, so the
//! rounds can tell); every refusal says what and why (no or a wrong token, an alias or a
//! template not allowed, a parameter of the wrong type, a rate limit, a position not
//! applied in time); the etl's applied position shows in `sluicectl pipelines list` and
//! its metric. Prints the waits' p50/p99 and the API's overhead over a direct search.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use serde_json::{json, Value};
use sha2::Digest;
use sluice_integration_tests::cluster::write_load_counted;
use sluice_integration_tests::lane::Lane;
use sluice_integration_tests::stack::random_hex;
use sluice_integration_tests::{on_sources, TestCtx};

const ROUNDS: u64 = 1_000;
/// Rounds without waiting, which must find stale answers.
const CONTROL_ROUNDS: u64 = 100;
/// Applications' connections writing and searching at once.
const CLIENTS: u64 = 8;

struct Api {
    http: reqwest::Client,
    base: String,
    alias: String,
}

impl Api {
    async fn call(
        &self,
        token: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let answer = req.send().await.expect("the search API answers");
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        let text = answer.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value, headers)
    }

    async fn search(&self, token: &str, body: Value) -> (u16, Value) {
        let path = format!("/v1/aliases/{}/search", self.alias);
        let (status, value, _) = self
            .call(Some(token), reqwest::Method::POST, &path, Some(body))
            .await;
        (status, value)
    }
}

fn digest(token: &str) -> String {
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

on_sources!(applications_search_through_templates_and_read_their_own_writes: mariadb, mysql);
async fn applications_search_through_templates_and_read_their_own_writes() {
    let ctx = TestCtx::new("search").await;
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, v INT)")
        .await;
    ctx.exec("CREATE TABLE others (id INT PRIMARY KEY, v INT)")
        .await;
    ctx.exec("INSERT INTO items VALUES (900001, 1), (900002, 2)")
        .await;
    let alias = ctx.pipeline("items").alias;
    let others = ctx.pipeline("others").alias;
    // `shop`'s token as an operator makes it: `sluicectl app-token` (its digest admits it).
    let minted = std::process::Command::new(sluice_integration_tests::Service::binary("sluicectl"))
        .args(["-o", "json", "app-token", "shop"])
        .output()
        .expect("sluicectl app-token");
    let minted: Value = serde_json::from_slice(&minted.stdout).expect("its JSON");
    let token = minted["token"].as_str().unwrap().to_owned();
    let shop_digest = minted["token_sha256"].as_str().unwrap().to_owned();
    let slow_token = random_hex();
    let port = sluice_integration_tests::ports::free_port();
    ctx.center_section(&format!(
        r#"
[search]
listen = "127.0.0.1:{port}"
max_wait = "30s"
[[search.apps]]
name = "shop"
token_sha256 = "{}"
aliases = ["{alias}"]
templates = ["by_v"]
rate_per_sec = 100000
[[search.apps]]
name = "reports"
token_sha256 = "{}"
aliases = ["{alias}", "{others}"]
templates = ["by_v", "everything"]
rate_per_sec = 1
burst = 2
[[search.templates]]
name = "by_v"
params = {{ v = {{ type = "integer" }}, size = {{ type = "integer", default = 10 }} }}
query = {{ size = "{{{{size}}}}", query = {{ term = {{ v = "{{{{v}}}}" }} }} }}
[[search.templates]]
name = "everything"
query = {{ query = {{ match_all = {{}} }} }}
"#,
        shop_digest,
        digest(&slow_token)
    ));
    // An etl slower than the worker confirms positions (its batches linger longer than
    // the test workers' 200 ms confirm interval): a position is then often confirmed
    // before its events are applied, which a wait that trusted the worker alone would
    // answer too early.
    ctx.env_for("sluice-etl", "SLUICE_ETL__LINGER", "300ms");
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    cluster.ctl(&["pipelines", "build", &alias]).unwrap();
    cluster.wait_built(&alias, Duration::from_secs(120)).await;
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        alias: alias.clone(),
    };

    refusals_say_what_and_why(&api, &token, &slow_token, &others).await;

    // The API describes itself.
    let (status, doc, _) = api
        .call(None, reqwest::Method::GET, "/openapi.json", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/v1/aliases/{alias}/search",
        "/v1/aliases/{alias}/documents/{id}",
        "/v1/aliases/{alias}/position",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is not described");
    }

    // Under a background write load into the same table.
    let load_rounds = Arc::new(AtomicU64::new(0));
    let (stop, load) = write_load_counted(&ctx, &["items"], load_rounds.clone());
    let mysql = matches!(Lane::current().flavor(), Lane::MySql);
    let mut conn = ctx.stack.conn().await;
    conn.query_drop(format!("USE `{}`", ctx.db)).await.unwrap();

    // Without waiting, a search right after the commit misses it: the rounds can tell.
    let mut stale_without_waiting = 0;
    for i in 0..CONTROL_ROUNDS {
        let v = 7_000_000 + i;
        conn.query_drop(format!("INSERT INTO items VALUES ({}, {v})", 3_000_000 + i))
            .await
            .unwrap();
        let (status, answer) = api
            .search(&token, json!({"template": "by_v", "params": {"v": v}}))
            .await;
        assert_eq!(status, 200, "{answer}");
        if answer["total"] == 0 {
            stale_without_waiting += 1;
        }
    }
    assert!(
        stale_without_waiting > 0,
        "every search without waiting found its write: the rounds below could not tell a stale answer"
    );

    // The rounds, by `CLIENTS` applications' connections at once.
    let api = Arc::new(api);
    let rounds = (0..CLIENTS).map(|c| {
        let (api, token, pool, db) = (
            api.clone(),
            token.clone(),
            ctx.stack.mysql.clone(),
            ctx.db.clone(),
        );
        tokio::spawn(async move {
            let mut conn = pool.get_conn().await.unwrap();
            conn.query_drop(format!("USE `{db}`")).await.unwrap();
            let mut out = Vec::new();
            for i in (c..ROUNDS).step_by(CLIENTS as usize) {
                out.push(round(&api, &token, &mut conn, i, mysql).await);
            }
            out
        })
    });
    let mut waits = Vec::new();
    let mut round_trips = Vec::new();
    let mut stale = Vec::new();
    for r in futures::future::join_all(rounds).await {
        for (i, waited, took, answer) in r.unwrap() {
            waits.push(waited);
            round_trips.push(took);
            if let Some(answer) = answer {
                stale.push((i, answer));
            }
        }
    }
    let api = Arc::into_inner(api).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let background = load.await.unwrap();
    assert!(
        stale.is_empty(),
        "{} stale answers, first: {:?}",
        stale.len(),
        stale.first()
    );
    waits.sort_unstable();
    round_trips.sort_unstable();
    println!(
        "read your writes: {ROUNDS} rounds by {CLIENTS} clients under {background} background rounds of writes, 0 stale \
         ({stale_without_waiting}/{CONTROL_ROUNDS} stale without waiting); wait p50 {} ms p99 {} ms; \
         commit to answer p50 {} ms p99 {} ms",
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        percentile(&round_trips, 0.5),
        percentile(&round_trips, 0.99)
    );

    // A document by id, after its write.
    let gtid: String = {
        conn.query_drop("UPDATE items SET v = 42 WHERE id = 900001")
            .await
            .unwrap();
        let sql = if mysql {
            "SELECT @@GLOBAL.gtid_executed"
        } else {
            "SELECT @@last_gtid"
        };
        conn.query_first(sql).await.unwrap().unwrap()
    };
    let path = format!(
        "/v1/aliases/{alias}/documents/900001?after={}&wait_ms=20000",
        urlencode(&gtid)
    );
    let (status, doc, _) = api
        .call(Some(&token), reqwest::Method::GET, &path, None)
        .await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["document"]["v"], 42, "{doc}");

    applied_position_is_listed_and_measured(&cluster, &alias, &gtid).await;
    // The center counts requests by application and outcome, and times the waits.
    let center = &cluster.centers[0];
    let count = |app: &'static str, outcome: &'static str| async move {
        let labels = [("app", app), ("outcome", outcome)];
        center
            .metric_sum("sluice_search_requests_total", &labels)
            .await
            .unwrap()
    };
    assert!(count("shop", "ok").await >= ROUNDS as f64);
    for outcome in ["template_not_allowed", "bad_request", "not_applied"] {
        assert!(count("shop", outcome).await >= 1.0, "no {outcome} counted");
    }
    assert!(count("reports", "rate_limited").await >= 1.0);
    assert!(count("-", "unauthenticated").await >= 2.0);
    let waits = center
        .metric_sum("sluice_search_wait_seconds_count", &[])
        .await
        .unwrap();
    assert!(waits >= ROUNDS as f64, "{waits} waits timed");
    overhead_over_a_direct_search(&ctx, &api, &token).await;
    drop(cluster);
    ctx.cleanup().await;
}

/// One round: a commit, then a search that names it (even rounds by the application's
/// own GTID, odd ones by the position the API gives): `(round, waited ms, commit to answer
/// ms, the answer when stale)`.
async fn round(
    api: &Api,
    token: &str,
    conn: &mut mysql_async::Conn,
    i: u64,
    mysql: bool,
) -> (u64, u64, u64, Option<Value>) {
    let (id, v) = (2_000_000 + i, 5_000_000 + i);
    conn.query_drop(format!("INSERT INTO items VALUES ({id}, {v})"))
        .await
        .unwrap();
    let started = Instant::now();
    let after: String = if i % 2 == 0 {
        let sql = if mysql {
            "SELECT @@GLOBAL.gtid_executed"
        } else {
            "SELECT @@last_gtid"
        };
        conn.query_first(sql).await.unwrap().unwrap()
    } else {
        let path = format!("/v1/aliases/{}/position", api.alias);
        let (status, p, _) = api
            .call(Some(token), reqwest::Method::GET, &path, None)
            .await;
        assert_eq!(status, 200, "{p}");
        p["position"].as_str().unwrap().to_owned()
    };
    let (status, answer) = api
        .search(
            token,
            json!({"template": "by_v", "params": {"v": v}, "after": after, "wait_ms": 20_000}),
        )
        .await;
    assert_eq!(status, 200, "round {i}: {answer}");
    let took = started.elapsed().as_millis() as u64;
    let waited = answer["waited_ms"].as_u64().unwrap();
    let hits = answer["hits"].as_array().unwrap();
    if hits.len() != 1 || hits[0]["id"] != json!(id.to_string()) {
        return (i, waited, took, Some(answer));
    }
    // Only what an application needs: no physical index name.
    let keys: Vec<&str> = hits[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["id", "score", "document"]);
    assert_eq!(hits[0]["document"]["v"], v);
    (i, waited, took, None)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn refusals_say_what_and_why(api: &Api, token: &str, slow: &str, others: &str) {
    let search = format!("/v1/aliases/{}/search", api.alias);
    let body = json!({"template": "by_v", "params": {"v": 1}});
    let post = reqwest::Method::POST;
    let (status, e, _) = api
        .call(None, post.clone(), &search, Some(body.clone()))
        .await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (401, &json!("unauthenticated")),
        "{e}"
    );
    let (status, e, _) = api
        .call(
            Some("not-a-token"),
            post.clone(),
            &search,
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 401, "{e}");
    // `shop` may not search `others`, though the alias exists.
    let path = format!("/v1/aliases/{others}/search");
    let (status, e, _) = api
        .call(Some(token), post.clone(), &path, Some(body.clone()))
        .await;
    assert_eq!(status, 403, "{e}");
    assert_eq!(e["error"]["code"], "alias_not_allowed");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`shop` may not search") && message.contains(&api.alias),
        "{message}"
    );
    let (status, e) = api.search(token, json!({"template": "everything"})).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (403, &json!("template_not_allowed")),
        "{e}"
    );
    let (status, e) = api
        .search(
            token,
            json!({"template": "by_v", "params": {"v": "1 OR 1=1"}}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(
        e["error"]["message"],
        "params.v: must be an integer, not \"1 OR 1=1\""
    );
    let (status, e) = api
        .search(
            token,
            json!({"template": "by_v", "params": {"v": 1}, "after": "yesterday"}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("after: "),
        "{e}"
    );
    // A position far ahead of the source: given up after the wait asked, with the lag.
    let ahead = if matches!(Lane::current().flavor(), Lane::MySql) {
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:999999999"
    } else {
        "0-1-999999999"
    };
    let started = Instant::now();
    let (status, e) = api
        .search(
            token,
            json!({"template": "by_v", "params": {"v": 1}, "after": ahead, "wait_ms": 300}),
        )
        .await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (504, &json!("not_applied")),
        "{e}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(e["error"]["lag_ms"].is_u64(), "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("applied up to"),
        "{e}"
    );
    // `reports` may make 1 request a second, 2 at once.
    let mut limited = None;
    for _ in 0..4 {
        let (status, e, headers) = api
            .call(Some(slow), post.clone(), &search, Some(body.clone()))
            .await;
        if status == 429 {
            limited = Some((e, headers));
            break;
        }
        assert_eq!(status, 200, "{e}");
    }
    let (e, headers) = limited.expect("a burst past the rate limit is refused");
    assert_eq!(e["error"]["code"], "rate_limited");
    assert!(e["error"]["retry_after_ms"].as_u64().unwrap() > 0, "{e}");
    assert!(headers.get("retry-after").is_some());
}

async fn applied_position_is_listed_and_measured(
    cluster: &sluice_integration_tests::Cluster,
    alias: &str,
    gtid: &str,
) {
    let list = cluster.ctl(&["pipelines", "list"]).unwrap();
    let p = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == alias)
        .unwrap();
    let applied = &p["applied"][0];
    assert!(
        applied["position"]
            .as_str()
            .is_some_and(|s| s.contains(':')),
        "{p}"
    );
    let covered: sluice_model::GtidSet = applied["gtid"].as_str().unwrap().parse().unwrap();
    let asked: sluice_model::GtidSet = gtid.parse().unwrap();
    assert!(covered.contains(&asked), "applied {covered} lacks {asked}");
    assert!(applied["lag_ms"].as_u64().unwrap() < 30_000, "{p}");
    let metrics = cluster.etl.metrics().await.unwrap();
    let lag = metrics
        .iter()
        .find(|(k, _)| k.starts_with("sluice_etl_applied_lag_seconds{") && k.contains(alias))
        .unwrap_or_else(|| panic!("no applied lag for {alias} in {metrics:?}"));
    assert!(*lag.1 >= 0.0);
}

/// The same searches straight against the alias and through the API (no waiting).
async fn overhead_over_a_direct_search(ctx: &TestCtx, api: &Api, token: &str) {
    const N: u32 = 200;
    let body = json!({"size": 10, "query": {"term": {"v": 42}}});
    let started = Instant::now();
    for _ in 0..N {
        ctx.stack.es.search(&api.alias, &body).await.unwrap();
    }
    let direct = started.elapsed() / N;
    let started = Instant::now();
    for _ in 0..N {
        let (status, _) = api
            .search(token, json!({"template": "by_v", "params": {"v": 42}}))
            .await;
        assert_eq!(status, 200);
    }
    let through = started.elapsed() / N;
    println!(
        "search API overhead: {:.2} ms per search through the API vs {:.2} ms direct ({:.2}x)",
        through.as_secs_f64() * 1e3,
        direct.as_secs_f64() * 1e3,
        through.as_secs_f64() / direct.as_secs_f64()
    );
}

on_sources!(applications_learn_nothing_past_their_templates_and_cost_no_connection_each: mysql);
/// An application reads by id no field its templates' searches would not show it (a
/// template's `_source` says which), and none if none shows one; the search cluster's or
/// MySQL's own words (index, host, user names) never reach it, only an incident number
/// the center's log explains; and `/position` reads over pooled connections, not one per
/// request (counted on a MySQL account of the test's own).
async fn applications_learn_nothing_past_their_templates_and_cost_no_connection_each() {
    let accounts = sluice_integration_tests::stack::OwnAccounts::create(
        &sluice_integration_tests::Stack::connect().await,
        "",
    )
    .await;
    let ctx = TestCtx::on("searchfields", accounts.stack.clone()).await;
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, v INT, secret VARCHAR(20))")
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 10, 'hidden'), (2, 20, 'hidden')")
        .await;
    let alias = ctx.pipeline("items").alias;
    let (limited, blind) = (random_hex(), random_hex());
    let port = sluice_integration_tests::ports::free_port();
    ctx.center_section(&format!(
        r#"
[search]
listen = "127.0.0.1:{port}"
[[search.apps]]
name = "limited"
token_sha256 = "{}"
aliases = ["{alias}"]
templates = ["values", "sized"]
rate_per_sec = 100000
[[search.apps]]
name = "blind"
token_sha256 = "{}"
aliases = ["{alias}"]
templates = ["counts"]
[[search.templates]]
name = "values"
query = {{ _source = ["v"], query = {{ match_all = {{}} }} }}
[[search.templates]]
name = "sized"
params = {{ size = {{ type = "integer" }} }}
query = {{ _source = ["v"], size = "{{{{size}}}}", query = {{ match_all = {{}} }} }}
[[search.templates]]
name = "counts"
query = {{ _source = false, query = {{ match_all = {{}} }} }}
"#,
        digest(&limited),
        digest(&blind),
    ));
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(60))
        .await;
    cluster.ctl(&["pipelines", "build", &alias]).unwrap();
    cluster.wait_built(&alias, Duration::from_secs(120)).await;
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        alias: alias.clone(),
    };
    let doc = format!("/v1/aliases/{alias}/documents/1");
    let (status, answer, _) = api
        .call(Some(&limited), reqwest::Method::GET, &doc, None)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["document"],
        json!({"v": 10}),
        "only what its templates show"
    );
    let (status, answer, _) = api
        .call(Some(&blind), reqwest::Method::GET, &doc, None)
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("documents_not_allowed")),
        "{answer}"
    );

    // The search cluster refuses the query (a negative size): the application is told
    // an incident, not the cluster's words.
    let (status, answer) = api
        .search(
            &limited,
            json!({"template": "sized", "params": {"size": -5}}),
        )
        .await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 502, "{answer}");
    assert!(
        message.contains("incident") && !message.contains(&alias) && !message.contains("size"),
        "{answer}"
    );
    let incident = answer["error"]["incident"].as_str().unwrap().to_owned();
    assert!(
        cluster.centers[0].log_tail().contains(&incident) || {
            let log = std::fs::read_to_string(&cluster.centers[0].log).unwrap_or_default();
            log.contains(&incident)
        },
        "the center's log explains incident {incident}"
    );

    // Positions over pooled connections.
    let connections = || {
        let (stack, user) = (ctx.stack.clone(), accounts.reader.clone());
        async move {
            let mut c = stack.conn().await;
            c.exec_first::<u64, _, _>(
                "SELECT TOTAL_CONNECTIONS FROM performance_schema.accounts WHERE USER = ?",
                (user,),
            )
            .await
            .unwrap()
            .unwrap_or(0)
        }
    };
    let position = format!("/v1/aliases/{alias}/position");
    let before = connections().await;
    for _ in 0..200 {
        let (status, answer, _) = api
            .call(Some(&limited), reqwest::Method::GET, &position, None)
            .await;
        assert_eq!(status, 200, "{answer}");
    }
    let opened = connections().await - before;
    assert!(opened <= 10, "200 positions opened {opened} connections");

    drop(cluster);
    ctx.cleanup().await;
    accounts.remove().await;
}
