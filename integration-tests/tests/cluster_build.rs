//! A zero-downtime rebuild (issue 4): a table snapshotted into the next index version in
//! chunks spread over 3 workers, while a write load inserts, updates and deletes rows in
//! it and a worker is killed mid-build; searches through the alias keep answering, the
//! alias never points at the version being built, and afterwards Elasticsearch equals
//! MySQL. Also: the worker and the etl crashing at the hand-off from snapshot to stream
//! while writes go to the chunks being read; a reset build; DDL during a snapshot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_integration_tests::on_sources;
use sluice_integration_tests::{
    check_table, eventually, CheckOptions, Cluster, ClusterSource, TestCtx,
};
use sluice_proto::v1;

const ROWS: u64 = 3000;

/// A gRPC client reads each state as an enum beside its name: the build done, the
/// pipeline available, every task streaming (as its worker last reported).
async fn states_as_enums(cluster: &Cluster, alias: &str) {
    let mut admin = cluster.admin().await;
    let build = admin
        .get_build(v1::GetBuildRequest { name: alias.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (build.build_phase(), build.phase.as_str()),
        (v1::BuildPhase::Done, "done")
    );
    let listed = admin
        .list_pipelines(v1::ListPipelinesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pipelines;
    assert_eq!(
        (listed[0].availability(), listed[0].state.as_str()),
        (v1::PipelineAvailability::Available, "available")
    );
    eventually(
        "every task reported streaming",
        Duration::from_secs(30),
        || {
            let mut admin = admin.clone();
            async move {
                let tasks = admin
                    .list_tasks(v1::ListTasksRequest {})
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner()
                    .tasks;
                let streaming = |t: &v1::Task| {
                    t.task_state() == v1::TaskState::Streaming && t.state == "streaming"
                };
                if !tasks.is_empty() && tasks.iter().all(streaming) {
                    Ok(())
                } else {
                    Err(format!("{tasks:?}"))
                }
            }
        },
    )
    .await;
}

/// A table of `ROWS` rows written before its source existed (only a build can bring
/// them), a cluster of 3 centers and `workers` workers streaming it, and version 1 behind
/// the alias, created by the etl for a live change (streaming only).
async fn streaming_items(name: &str, workers: usize) -> (TestCtx, Cluster, ClusterSource) {
    streaming_items_armed(name, workers, &[]).await
}

/// [`streaming_items`] with failpoints armed: (binary, `FAILPOINTS` value).
async fn streaming_items_armed(
    name: &str,
    workers: usize,
    failpoints: &[(&'static str, &str)],
) -> (TestCtx, Cluster, ClusterSource) {
    let ctx = TestCtx::new(name).await;
    for (bin, armed) in failpoints {
        ctx.env_for(bin, "FAILPOINTS", armed);
    }
    ctx.items_table(ROWS).await;
    let cluster = ctx.start_cluster(3, workers).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    let alias = &items.pipeline.alias;
    ctx.exec("UPDATE items SET qty = -1 WHERE id = 1").await;
    eventually(
        "version 1 behind the alias",
        Duration::from_secs(60),
        || async {
            match ctx.stack.es.alias_targets(alias).await {
                Ok(t) if t == [format!("{alias}_v1")] => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    (ctx, cluster, items)
}

/// `Ok` while `alias`'s build is snapshotting with at least `rows` rows read.
async fn snapshotted(cluster: &Cluster, alias: &str, rows: u64) -> Result<(), String> {
    let s = cluster.ctl(&["pipelines", "status", alias])?;
    if s["phase"] == "snapshotting" && s["rows_done"].as_u64().unwrap_or(0) >= rows {
        Ok(())
    } else {
        Err(s.to_string())
    }
}

on_sources!(a_build_under_load_and_a_worker_kill_swaps_to_a_complete_index: mariadb, mariadb_watermarks, mysql);
async fn a_build_under_load_and_a_worker_kill_swaps_to_a_complete_index() {
    let (ctx, mut cluster, items) = streaming_items("build", 3).await;
    let alias = items.pipeline.alias.clone();
    let es = ctx.stack.es.clone();

    // Searches through the alias, and where it points, all along.
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (es, alias, watching) = (es.clone(), alias.clone(), watching.clone());
        tokio::spawn(async move {
            let mut seen: Vec<Vec<String>> = Vec::new();
            let mut searches = 0u32;
            while watching.load(Ordering::Relaxed) {
                let targets = es.alias_targets(&alias).await.expect("alias readable");
                if seen.last() != Some(&targets) {
                    seen.push(targets);
                }
                es.count(&alias)
                    .await
                    .expect("searches through the alias answer");
                searches += 1;
                tokio::time::sleep(Duration::from_millis(50)).await; // a probe pace
            }
            (seen, searches)
        })
    };

    // A write load on the table being built.
    let load = ctx.load(Duration::from_millis(20), |n| {
        let mut round = vec![
            format!("INSERT INTO items VALUES ({}, 'new {n}', {n})", ROWS + n),
            format!(
                "UPDATE items SET qty = qty + 1000, name = 'upd {n}' WHERE id = {}",
                1 + (n * 37) % ROWS
            ),
        ];
        if n % 5 == 0 {
            round.push(format!(
                "DELETE FROM items WHERE id = {}",
                1 + (n * 53) % ROWS
            ));
        }
        round
    });

    let started = cluster
        .ctl(&[
            "pipelines",
            "build",
            &items.pipeline.alias,
            "--chunk-rows",
            "500",
            "--throttle",
            "100",
        ])
        .unwrap();
    assert_eq!(started["version"], 2, "{started}");

    // Kill a worker once the snapshot is under way. 500-row chunks read in 500-row
    // batches at 100 rows/s: every chunk pauses ~5 s after its first batch, so workers
    // hold half-read chunks for that long.
    eventually("chunks being read", Duration::from_secs(60), || {
        snapshotted(&cluster, &alias, 500)
    })
    .await;
    cluster.workers[0].kill9();
    let v2 = format!("{alias}_v2");
    let filling = es.get_settings(&v2).await.unwrap();
    assert_eq!(
        filling[&v2]["settings"]["index"]["refresh_interval"], "-1",
        "the version being built is filled without refreshes"
    );

    let done = cluster
        .wait_built(&items.pipeline.alias, Duration::from_secs(180))
        .await;
    assert_eq!(done["version"], 2);
    let live = es.get_settings(&v2).await.unwrap();
    assert_ne!(
        live[&v2]["settings"]["index"]["refresh_interval"], "-1",
        "refreshes back on before the alias moved"
    );
    let statements = load.stop().await;
    assert!(
        statements > 20,
        "the load ran during the build ({statements} rounds)"
    );

    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(90))
        .await;
    watching.store(false, Ordering::Relaxed);
    let (seen, searches) = watcher.await.unwrap();
    assert_eq!(
        seen,
        [vec![format!("{alias}_v1")], vec![format!("{alias}_v2")]],
        "the alias moved once, from v1 straight to v2"
    );
    assert!(searches > 20, "only {searches} searches ran");
    let pipelines = cluster.ctl(&["pipelines", "list"]).unwrap();
    assert_eq!(pipelines[0]["state"], "available", "{pipelines}");
    assert_eq!(pipelines[0]["live_version"], 2);
    assert_eq!(pipelines[0]["history"], serde_json::json!([1]));
    states_as_enums(&cluster, &alias).await;

    drop(cluster);
    ctx.cleanup().await;
}

on_sources!(a_reset_build_leaves_the_alias_alone_and_its_index_goes: mariadb, mariadb_watermarks);
async fn a_reset_build_leaves_the_alias_alone_and_its_index_goes() {
    let (ctx, cluster, items) = streaming_items("reset", 2).await;
    let alias = items.pipeline.alias.clone();
    let es = ctx.stack.es.clone();

    // One chunk read in batches of 500 at 100 rows/s: the build stays under way.
    cluster
        .ctl(&[
            "pipelines",
            "build",
            &alias,
            "--chunk-rows",
            "100000",
            "--throttle",
            "100",
        ])
        .unwrap();
    eventually(
        "the snapshot under way",
        Duration::from_secs(60),
        || async {
            let s = cluster.ctl(&["pipelines", "status", &alias])?;
            if s["rows_done"].as_u64().unwrap_or(0) >= 500 {
                Ok(())
            } else {
                Err(s.to_string())
            }
        },
    )
    .await;
    let reset = cluster.ctl(&["pipelines", "reset", &alias]).unwrap();
    assert_eq!(reset["building_version"], 0, "{reset}");
    assert_eq!(
        es.alias_targets(&alias).await.unwrap(),
        [format!("{alias}_v1")],
        "a reset leaves the live alias where it was"
    );
    eventually(
        "the abandoned version's index deleted",
        Duration::from_secs(60),
        || async {
            match es.count(&format!("{alias}_v2")).await {
                Err(_) => Ok(()),
                Ok(n) => Err(format!(
                    "{alias}_v2 still holds {n} documents\n{}",
                    cluster.logs()
                )),
            }
        },
    )
    .await;

    // The next build takes a new version and completes, in the topic the reset build
    // left its documents in; the etl, consuming that topic all along, changes neither its
    // topics nor its partitions to start or end it.
    // Topics created as the etl subscribes (the build topic) are consumed within moments
    // of it, not at its next regular look, 10 s on.
    let subscribed = cluster
        .etl
        .first_logged(&["etl consuming"])
        .expect("the etl says so when it subscribes (what the assertion below looks for)");
    let build_topic = format!(
        "(\"{}\", 0)",
        sluice_kafka::TopicConfig::default().build_topic(&alias)
    );
    let taken = cluster
        .etl
        .first_logged(&["partitions taken", &build_topic])
        .unwrap_or_else(|| panic!("the etl never took {build_topic}:\n{}", cluster.logs()));
    assert!(
        (0.0..3.0).contains(&(taken - subscribed)),
        "the build topic's partitions were taken {:.1} s after subscribing",
        taken - subscribed
    );
    let mark = cluster.etl.log_mark();
    let started = cluster
        .ctl(&["pipelines", "build", &alias, "--chunk-rows", "1000"])
        .unwrap();
    assert_eq!(
        started["version"], 3,
        "versions are never reused: {started}"
    );
    cluster.wait_built(&alias, Duration::from_secs(120)).await;
    assert!(
        cluster
            .etl
            .logged_since(
                mark,
                &["etl consuming", "partitions given up", "partitions taken"]
            )
            .is_err(),
        "a build changes no subscription of the etl:\n{}",
        cluster.etl.log_tail()
    );
    assert_eq!(
        es.alias_targets(&alias).await.unwrap(),
        [format!("{alias}_v3")]
    );
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    drop(cluster);
    ctx.cleanup().await;
}

on_sources!(ddl_during_a_snapshot_builds_an_index_equal_to_the_table: mariadb, mariadb_watermarks);
/// DDL while a build snapshots the table: a column added (and filled by writes that
/// follow it) and another dropped between chunks. The chunks read after each statement
/// carry the new shape and the stream decodes each change with the schema of its time:
/// the built version equals the table but for the dropped column's values in documents
/// of chunks read before the DROP, so the version the build made still needs a rebuild,
/// with the DROP named; a second build clears it and leaves no trace of the column.
async fn ddl_during_a_snapshot_builds_an_index_equal_to_the_table() {
    let (ctx, cluster, items) = streaming_items("buildddl", 2).await;
    let alias = items.pipeline.alias.clone();
    // 500-row chunks at 100 rows/s: the snapshot lasts about 30 s.
    cluster
        .ctl(&[
            "pipelines",
            "build",
            &alias,
            "--chunk-rows",
            "500",
            "--throttle",
            "100",
        ])
        .unwrap();
    eventually("the snapshot under way", Duration::from_secs(60), || {
        snapshotted(&cluster, &alias, 500)
    })
    .await;
    ctx.exec("ALTER TABLE items ADD COLUMN note VARCHAR(20) NULL")
        .await;
    ctx.exec("UPDATE items SET note = CONCAT('n', id) WHERE id % 7 = 0")
        .await;
    eventually("the snapshot further on", Duration::from_secs(60), || {
        snapshotted(&cluster, &alias, 1500)
    })
    .await;
    ctx.exec("ALTER TABLE items DROP COLUMN qty").await;
    ctx.exec("UPDATE items SET name = CONCAT('late ', id) WHERE id % 11 = 0")
        .await;

    let done = cluster.wait_built(&alias, Duration::from_secs(180)).await;
    assert_eq!(done["version"], 2, "{done}");
    let dropped = CheckOptions {
        dropped_columns: vec!["qty".into()],
        ..CheckOptions::default()
    };
    let table = &items.pipeline.table;
    eventually("v2 equals the table", Duration::from_secs(90), || {
        check_table(&ctx, table, &alias, &dropped)
    })
    .await;
    // The DROP during the build leaves v2 needing a rebuild.
    eventually(
        "v2 marked for a rebuild",
        Duration::from_secs(60),
        || async {
            let status = cluster.ctl(&["pipelines", "status", &alias])?;
            let why = status["needs_rebuild"].as_str().unwrap_or_default();
            if why.contains("v2") && why.contains("qty") {
                Ok(())
            } else {
                Err(status.to_string())
            }
        },
    )
    .await;

    cluster.ctl(&["pipelines", "build", &alias]).unwrap();
    let done = cluster.wait_built(&alias, Duration::from_secs(180)).await;
    assert_eq!(done["version"], 3, "{done}");
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(90))
        .await;
    let status = cluster.ctl(&["pipelines", "status", &alias]).unwrap();
    assert_eq!(
        status["needs_rebuild"].as_str().unwrap_or_default(),
        "",
        "{status}"
    );
    drop(cluster);
    ctx.cleanup().await;
}

on_sources!(a_crash_at_the_hand_off_from_snapshot_to_stream_with_writes_to_the_chunk_being_read_loses_nothing: mariadb, mariadb_watermarks, mysql);
/// The hand-off from snapshot to stream, with writes aimed at the chunks being read: every
/// round of the load updates a row in each chunk (on both sides of the chunk's read
/// cursor, as it moves), deletes one now and then, and inserts past the end. Then both
/// sides of the hand-off crash (failpoints, debug builds):
/// - the worker right after the build's markers are in Kafka, before it records how many
///   there are: the job is done again after its restart, and the etl finds the markers
///   twice;
/// - the etl right after it recorded a marker as applied, before it committed the offset:
///   it reads the marker again after its restart.
///
/// The alias moves once, and the new version equals the table row for row.
async fn a_crash_at_the_hand_off_from_snapshot_to_stream_with_writes_to_the_chunk_being_read_loses_nothing(
) {
    const CHUNK: u64 = 1000;
    let armed = [
        ("sluice-worker", "worker.after_build_markers"),
        ("sluice-etl", "etl.after_build_marker"),
    ];
    let (ctx, mut cluster, items) = streaming_items_armed("handoff", 1, &armed).await;
    let alias = items.pipeline.alias.clone();

    let load = ctx.load(Duration::from_millis(20), |n| {
        let chunks = ROWS / CHUNK;
        let mut round: Vec<String> = (0..chunks)
            .map(|c| {
                let id = c * CHUNK + 1 + (n * 37) % CHUNK;
                format!("UPDATE items SET qty = qty + 1, name = 'upd {n}' WHERE id = {id}")
            })
            .collect();
        round.push(format!(
            "INSERT INTO items VALUES ({}, 'new {n}', {n})",
            ROWS + n
        ));
        if n % 5 == 0 {
            let c = (n / 5) % chunks;
            let id = c * CHUNK + 1 + (n * 53) % CHUNK;
            round.push(format!("DELETE FROM items WHERE id = {id}"));
        }
        round
    });
    // Chunks of 1,000 rows read in batches of 500 at 200 rows/s: each chunk is half read
    // for 2.5 s while the load writes into both halves.
    let started = cluster
        .ctl(&[
            "pipelines",
            "build",
            &alias,
            "--chunk-rows",
            "1000",
            "--throttle",
            "200",
        ])
        .unwrap();
    assert_eq!(started["version"], 2, "{started}");

    cluster.workers[0].wait_failpoint("worker.after_build_markers", Duration::from_secs(120));
    cluster.workers[0].without_env("FAILPOINTS").start();
    cluster
        .etl
        .wait_failpoint("etl.after_build_marker", Duration::from_secs(120));
    cluster.etl.without_env("FAILPOINTS").start();

    let done = cluster.wait_built(&alias, Duration::from_secs(120)).await;
    assert_eq!(done["version"], 2, "{done}");
    let rounds = load.stop().await;
    assert!(
        rounds > 100,
        "the load ran through the snapshot ({rounds} rounds)"
    );
    let targets = ctx.stack.es.alias_targets(&alias).await.unwrap();
    assert_eq!(targets, [format!("{alias}_v2")]);
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(90))
        .await;
    drop(cluster);
    ctx.cleanup().await;
}
