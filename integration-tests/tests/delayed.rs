//! Delayed changes: renaming a category used by 50,000 products rebuilds none of them as
//! the change streams in — it is recorded once (however often the row changed) and
//! listed by `sluicectl delayed list` — while unrelated changes of the same pipeline keep
//! reaching the index within a second; `sluicectl delayed apply` then rebuilds exactly
//! the documents the category reaches, in chunks on two workers, and the index equals
//! MySQL (independent checker). The leader records the changes and moves its place in
//! the delayed topic in one transaction: killed while they stream in, its successor counts
//! every change exactly once.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{check_documents, eventually, Cluster, ClusterSource, TestCtx};

/// Products in the renamed category, and in another one.
const SHOES: u64 = 50_000;
const OTHERS: u64 = 500;

/// Products and their categories.
async fn create_tables(ctx: &TestCtx) {
    ctx.exec("CREATE TABLE categories (id INT PRIMARY KEY, name VARCHAR(100) NOT NULL)")
        .await;
    ctx.exec(
        "CREATE TABLE products (id INT PRIMARY KEY, title VARCHAR(100) NOT NULL, category_id INT NOT NULL, KEY (category_id))",
    )
    .await;
}

/// The products pipeline of `source`, its category a delayed relation.
fn delayed_spec(ctx: &TestCtx, source: &ClusterSource) -> Value {
    ctx.clean_up_topic(sluice_kafka::TopicConfig::default().rows_topic(
        &source.name,
        &ctx.db,
        "categories",
    ));
    let name = &source.pipeline.alias;
    json!({
        "name": name, "alias": name, "source": source.name, "database": ctx.db,
        "table": "products", "replicas": 0,
        "relations": [{
            "name": "category", "kind": "one_to_one", "table": "categories",
            "on": {"category_id": "id"}, "delayed": true
        }]
    })
}

/// The category name product `id`'s document holds in `index`, for each of `ids`.
async fn category_names(ctx: &TestCtx, index: &str, ids: &[u64]) -> Vec<Option<String>> {
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    ctx.stack
        .es
        .mget(index, &ids)
        .await
        .expect("mget")
        .into_iter()
        .map(|d| Some(d?["category"]["name"].as_str()?.to_owned()))
        .collect()
}

/// Changes product `id`'s title and waits until its document has it; how long that took
/// from the commit.
async fn unrelated_change(ctx: &TestCtx, index: &str, id: u64, n: u64) -> Duration {
    let title = format!("title {n}");
    ctx.exec(&format!(
        "UPDATE products SET title = '{title}' WHERE id = {id}"
    ))
    .await;
    let committed = Instant::now();
    eventually(
        &format!("product {id} has its new title"),
        Duration::from_secs(30),
        || async {
            let doc = ctx.stack.es.mget(index, &[id.to_string()]).await;
            let doc = doc.map_err(|e| e.to_string())?;
            match doc.first().cloned().flatten() {
                Some(d) if d["title"] == title.as_str() => Ok(()),
                other => Err(format!("product {id}: {other:?}")),
            }
        },
    )
    .await;
    committed.elapsed()
}

on_sources!(a_delayed_category_rename_is_applied_by_the_job_not_inline: mariadb, mariadb_watermarks, mysql);
async fn a_delayed_category_rename_is_applied_by_the_job_not_inline() {
    let ctx = TestCtx::new("delayed").await;
    create_tables(&ctx).await;
    ctx.exec("INSERT INTO categories VALUES (1, 'shoes'), (2, 'hats')")
        .await;
    for start in (1..=SHOES + OTHERS).step_by(5_000) {
        let rows: Vec<String> = (start..(start + 5_000).min(SHOES + OTHERS + 1))
            .map(|id| {
                let category = if id <= SHOES { 1 } else { 2 };
                format!("({id}, 'product {id}', {category})")
            })
            .collect();
        ctx.exec(&format!("INSERT INTO products VALUES {}", rows.join(", ")))
            .await;
    }
    let cluster = ctx.start_cluster(1, 2).await;
    let source = ctx.add_source(&cluster, "products", 1).await;
    let name = source.pipeline.alias.clone();
    let mut spec = delayed_spec(&ctx, &source);
    // A schedule that is not a time of day is refused with its key.
    spec["delayed"] = json!({"daily_at": "25:00"});
    let e = ctx.put_spec(&cluster, &spec).unwrap_err();
    assert!(e.contains("delayed.daily_at:"), "{e}");
    spec["delayed"] = json!({"daily_at": "03:00"});
    let got = ctx.put_spec(&cluster, &spec).unwrap();
    assert_eq!(got["relations"][0]["delayed"], true, "{got}");
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    cluster.ctl(&["pipelines", "build", &name]).unwrap();
    cluster.wait_built(&name, Duration::from_secs(300)).await;
    let sample: Vec<u64> = (1..=SHOES).step_by(97).collect();
    assert!(
        category_names(&ctx, &name, &sample)
            .await
            .iter()
            .all(|n| n.as_deref() == Some("shoes")),
        "the build put every product's category in"
    );

    // The rename, twice: one recorded change, no document rebuilt.
    ctx.exec("UPDATE categories SET name = 'footwear' WHERE id = 1")
        .await;
    ctx.exec("UPDATE categories SET name = 'Footwear' WHERE id = 1")
        .await;
    let listed = eventually(
        "the rename is recorded once",
        Duration::from_secs(60),
        || async {
            let l = cluster
                .ctl(&["delayed", "list", &name])
                .map_err(|e| e.to_string())?;
            match l["changes"].as_array().map(Vec::as_slice) {
                Some([c]) if c["changes"] == 2 => Ok(l),
                _ => Err(format!("{l}\n{}", cluster.logs())),
            }
        },
    )
    .await;
    let change = &listed["changes"][0];
    assert_eq!(change["relation"], "products/category", "{listed}");
    assert_eq!(change["values"], json!([1]), "{listed}");
    assert_eq!(listed["pending"], 1, "{listed}");

    // Unrelated changes of the same pipeline flow as ever (products of the other
    // category, whose documents the rename does not reach).
    let mut waits = Vec::new();
    for n in 0..10 {
        waits.push(unrelated_change(&ctx, &name, SHOES + 1 + n * 37, n).await);
    }
    waits.sort();
    eprintln!("unrelated changes while the rename waits: commit to indexed {waits:?}");
    assert!(
        waits[waits.len() / 2] < Duration::from_secs(1),
        "unrelated changes took {waits:?}"
    );
    // The stream is past the rename (it was recorded, and later changes are in), yet no
    // document of the category was rebuilt.
    assert!(
        category_names(&ctx, &name, &sample)
            .await
            .iter()
            .all(|n| n.as_deref() == Some("shoes")),
        "the rename was not applied inline"
    );

    // The job: every document of the category, in chunks on the workers.
    let started = cluster.ctl(&["delayed", "apply", &name]).unwrap();
    let id = started[0]["id"].as_u64().expect("a job id");
    assert_eq!(started[0]["kind"], "delayed", "{started}");
    let during = unrelated_change(&ctx, &name, SHOES + 2, 100).await;
    let job = cluster
        .wait_run_ended(&["delayed", "jobs", &name], id, Duration::from_secs(300))
        .await;
    let took =
        (job["finished_at_ms"].as_i64().unwrap() - job["started_at_ms"].as_i64().unwrap()).max(1);
    eprintln!(
        "delayed job: {} documents in {took} ms ({:.0}/s), {} chunks; an unrelated change during it: {during:?}",
        job["documents"],
        job["documents"].as_f64().unwrap() * 1000.0 / took as f64,
        job["chunks"]
    );
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["changes"], 1, "{job}");
    assert_eq!(
        job["documents"], SHOES,
        "exactly the category's documents: {job}"
    );
    assert_eq!(job["repaired"], SHOES, "{job}");
    assert_eq!(job["chunks"], SHOES / 1_000, "{job}");
    let listed = cluster.ctl(&["delayed", "list", &name]).unwrap();
    assert_eq!(listed["pending"], 0, "{listed}");
    assert_eq!(listed["changes"], json!([]), "{listed}");
    eventually(
        "every product of the category has its new name",
        Duration::from_secs(120),
        || async {
            let names = category_names(&ctx, &name, &sample).await;
            match names.iter().find(|n| n.as_deref() != Some("Footwear")) {
                None => Ok(()),
                Some(n) => Err(format!("one still has {n:?}")),
            }
        },
    )
    .await;
    let documents = eventually(
        "the index equals MySQL",
        Duration::from_secs(120),
        || async {
            check_documents(&ctx, &spec)
                .await
                .map_err(|e| format!("{e}\n{}", cluster.logs()))
        },
    )
    .await;
    assert_eq!(documents as u64, SHOES + OTHERS);
    // Nothing waits: a job now is refused with the reason.
    let e = cluster.ctl(&["delayed", "apply", &name]).unwrap_err();
    assert!(e.contains("no delayed change"), "{e}");
    cluster
        .wait_event(&name, "delayed", &["done", "1 changes applied"])
        .await;
    drop(cluster);
    ctx.cleanup().await;
}

async fn rename(ctx: &TestCtx, id: u64, round: u64) {
    ctx.exec(&format!(
        "UPDATE categories SET name = 'c{id} r{round}' WHERE id = {id}"
    ))
    .await;
}

/// The delayed changes listed, once every category is and `want` changes are counted.
async fn recorded(cluster: &Cluster, name: &str, want: u64) -> Result<Value, String> {
    let l = cluster
        .ctl(&["delayed", "list", name])
        .map_err(|e| e.to_string())?;
    let changes = l["changes"].as_array().cloned().unwrap_or_default();
    let counted: u64 = changes.iter().filter_map(|c| c["changes"].as_u64()).sum();
    if l["pending"] == CATEGORIES && counted >= want {
        Ok(l)
    } else {
        Err(format!(
            "{counted} changes counted: {l}\n{}",
            cluster.logs()
        ))
    }
}

/// Categories whose rows change, and how often each changes.
const CATEGORIES: u64 = 40;
const ROUNDS: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_while_recording_delayed_changes_loses_and_repeats_none() {
    let ctx = TestCtx::new("delayedfo").await;
    create_tables(&ctx).await;
    let rows: Vec<String> = (1..=CATEGORIES)
        .map(|id| format!("({id}, 'c{id}')"))
        .collect();
    ctx.exec(&format!(
        "INSERT INTO categories VALUES {}",
        rows.join(", ")
    ))
    .await;
    let rows: Vec<String> = (1..=CATEGORIES)
        .map(|id| format!("({id}, 'p{id}', {id})"))
        .collect();
    ctx.exec(&format!("INSERT INTO products VALUES {}", rows.join(", ")))
        .await;
    let mut cluster = ctx.start_cluster(2, 1).await;
    let source = ctx.add_source(&cluster, "products", 1).await;
    let name = source.pipeline.alias.clone();
    let spec = delayed_spec(&ctx, &source);
    ctx.put_spec(&cluster, &spec).unwrap();
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    cluster.ctl(&["pipelines", "build", &name]).unwrap();
    cluster.wait_built(&name, Duration::from_secs(120)).await;

    // Every category renamed ROUNDS times, one transaction each. Once the leader has
    // recorded the first half, it is killed in the middle of the next round, with
    // changes on their way to it; its successor must go on from where it recorded.
    let (old, _) = cluster.wait_leader(Duration::from_secs(10), None).await;
    for round in 0..ROUNDS / 2 {
        for id in 1..=CATEGORIES {
            rename(&ctx, id, round).await;
        }
    }
    eventually(
        "the leader recorded the first half",
        Duration::from_secs(60),
        || recorded(&cluster, &name, CATEGORIES * ROUNDS / 2),
    )
    .await;
    for round in ROUNDS / 2..ROUNDS {
        for id in 1..=CATEGORIES {
            if round == ROUNDS / 2 && id == CATEGORIES / 2 {
                cluster.centers[old].kill9();
            }
            rename(&ctx, id, round).await;
        }
    }
    cluster
        .wait_leader(Duration::from_secs(30), Some(old))
        .await;
    let listed = eventually(
        "each renamed category recorded once, with every change it had",
        Duration::from_secs(60),
        || recorded(&cluster, &name, CATEGORIES * ROUNDS),
    )
    .await;
    let changes = listed["changes"].as_array().unwrap();
    assert_eq!(changes.len() as u64, CATEGORIES, "{listed}");
    for c in changes {
        assert_eq!(
            c["changes"], ROUNDS,
            "every change of the row counted once, none twice: {listed}"
        );
    }
    drop(cluster);
    ctx.cleanup().await;
}
